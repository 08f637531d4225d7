#!/bin/bash
# Device call T (one GPU used): Train.py --compile with Inductor's coordinate-descent tuning (its new default on GPUs)
# against the same step without it (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0), beside nanoGPT's train.py and the best
# plain ResNet-50 loop, rows one at a time, cold compile caches (issue 27).
set -u
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
R=/tmp/r; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log -1 --format=%H 2>/dev/null; git diff --stat; nproc; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1; shift; [ $(( $(date +%s) - T0 )) -gt 470 ] && { el "$name skipped (time)"; return; }
  timeout -k 5 230 python -m scripts.bench.single --nanogpt .nanogpt --out $R/$name "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
bench gpt-tuned --models gpt-nanogpt --variants nanogpt,harness-compile
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0 bench gpt-untuned --models gpt-nanogpt --variants harness-compile
bench r-tuned --models resnet50 --variants plain-compile-graph,harness-compile
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0 bench r-untuned --models resnet50 --variants harness-compile
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bench gpt-plain-tuned --models gpt-nanogpt --variants nanogpt
rm -rf $R/*/tokens
tar czf $OUT/r.tgz -C $R . 2>/dev/null
for f in $R/*/rows.jsonl; do echo "== $f"; cut -c1-300 $f; done
