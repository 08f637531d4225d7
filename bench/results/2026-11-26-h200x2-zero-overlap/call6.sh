# Device call (2 GPUs), commit 5e81162+: are NCCL's RING_LL kernels (every collective of the --zero step is RING_LL,
# 25 MB buckets included) what slows the compute beside them? --zero 1 and 2 with NCCL_PROTO=Simple against the
# default, DDP (default) alongside; GPT-2, nanoGPT's recipe (four micro-batches), 60 updates a row.
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
NCCL_PROTO=Simple timeout -k 5 200 python3 -m scripts.bench.zero --out /tmp/simple --workers 2 --gpus --peers --steps 60 --zero 1,2 --variants harness > $OUT/simple.log 2>&1
timeout -k 5 200 python3 -m scripts.bench.zero --out /tmp/default --workers 2 --gpus --peers --steps 60 --zero 1 --variants harness,ddp > $OUT/default.log 2>&1
cp /tmp/simple/bench_zero.json $OUT/simple.bench_zero.json; cp /tmp/default/bench_zero.json $OUT/default.bench_zero.json
for f in simple default; do echo $f; python3 -c "
import json
for r in json.load(open('$OUT/$f.bench_zero.json'))['rows']: print(r['variant'], r['zero'], round(r['step_ms'],2), round(r['peak_mb']))"; done
