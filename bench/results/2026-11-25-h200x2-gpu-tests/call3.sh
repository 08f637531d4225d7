# Device call E (2 GPUs): GPU children forked by the zygote: the GPU tests that start workers (heal, two GPUs,
# compile in a forked child, several workers per GPU with MPS, NCCL).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 400 python -m pytest -m gpu -v -p no:cacheprovider --timeout 150 --durations=30 \
  tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_shared_gpu.py \
  "tests/test_train_gpu.py::test_training_on_two_gpus_keeps_replicas_in_step" \
  "tests/test_train_gpu.py::test_compiled_and_scheduled_steps_are_graphed_and_train_as_eager_ones" > $OUT/gpu_tests.log 2>&1
tail -4 $OUT/gpu_tests.log
