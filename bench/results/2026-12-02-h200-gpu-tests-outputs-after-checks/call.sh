#!/bin/bash
# Device call (1 GPU): the GPU test suite on the current tree, then issue 27's GPT-2 standing rows (nanoGPT's
# train.py against Train.py --compile) while time is left.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p $OUT/suite; OUT_ALL=$OUT; OUT=$OUT/suite bash .devtools/suite.sh > /dev/null 2>&1; OUT=$OUT_ALL
el "suite: $(tail -2 $OUT/suite/gpu_tests.log | tr '\n' ' ')"
R=/tmp/r; mkdir -p $R
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1 limit=$2 latest=$3; shift 3; [ $(( $(date +%s) - T0 )) -gt $latest ] && { el "$name skipped (time)"; return; }
  timeout -k 5 $limit python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
bench gpt 180 380 --models gpt-nanogpt --steps '{"gpt-nanogpt":30}' --variants nanogpt,harness-compile
rm -rf $R/*/tokens $R/*/data
cp -r $R $OUT/rows 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('vs_best_plain'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
