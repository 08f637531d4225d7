# Device call (2 GPUs): does capping NCCL's CTAs (NCCL_MAX_CTAS) let the --zero step's collectives slow the compute
# beside them less? GPT-2, nanoGPT's recipe (four micro-batches), 40 updates a row; DDP at NCCL's defaults.
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpus.txt
run() { local name=$1 vars=$2 T=$3; shift 3; local t0=$(date +%s)
  timeout -k 5 $T env $vars python3 -m scripts.bench.zero --out /tmp/$name --workers 2 --gpus --peers --steps 40 "$@" > /tmp/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
  python3 -c "
import json
for r in json.load(open('/tmp/$name/bench_zero.json'))['rows']: print('$name', r['variant'], r['zero'], round(r['step_ms'],2), round(r['peak_mb']))" >> $OUT/summary.txt 2>&1
  cp /tmp/$name/bench_zero.json $OUT/$name.bench_zero.json 2>/dev/null; }
run default "" 280 --zero 0,1,2 --variants harness,ddp
run ctas8 "NCCL_MAX_CTAS=8 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING" 150 --zero 1,2 --variants harness
run ctas4 "NCCL_MAX_CTAS=4" 140 --zero 1,2 --variants harness
tar czf $OUT/logs.tgz -C /tmp default.log ctas8.log ctas4.log default ctas8 ctas4 --exclude='*.pt' --exclude='*.bin' 2>/dev/null
cat $OUT/summary.txt
