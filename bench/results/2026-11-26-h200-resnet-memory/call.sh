#!/bin/bash
# Device call M (one GPU used): ResNet-50's peak memory with Train.py keeping 2048 synthetic images on the GPU (1.2 GB)
# and keeping 256 (two batches; the plain loop keeps one), beside the best plain loop, rows one at a time (issue 27).
set -u
cd "$(dirname "$0")/.."
R=/tmp/m; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(python -c "import torch; print('torch', torch.__version__)"; nvidia-smi --query-gpu=name,memory.total --format=csv;
 git log -1 --format=%H; git diff --stat; date -u +%FT%TZ) > $OUT/env.txt 2>&1
bench() { local name=$1; shift; timeout -k 5 200 python -m scripts.bench.single --out $R/$name --models resnet50 "$@" > $R/$name.log 2>&1; el "$name rc=$?"; }
bench plain --variants plain-compile-graph
bench images-2048 --variants harness-compile --images 2048
bench images-256 --variants harness-compile --images 256
rm -rf $R/*/tokens; tar czf $OUT/m.tgz -C $R .
for f in $R/*/rows.jsonl; do echo "== $f"; cut -c1-200 $f; done
