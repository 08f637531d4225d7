# Device call Z4 (2 GPUs): the --zero GPU heal tests, twice (the kill lands at a different point of the step each time).
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
for round in 1 2; do
  timeout -k 5 250 python -m pytest -m gpu -v -s -p no:cacheprovider --timeout 200 -k sharded \
    tests/test_heal_gpu.py > $OUT/gpu_tests_$round.log 2>&1
  grep -a "differ from\|passed\|failed\|PASSED\|FAILED" $OUT/gpu_tests_$round.log | cut -c1-250
done
