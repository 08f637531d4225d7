# Device call (2 or 4 GPUs): the whole GPU test suite on the final code, two xdist workers (nothing skipped for GPUs).
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
git status --short > $OUT/tree.txt 2>/dev/null || true
timeout -k 5 560 python3 -m pytest -m gpu -q -n 2 --dist load -p no:cacheprovider --timeout 250 --durations=15 -rfEs \
  tests/test_train_gpu.py tests/test_heal_gpu.py tests/test_collectives_gpu.py tests/test_pipeline_gpu.py tests/test_shared_gpu.py tests/test_step_gpu.py tests/test_async_gpu.py > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
tail -25 $OUT/gpu_tests.log
