# Device call (1 GPU): where DiLoCo's extra time per update goes: param mode that never syncs inside the window
# (--avg-every 1000) against --avg-every 100, and each run's time per logged interval, with and without a sync in it.
git status --short > $OUT/tree.txt 2>/dev/null
python -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
G='--gpus 0 --model gpt --model-options {"size":"124m","block_size":256} --dataset tokens --data-dir /tmp/tok --dataset-options {"block_size":256} --batch-size 16 --optimizer adamw --lr 3e-4 --amp bf16 --max-steps 1000 --mode param --outer-optimizer nesterov'
for run in 1 2; do
  for k in 1000 100; do
    timeout 150 python Train.py $G --avg-every $k --log-dir /tmp/runs/k$k-$run > $OUT/k$k-$run.log 2>&1; echo "k$k-$run rc=$?"
  done
done
python - <<'P' | tee $OUT/summary.txt
import json, statistics
for run in (1, 2):
    for k in (1000, 100):
        r = [json.loads(l) for l in open(f"/tmp/runs/k{k}-{run}/metrics.jsonl")]
        steps = [x for x in r if x["event"] == "step" and x["step"] >= 100]
        sync_at = {x["step"] for x in r if x["event"] == "outer_sync"}
        plain, with_sync = [], []
        for a, b in zip(steps, steps[1:]):
            ms = 1000 * (b["time"] - a["time"]) / (b["step"] - a["step"])
            (with_sync if any(a["step"] < s <= b["step"] for s in sync_at) else plain).append((ms, b["step"] - a["step"]))
        a, b = steps[0], steps[-1]
        print(run, f"K={k}", "window", a["step"], b["step"], "ms/update %.3f" % (1000 * (b["time"] - a["time"]) / (b["step"] - a["step"])),
              "intervals: plain median %.3f ms/update (n=%d, %s updates each)" % (statistics.median(m for m, _ in plain), len(plain), sorted({n for _, n in plain})),
              "with a sync: %s" % [("%.1f" % m, n) for m, n in with_sync], "syncs", sorted(sync_at))
P
