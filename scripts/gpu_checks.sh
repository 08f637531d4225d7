#!/usr/bin/env bash
# The GPU checks and benchmarks of the collectives, in one run on a GPU machine.
# On the lent device: bash .devtools/on-device.sh bash scripts/gpu_checks.sh
# Writes logs and results under ${OUT:-bench/results/latest}.
set -uo pipefail
out=${OUT:-bench/results/latest}
mkdir -p "$out"
python3 -c "import cupy, cupy.cuda.nccl as n, torch; print('cupy', cupy.__version__, 'nccl', n.get_version(), 'torch', torch.__version__, 'gpus', torch.cuda.device_count())"
nvidia-smi topo -m || true
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_collectives_gpu.py 2>&1 | tee "$out/gpu_tests.log"
python3 scripts/collectives_demo.py --gpus all 2>&1 | tail -8 | tee "$out/collectives_demo.log"
python3 scripts/bench_allreduce.py --gpus all --out "$out/allreduce" 2>&1 | tee "$out/allreduce.log"
python3 scripts/bench_control.py --json "$out/control.json" 2>&1 | tee "$out/control.log"
