# Device call ZT (2 GPUs): --zero 2 with one staging buffer against two (HARNESS_ZERO_STAGING), DDP in the same call.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
HARNESS_ZERO_STAGING=2 timeout -k 5 280 python3 -m scripts.bench.zero --out /tmp/zt-$$-a --workers 2 --gpus --peers --steps 60 --variants harness,ddp > $OUT/staging2.log 2>&1
cp /tmp/zt-$$-a/bench_zero.json $OUT/bench_zero_staging2.json 2>/dev/null
HARNESS_ZERO_STAGING=1 timeout -k 5 230 python3 -m scripts.bench.zero --out /tmp/zt-$$-b --workers 2 --gpus --peers --steps 60 --variants harness > $OUT/staging1.log 2>&1
cp /tmp/zt-$$-b/bench_zero.json $OUT/bench_zero_staging1.json 2>/dev/null
grep '^{' $OUT/staging2.log $OUT/staging1.log | cut -c1-400
