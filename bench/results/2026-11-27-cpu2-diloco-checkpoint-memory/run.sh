# One DiLoCo checkpoint of GPT-2 124M on 2 CPU workers: save after 2 updates, then resume to 4; peak RSS sampled.
# usage: bash run.sh OUTDIR   (from the project root)
out=$1; mkdir -p $out
G='--model gpt --model-options {"size":"124m","block_size":64} --dataset tokens --data-dir /tmp/ck/tok2 --dataset-options {"block_size":64} --batch-size 2 --optimizer adamw --cpu-workers 2 --mode param --avg-every 2 --outer-optimizer nesterov'
monitor() { while :; do ps -eo rss=,comm= | awk '{a[$2]=(a[$2]>$1?a[$2]:$1)} END{for(k in a) if (k ~ /python|harness/) print k, a[k]}' | sort > $out/ps.now; cat $out/ps.now >> $out/ps.all; sleep 0.5; done; }
monitor & mon=$!
s=$(date +%s.%N); python Train.py $G --max-steps 2 --log-dir $out/first --save $out/diloco.pt > $out/first.log 2>&1; echo "first rc=$? $(echo "$(date +%s.%N) - $s" | bc) s"
ls -la $out/diloco.pt 2>/dev/null | awk '{print "checkpoint bytes", $5}'
s=$(date +%s.%N); python Train.py $G --max-steps 4 --resume $out/diloco.pt --log-dir $out/resumed --save $out/resumed.pt > $out/resumed.log 2>&1; echo "resumed rc=$? $(echo "$(date +%s.%N) - $s" | bc) s"
kill $mon
awk '{m[$1]=(m[$1]>$2?m[$1]:$2)} END{for(k in m) print "peak RSS MB", k, int(m[k]/1024)}' $out/ps.all
for d in first resumed; do python - $out/$d/metrics.jsonl <<'P'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
t = {x["event"]: x["time"] for x in r}
print(sys.argv[1].split("/")[-2], "validation->saved %.1f s" % (t["saved"] - t["validation"]) if "saved" in t else "no saved record")
P
done
