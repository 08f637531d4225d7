#!/usr/bin/env bash
# Train.py on 2 and 4 GPUs in both modes, on digits and on synthetic images, then Test.py.
# On the lent device: bash .devtools/on-device.sh bash scripts/gpu_train_runs.sh
# Logs (metrics.jsonl, metrics.png, stdout) go under ${OUT:-bench/results/latest}/train-runs.
set -uo pipefail
out=${OUT:-bench/results/latest}
runs=$out/train-runs
mkdir -p "$runs"
for gpus in 0,1 0,1,2,3; do
  n=$(( $(tr -cd , <<<"$gpus" | wc -c) + 1 ))
  for mode in grad param; do
    for data in digits synthetic; do
      name=${data}-${n}gpu-${mode}
      extra=()
      [ "$data" = synthetic ] && extra=(--model cnn --dataset synthetic --epochs 8 --lr 0.02)
      python3 Train.py --gpus "$gpus" --mode "$mode" --avg-every 4 "${extra[@]}" \
        --save "/tmp/$name.pt" --log-dir "$runs/$name" >"$runs/$name.log" 2>&1
      echo "$name: exit $? | $(grep -a 'Epoch ' "$runs/$name.log" | tail -1 | tr -d '\r' | sed 's/.*Epoch/Epoch/')"
      python3 Test.py --checkpoint "/tmp/$name.pt" --gpus "$gpus" | grep '^accuracy' | sed "s/^/  $name test /"
    done
  done
done
tar -czf "$out/train-runs.tar.gz" -C "$out" train-runs && rm -rf "$runs"
