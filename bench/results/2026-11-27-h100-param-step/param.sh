# Device call (1 GPU): param mode (DiLoCo, K = 100) against grad mode on GPT-2 124M, a world of one, three runs each, interleaved.
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv > $OUT/gpus.txt
git log -1 --format=%H > $OUT/head.txt 2>/dev/null; git status --short > $OUT/tree.txt 2>/dev/null; git diff > $OUT/diff.txt 2>/dev/null
python -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
G='--gpus 0 --model gpt --model-options {"size":"124m","block_size":256} --dataset tokens --data-dir /tmp/tok --dataset-options {"block_size":256} --batch-size 16 --optimizer adamw --lr 3e-4 --amp bf16 --max-steps 1000'
for run in 1 2 3; do
  for v in grad diloco; do
    extra=""; [ $v = diloco ] && extra="--mode param --avg-every 100 --outer-optimizer nesterov"
    timeout 150 python Train.py $G $extra --log-dir $OUT/$v-$run > $OUT/$v-$run.log 2>&1; echo "$v-$run rc=$?"
  done
done
python - <<'P' | tee $OUT/summary.txt
import json, os
out = os.environ["OUT"]
for run in (1, 2, 3):
    for v in ("grad", "diloco"):
        r = [json.loads(l) for l in open(f"{out}/{v}-{run}/metrics.jsonl")]
        steps = [x for x in r if x["event"] == "step" and x["step"] >= 100]
        a, b = steps[0], steps[-1]
        syncs = [x for x in r if x["event"] == "outer_sync" and a["step"] < x["step"] <= b["step"]]
        eager = any("eagerly" in l for l in open(f"{out}/{v}-{run}.log"))
        print(run, v, "updates", a["step"], b["step"], "ms/update %.3f" % (1000 * (b["time"] - a["time"]) / (b["step"] - a["step"])),
              "syncs in window", len(syncs), "eager" if eager else "graphed")
P
