#!/bin/bash
# Device call (1 GPU): issue 27's standing rows on the current tree (GPT-2 on nanoGPT's model and recipe,
# ResNet-50 batch 128), plus one Inductor switch not tried before (benchmark_fusion) on GPT-2.
set -u
R=/tmp/r; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1 limit=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt 540 ] && { el "$name skipped (time)"; return; }
  timeout -k 5 $limit python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
G="--models gpt-nanogpt --steps {\"gpt-nanogpt\":30}"
S="--models resnet50 --steps {\"resnet50\":200}"
bench gpt 180 $G --variants nanogpt,harness-compile
bench resnet 200 $S --variants plain-compile-graph,harness-compile
TORCHINDUCTOR_BENCHMARK_FUSION=1 bench gpt-benchfusion 130 $G --variants harness-compile
rm -rf $R/*/tokens $R/*/data
tar czf $OUT/r.tgz -C $R . 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('vs_best_plain'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
