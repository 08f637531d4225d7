# Device call (2 GPUs): issue 30 run 3 compiled, again: --zero 1 and DDP, then --zero 1 again.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv > $OUT/gpus.txt
timeout -k 5 280 python3 -m scripts.bench.zero --out $OUT/a --workers 2 --gpus --peers --compile --steps 40 --zero 1 --variants harness,ddp > $OUT/a.log 2>&1
echo "rc=$?" >> $OUT/a.log
timeout -k 5 250 python3 -m scripts.bench.zero --out $OUT/b --workers 2 --gpus --peers --compile --steps 40 --zero 1 --variants harness > $OUT/b.log 2>&1
echo "rc=$?" >> $OUT/b.log
rm -rf $OUT/*/logs $OUT/*/tokens
grep -h step_ms $OUT/*.log | cut -c1-400
