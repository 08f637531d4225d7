# Device call (1 GPU): the one-GPU training tests on the final code (a world of one's completed gradients, the
# warm-up's weights in host memory and its optimizer state on the GPU).
cd "$(dirname "$0")/.."
timeout -k 5 230 python3 -m pytest -m gpu -q -n 2 -p no:cacheprovider --timeout 200 -rfE tests/test_train_gpu.py tests/test_pipeline_gpu.py > $OUT/gpu_tests_1gpu.log 2>&1
tail -4 $OUT/gpu_tests_1gpu.log
