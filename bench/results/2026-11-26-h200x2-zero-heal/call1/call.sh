# Device call Z (2 GPUs): --zero healing in place on GPU workers (new), the GPU heals and the steps whose
# order changed (ticket after the shards' all-reduces; scaler update after the ticket).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
timeout -k 5 560 python -m pytest -m gpu -v -p no:cacheprovider --timeout 200 --durations=30 \
  tests/test_heal_gpu.py \
  tests/test_train_gpu.py::test_sharded_steps_are_graphed_and_train_as_replicated_eager_ones \
  tests/test_train_gpu.py::test_compiled_and_scheduled_steps_are_graphed_and_train_as_eager_ones \
  tests/test_train_gpu.py::test_training_on_two_gpus_keeps_replicas_in_step > $OUT/gpu_tests.log 2>&1
tail -6 $OUT/gpu_tests.log
