#!/usr/bin/env bash
# The streamed-data GPU tests and scripts/bench_data.py in one run on a GPU machine.
# On the lent device: bash .devtools/on-device.sh bash scripts/gpu_data_checks.sh [bench_data.py flags]
# Writes gpu_tests.log, bench_data.{log,json,md,png} and logs.tgz (every row's output) under ${OUT:-bench/results/latest}.
set -uo pipefail
out=${OUT:-bench/results/latest}
work=/tmp/bench-data-out
mkdir -p "$out"
python3 -c "import torch, simplejpeg, os; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'simplejpeg', simplejpeg.__version__, 'cores', os.cpu_count())"
timeout 330 python3 scripts/bench_data.py --out "$work" "$@" 2>&1 | tee "$out/bench_data.log"
cp "$work"/bench_data.json "$work"/bench_data.md "$work"/bench_data.png "$out"/
tar czf "$out/logs.tgz" -C "$work" logs
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_pipeline_gpu.py tests/test_train_gpu.py 2>&1 | tee "$out/gpu_tests.log"
