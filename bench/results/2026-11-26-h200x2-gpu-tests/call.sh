#!/bin/bash
# Device call G (2 GPUs): the whole GPU test suite on the final code (issue 30, run 1), on two pytest-xdist workers.
set -u
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null; git diff --stat >> $OUT/commit.txt 2>/dev/null
timeout -k 5 560 python -m pytest -m gpu -v -p no:cacheprovider -n 2 --dist load --timeout 300 --durations=0 \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_pipeline_gpu.py tests/test_shared_gpu.py > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
grep -E "PASSED|FAILED|SKIPPED|ERROR" $OUT/gpu_tests.log | sed 's/.*\] //' | sort | uniq -c | sort -rn | head -3
grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head -10
tail -3 $OUT/gpu_tests.log
