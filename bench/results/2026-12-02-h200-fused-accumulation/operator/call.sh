#!/bin/bash
# Device call (1 GPU, little device time left): the graphed step's GPU tests; GPT-2 on nanoGPT's model and recipe,
# nanoGPT's train.py against Train.py --compile (cold compile caches); then Train.py --compile again (warm caches).
# Each result is copied to $OUT as soon as it exists.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/progress.txt; }
(python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)";
 nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc; date -u +%FT%TZ; git log --oneline -1; git status --short) > $OUT/env.txt 2>&1
timeout -k 5 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_step_gpu.py > $OUT/step_gpu_tests.log 2>&1; el "step tests rc=$?"
tail -1 $OUT/step_gpu_tests.log
bench() { local name=$1 variants=$2
  timeout -k 5 170 python3 -m scripts.bench.single --nanogpt .devtools/nanogpt --out $OUT/$name --models gpt-nanogpt \
    --steps '{"gpt-nanogpt":30}' --variants $variants > $OUT/$name.log 2>&1; el "$name rc=$?"
  rm -rf $OUT/$name/tokens $OUT/$name/data $OUT/$name/*-1gpu
  python3 -c "
import json; [print(r['variant'], r.get('step_ms'), r.get('first_step_s'), r.get('peak_mb'), r.get('vs_best_plain'), r.get('error')) for r in json.load(open('$OUT/$name/bench_single.json'))['rows']]" 2>/dev/null; }
bench gpt-cold nanogpt,harness-compile
bench gpt-warm harness-compile
