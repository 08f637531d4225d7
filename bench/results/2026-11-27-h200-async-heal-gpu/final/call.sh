# Device call (1 GPU): the async GPU tests on the final code.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 170 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 150 -rfE tests/test_async_gpu.py > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
tail -4 $OUT/gpu_tests.log
