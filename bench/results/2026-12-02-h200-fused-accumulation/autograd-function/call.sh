#!/bin/bash
# Device call (1 GPU): the micro-batches' gradients added in the compiled backward. The graphed step's GPU test,
# then GPT-2 on nanoGPT's model and recipe twice over: nanoGPT's train.py against Train.py --compile.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=/tmp/r2; mkdir -p $R
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ; git log --oneline -1; git status --short) > $OUT/env.txt 2>&1
timeout -k 5 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_step_gpu.py > $OUT/step_gpu_tests.log 2>&1; el "step tests rc=$?"
tail -3 $OUT/step_gpu_tests.log
for rep in 1 2; do
  [ $(( $(date +%s) - T0 )) -gt 330 ] && { el "gpt-$rep skipped (time)"; continue; }
  timeout -k 5 220 python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/gpt-$rep --models gpt-nanogpt \
    --steps '{"gpt-nanogpt":30}' --variants nanogpt,harness-compile > $R/gpt-$rep.log 2>&1; el "gpt-$rep rc=$?"
done
rm -rf $R/*/tokens $R/*/data $R/*/*-1gpu
cp -r $R $OUT/rows 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('vs_best_plain'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
