# Device call ZS (2 GPUs): --zero 2 with a bucket of one parameter reduced where autograd left it (GPT-2's tied
# embedding): the sharded GPU tests, then bench_zero's harness, DDP and FSDP2 rows side by side on one machine.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 150 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 140 tests/test_train_gpu.py -k sharded > $OUT/sharded_tests.log 2>&1
tail -2 $OUT/sharded_tests.log
timeout -k 5 290 python3 -m scripts.bench.zero --out /tmp/bz1 --workers 2 --gpus --peers --steps 60 --variants harness,ddp > $OUT/zero1.log 2>&1
cp /tmp/bz1/bench_zero.json $OUT/bench_zero_harness_ddp.json 2>/dev/null
tail -2 $OUT/zero1.log
timeout -k 5 130 python3 -m scripts.bench.zero --out /tmp/bz2 --workers 2 --gpus --peers --steps 60 --variants fsdp2 > $OUT/zero2.log 2>&1
cp /tmp/bz2/bench_zero.json $OUT/bench_zero_fsdp2.json 2>/dev/null
tail -2 $OUT/zero2.log
tar czf $OUT/logs.tgz /tmp/bz1/logs /tmp/bz2/logs 2>/dev/null
