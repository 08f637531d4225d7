# Device call (2 GPUs): the --zero GPU tests after the padded buckets' change (gathered first, through the staging
# slot, before the forward).
cd "$(dirname "$0")/.."
timeout -k 5 400 python3 -m pytest -m gpu -q -n 2 --dist load -p no:cacheprovider --timeout 250 -rfE \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_step_gpu.py -k "sharded or two_gpus_overlapping or single_worker" > $OUT/gpu_zero_tests.log 2>&1
tail -8 $OUT/gpu_zero_tests.log
