# Device call Z3 (2 GPUs): --zero healing in place on GPU workers, with the replica's own parameter copy; then
# the rest of the GPU heal tests and the sharded graph test.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
timeout -k 5 500 python -m pytest -m gpu -v -s -p no:cacheprovider --timeout 200 --durations=20 \
  tests/test_heal_gpu.py tests/test_train_gpu.py::test_sharded_steps_are_graphed_and_train_as_replicated_eager_ones \
  > $OUT/gpu_tests.log 2>&1
grep -a "differ from\|sharded GPU heal\|passed\|failed\|PASSED\|FAILED" $OUT/gpu_tests.log | cut -c1-300
