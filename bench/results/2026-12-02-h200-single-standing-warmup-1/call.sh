#!/bin/bash
# Device call (1 GPU): issue 27's standing rows on the current tree: GPT-2 on nanoGPT's model and recipe (nanoGPT's
# train.py against Train.py --compile), then ResNet-50 batch 128 (the plain compiled and graphed loop against
# Train.py --compile).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=/tmp/r2; mkdir -p $R
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ; git log --oneline -1) > $OUT/env.txt 2>&1
bench() { local name=$1 limit=$2 latest=$3; shift 3; [ $(( $(date +%s) - T0 )) -gt $latest ] && { el "$name skipped (time)"; return; }
  timeout -k 5 $limit python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
bench gpt 200 100 --models gpt-nanogpt --steps '{"gpt-nanogpt":30}' --variants nanogpt,harness-compile
bench resnet 220 340 --models resnet50 --steps '{"resnet50":200}' --variants plain-compile-graph,harness-compile
rm -rf $R/*/tokens $R/*/data $R/*/*-1gpu
cp -r $R $OUT/rows 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('vs_best_plain'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
