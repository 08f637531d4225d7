# Device call (1 GPU): a checkpoint's cost, grad mode against DiLoCo, GPT-2 124M (the runs of 2026-11-25-h100-outer-step).
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
python -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
G='--gpus 0 --model gpt --model-options {"size":"124m","block_size":256} --dataset tokens --data-dir /tmp/tok --dataset-options {"block_size":256} --batch-size 16 --optimizer adamw --lr 3e-4 --amp bf16 --max-steps 400'
for v in grad diloco; do
  extra=""; [ $v = diloco ] && extra="--mode param --avg-every 100 --outer-optimizer nesterov"
  timeout 200 python Train.py $G $extra --save /tmp/$v.pt --log-dir /tmp/runs/$v > /tmp/runs-$v.log 2>&1; echo "$v rc=$?"
  cp /tmp/runs/$v/metrics.jsonl $OUT/$v-metrics.jsonl
done
python - <<'P' | tee $OUT/summary.txt
import json, os
for v in ("grad", "diloco"):
    r = [json.loads(l) for l in open(f"/tmp/runs/{v}/metrics.jsonl")]
    t = {x["event"]: x["time"] for x in r}
    print(v, "validation -> saved %.1f s" % (t["saved"] - t["validation"]), "checkpoint %.2f GB" % (os.path.getsize(f"/tmp/{v}.pt") / 1e9),
          "whole run %.1f s" % (t["done"] - t["workers"]))
P
