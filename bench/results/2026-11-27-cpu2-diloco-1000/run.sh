#!/bin/bash
# usage: run.sh NAME BATCH STEPS LR EXTRA...
name=$1; b=$2; steps=$3; lr=$4; shift 4
cd /work/main
out=${RUNS:-runs}/$name; rm -rf $out; mkdir -p $out
start=$(date +%s.%N)
python Train.py --cpu-workers 2 --model gpt --model-options '{"size": "tiny"}' --dataset tokens --data-dir /tmp/dl/data \
  --dataset-options '{"vocab_size": 256, "block_size": 64, "val_windows": 256}' --data-workers 0 --optimizer adamw \
  --lr $lr --batch-size $b --max-steps $steps --seed 0 --save '' --validate-every 50 --log-dir $out "$@" > $out/train.log 2>&1
rc=$?
end=$(date +%s.%N)
python - "$out" "$name" "$rc" "$start" "$end" <<'PY'
import json,sys
out,name,rc,s,e=sys.argv[1:]
vals=[json.loads(l) for l in open(out+'/metrics.jsonl') if '"val_loss"' in l]
print(f"{name:40s} rc={rc} wall={float(e)-float(s):6.1f} vals=" + " ".join(f"{v.get('step')}:{v['val_loss']:.4f}" for v in vals[-6:]))
PY
