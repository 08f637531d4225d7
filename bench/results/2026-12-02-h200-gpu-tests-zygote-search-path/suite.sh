#!/bin/bash
# Device call (1 GPU): the whole GPU test suite on the current tree, two xdist workers sharing the GPU.
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv > $OUT/gpus.txt
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> $OUT/gpus.txt 2>&1
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
git status --short >> $OUT/commit.txt 2>/dev/null || true
timeout -k 5 330 python3 -m pytest -m gpu -q -n 2 --dist load -p no:cacheprovider --timeout 250 --durations=15 -rfEs \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_pipeline_gpu.py tests/test_shared_gpu.py tests/test_step_gpu.py tests/test_async_gpu.py > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
tail -40 $OUT/gpu_tests.log
