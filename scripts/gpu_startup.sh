#!/usr/bin/env bash
# Where the default commands' time goes on a GPU machine: `python Train.py` and `python Test.py`
# twice each (wall clock), Train.py's per-process start-up timeline (scripts/startup_timeline.py),
# Test.py's import and profile breakdown, and the bare cost of `import torch` and a CUDA context.
# On the lent device: bash .devtools/on-device.sh bash scripts/gpu_startup.sh
# Writes under ${OUT:-bench/results/latest}/startup (a tarball) and prints a summary.
set -uo pipefail
out=${OUT:-bench/results/latest}
dir=$out/startup
mkdir -p "$dir"
wall() {   # wall() LOG CMD...: runs CMD with output to LOG; prints "S s wall, exit RC"
  local log=$1 t0 rc; shift; t0=$(date +%s.%N); "$@" >"$log" 2>&1; rc=$?
  echo "$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s wall, exit $rc"
}
python3 -c "import time; t = time.perf_counter(); import torch; a = time.perf_counter(); torch.zeros(1, device='cuda'); \
print(f'import torch {a - t:.2f} s, CUDA context {time.perf_counter() - a:.2f} s, {torch.cuda.device_count()} GPUs')"
for i in 1 2; do
  echo "python Train.py (run $i): $(wall "$dir/train$i.log" python3 Train.py --log-dir "$dir/train$i")"
  python3 scripts/startup_timeline.py "$dir/train$i" | tee "$dir/timeline$i.txt"
  echo "python Test.py (run $i): $(wall "$dir/test$i.log" python3 Test.py); $(grep '^accuracy' "$dir/test$i.log")"
done
python3 -X importtime Test.py 2>"$dir/test-importtime.log" >/dev/null
echo "Test.py's slowest imports (cumulative us):"
sort -t'|' -k2 -n -r "$dir/test-importtime.log" | head -15
python3 -m cProfile -s cumtime Test.py 2>&1 | grep -A35 'Ordered by' | tee "$dir/test-profile.txt"
tar -czf "$out/startup.tar.gz" -C "$out" startup && rm -rf "$dir"
