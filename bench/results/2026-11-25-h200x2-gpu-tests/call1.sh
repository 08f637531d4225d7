# Device call: the whole GPU test suite (issue 30, run 1), test_train_gpu.py first.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
timeout -k 5 570 python -m pytest -m gpu -v -p no:cacheprovider --timeout 200 --durations=40 \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_pipeline_gpu.py tests/test_shared_gpu.py > $OUT/gpu_tests.log 2>&1
tail -5 $OUT/gpu_tests.log
