set -u
# Session 10, call 3 (after the review commit): GPU heal (eager) and the GPU training tests (graphed replays).
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_heal_gpu.py tests/test_train_gpu.py > $OUT/review-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/review-gpu-tests.log
