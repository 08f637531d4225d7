#!/bin/bash
# Device call (1 GPU): GPT-2 124M on nanoGPT's model and recipe, Train.py --compile with Inductor's GEMM
# autotuning (TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1, Triton templates benchmarked against cuBLAS) against the default
# compile and nanoGPT's train.py; rows one at a time, cold caches on a fresh machine (issue 27).
set -u
R=/tmp/r; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; git log -1 --format=%H 2>/dev/null; nproc; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1 limit=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt 500 ] && { el "$name skipped (time)"; return; }
  timeout -k 5 $limit python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
bench base 200 --models gpt-nanogpt --variants nanogpt,harness-compile
TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 bench gemm-tuned 260 --models gpt-nanogpt --variants harness-compile
bench again 120 --models gpt-nanogpt --variants harness-compile
rm -rf $R/*/tokens $R/*/data
tar czf $OUT/r.tgz -C $R . 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
