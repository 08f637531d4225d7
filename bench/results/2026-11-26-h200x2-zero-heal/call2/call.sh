# Device call Z2 (2 GPUs): where a --zero GPU heal's result differs from the uninterrupted run's.
cd "$(dirname "$0")/.."
timeout -k 5 300 python -m pytest -m gpu -v -s -p no:cacheprovider --timeout 200 -k sharded \
  tests/test_heal_gpu.py > $OUT/gpu_tests.log 2>&1
grep -a "differ\|sharded GPU heal\|passed\|failed" $OUT/gpu_tests.log | cut -c1-400
