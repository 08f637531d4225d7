set -u
# Session 13, call 2: a healing worker keeps at most HARNESS_HEAL_DEPTH updates queued on the GPU (harness/step.py
# InFlight). Does that stop the GPT-2 graphed survivor's "illegal memory access"? What does it cost? Then the GPU heal tests.
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10"
soak() {  # name, depth, kills, timeout
  HARNESS_HEAL_DEPTH=$2 timeout $4 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills $3 --steps 300 --save-every-steps 100 \
    --signals SIGKILL --train-flags "$GPT" --out $OUT/$1.jsonl > $OUT/$1.log 2>&1; echo "rc=$?" >> $OUT/$1.log
}
soak gpt2-graphed-depth2 2 8 200
grep -q '"restarts": 0' $OUT/gpt2-graphed-depth2.jsonl || soak gpt2-graphed-depth1 1 6 160
# What the bound costs: updates/s from the first update to the end, heal on, depth 2 against unbounded, alternating
rate() { python3 -c "import json,sys; r=[json.loads(l) for l in open('$1/metrics.jsonl')]; a=next(x for x in r if x['event']=='first_step'); b=next(x for x in r if x['event']=='done'); print((b['step']-a['step'])/(b['time']-a['time']))"; }
for i in 1 2; do for d in 2 100000; do
  eval "HARNESS_HEAL_DEPTH=$d timeout 80 python3 Train.py --gpus 0,1 $GPT --max-steps 400 --max-restarts 2 --log-dir /tmp/rate-$d-$i" > /dev/null 2>> $OUT/rates.err
  echo "depth $d run $i: $(rate /tmp/rate-$d-$i) updates/s" >> $OUT/rates.txt
done; done
timeout 150 python3 -m pytest -q -p no:cacheprovider -s tests/test_heal_gpu.py > $OUT/heal-gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/heal-gpu-tests.log
cat $OUT/rates.txt; tail -2 $OUT/heal-gpu-tests.log; for f in $OUT/gpt2-graphed-depth*.jsonl; do python3 -c "import json; r=json.loads(open('$f').readline()); print('$f', {k: r[k] for k in ('kills','restarts','recover_s_median','recover_s_max','steps_lost_max','max_abs_diff_vs_uninterrupted','queued','orphans','orphans_left','causes')})"; done
