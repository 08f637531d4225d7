#!/usr/bin/env bash
# Several workers per GPU on a GPU machine: the GPU tests in order of importance (each result is
# logged as soon as it is known), then a short workers-per-gpu benchmark on one GPU.
# On the lent device: bash .devtools/on-device.sh bash scripts/gpu_shared_checks.sh
set -uo pipefail
out=${OUT:-bench/results/latest}
mkdir -p "$out"
log="$out/shared_gpu_tests.log"
command -v nvidia-cuda-mps-control > "$log" 2>&1 || echo "no nvidia-cuda-mps-control" >> "$log"
check() {
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu "$@" >> "$log" 2>&1
    echo "=== rc=$? $*" >> "$log"
}
t=tests/test_shared_gpu.py
check "$t::test_every_op_dtype_and_placement_matches_float64_reference[2-on-1]"
check "$t::test_two_workers_on_one_gpu_equal_one_worker_with_double_batch"
check "$t::test_a_dying_worker_sharing_a_gpu_raises_childfailed"
check "$t::test_param_mode_under_a_private_mps_daemon"
check "$t::test_every_op_dtype_and_placement_matches_float64_reference"
check "$t::test_two_workers_on_one_gpu_equal_two_workers_on_two_gpus"
timeout 200 python3 scripts/bench_workers_per_gpu.py --gpus 1 --models mlp --workers-per-gpu 1 4 \
    --warmup 10 --windows 3 --steps 10 --out "$out/workers_per_gpu" > "$out/workers_per_gpu.log" 2>&1
grep -E "^===|passed|failed|error" "$log" | tail -20
tail -8 "$out/workers_per_gpu.log"
