# Device call (1 GPU): the whole GPU test suite on two xdist workers; tests that need two GPUs skip.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 560 python -m pytest -m gpu -q -n 2 --dist load -p no:cacheprovider --timeout 250 --durations=20 \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_pipeline_gpu.py tests/test_shared_gpu.py > $OUT/gpu_tests.log 2>&1
tail -8 $OUT/gpu_tests.log
