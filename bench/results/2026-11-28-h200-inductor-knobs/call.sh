#!/bin/bash
# Device call (1 GPU): Inductor / cuBLAS knobs on Train.py --compile, GPT-2 (arg gpt) or ResNet-50 (arg resnet).
set -u
R=/tmp/r; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1 limit=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt 520 ] && { el "$name skipped (time)"; return; }
  timeout -k 5 $limit python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
try() { PYTHONPATH=$PWD/.devtools/trycfg:$PYTHONPATH TRY_INDUCTOR="$1" bench "${@:2}"; }
if [ "$1" = gpt ]; then
  G="--models gpt-nanogpt --steps {\"gpt-nanogpt\":30}"
  bench base 170 $G --variants nanogpt,harness-compile
  TORCH_BLAS_PREFER_CUBLASLT=1 bench cublaslt 90 $G --variants harness-compile
  TORCHINDUCTOR_MULTI_KERNEL=1 bench multikernel 100 $G --variants harness-compile
  try '{"aggressive_fusion": true}' aggressive 100 $G --variants harness-compile
  try '{"triton.cooperative_reductions": true}' coop 100 $G --variants harness-compile
  bench again 80 $G --variants harness-compile
else
  S="--models resnet50 --steps {\"resnet50\":200}"
  bench base 200 $S --variants plain-compile-graph,harness-compile
  try '{"conv_1x1_as_mm": true}' conv1x1mm 120 $S --variants harness-compile
  TORCHINDUCTOR_MULTI_KERNEL=1 bench multikernel 120 $S --variants harness-compile
  try '{"aggressive_fusion": true}' aggressive 100 $S --variants harness-compile
  bench again 80 $S --variants harness-compile
fi
rm -rf $R/*/tokens $R/*/data
tar czf $OUT/r.tgz -C $R . 2>/dev/null
for f in $R/*/bench_single.json; do echo "== $f"; python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('error')) for r in json.load(open('$f'))['rows']]"; done
