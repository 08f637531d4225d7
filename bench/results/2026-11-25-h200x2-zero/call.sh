# Device call B (2 GPUs): the rest of the GPU tests (several workers per GPU), bench_zero's harness and DDP rows timed alike.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log --oneline -1 > $OUT/commit.txt
timeout -k 5 230 python -m pytest -m gpu -v -s -p no:cacheprovider --timeout 100 --durations=10 tests/test_shared_gpu.py -k "not float64" > $OUT/shared_tests.log 2>&1
tail -3 $OUT/shared_tests.log
timeout -k 5 330 python -m scripts.bench.zero --out /tmp/bz --workers 2 --gpus --peers --steps 60 --variants harness,ddp > $OUT/zero.log 2>&1
cp /tmp/bz/rows.jsonl $OUT/zero_rows.jsonl; cp /tmp/bz/bench_zero.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz /tmp/bz/logs 2>/dev/null
tail -2 $OUT/zero.log
