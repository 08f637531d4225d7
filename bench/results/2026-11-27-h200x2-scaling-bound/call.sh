# Device call (2 GPUs): how close can any two-GPU run get to DDP compiled's step? Train.py --compile on one GPU (no
# communication at all: the bound of perfect scaling) and on two, against torchrun + DDP compiled on two (both
# orders); GPT-2 124M on nanoGPT's model and recipe, 16 x 4 x 1024 tokens per GPU an update.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpus.txt
t0=$(date +%s)
timeout -k 5 200 python3 -m scripts.bench.multi --out /tmp/one --gpus 1 --models gpt-nanogpt --variants harness-compile --nanogpt .nanogpt > $OUT/one.log 2>&1
echo "one rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
timeout -k 5 380 python3 -m scripts.bench.multi --out /tmp/two --gpus 2 --models gpt-nanogpt --variants harness-compile,ddp-compile --nanogpt .nanogpt > $OUT/two.log 2>&1
echo "two rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
for f in one two; do cp /tmp/$f/rows.jsonl $OUT/$f.rows.jsonl; cp /tmp/$f/bench_multi.json $OUT/$f.bench_multi.json 2>/dev/null; python3 -c "
import json
for l in open('/tmp/$f/rows.jsonl'):
    r=json.loads(l); print('$f', r['gpus'], r['variant'], r.get('compile_order',''), round(r['step_ms'],2), round(r['samples_per_s'],1), round(r.get('first_step_s') or 0,1))" >> $OUT/summary.txt; done
cat $OUT/summary.txt
