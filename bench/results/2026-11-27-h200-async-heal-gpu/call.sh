# Device call (1 GPU): the async GPU tests (the heal in place among them) and the GPU step/train tests that the
# worker loop's changes touch.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
t0=$(date +%s)
timeout -k 5 400 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 --durations=10 -rfE \
  tests/test_async_gpu.py tests/test_heal_gpu.py > $OUT/gpu_tests.log 2>&1
echo "rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/gpu_tests.log
tail -15 $OUT/gpu_tests.log
