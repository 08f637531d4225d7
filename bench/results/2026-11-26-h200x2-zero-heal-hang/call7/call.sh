# x2 call H7: NCCL graph registration off for workers that keep a --zero replica (harness/collectives/nccl.py:
# keep_graphs_unregistered). 1) the tiny GPT that hung (calls H3-H6) without any NCCL variable, 30 s at most; 2) if it
# ends, issue 30 run 4 cut to the budget left: GPT-2 124M --zero 2 graphed, heal on, 6 SIGKILLs.
cd "$(dirname "$0")/.."
git diff --stat > $OUT/diff.txt 2>/dev/null || true
date -u +%FT%TZ > $OUT/began.txt
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > /dev/null 2>&1
BASE=(--gpus 0,1 --model gpt --model-options '{"size":"tiny"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20 --amp bf16 --clip-grad 1.0 --zero 2 --heal on --max-restarts 12 --bucket-mb 0.05)
mkdir -p /tmp/h7
setsid python3 Train.py "${BASE[@]}" --save /tmp/h7/s.pt --log-dir /tmp/h7/log > $OUT/tiny.out 2> $OUT/tiny.err &
pid=$!
for i in $(seq 1 30); do sleep 1; kill -0 $pid 2>/dev/null || break; done
kill -0 $pid 2>/dev/null && { echo "still running at 30 s" >> $OUT/tiny.err; kill -9 -- -$pid; sleep 2; }
wait $pid; rc=$?
echo "tiny: rc=$rc $(tr '\r' '\n' < $OUT/tiny.err | grep update/s | tail -1 | cut -c1-90)"
if [ $rc = 0 ]; then
  export TMPDIR=/tmp/soakwork; mkdir -p $TMPDIR
  ( while sleep 10; do echo "== $(date -u +%T)"; for f in $TMPDIR/soak-*/*/metrics.jsonl; do [ -f "$f" ] && echo "$f $(wc -l < $f) $(grep -c '"recovered"' $f) $(tail -1 $f | cut -c1-160)"; done; done ) > $OUT/watch.log 2>&1 &
  W=$!
  GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --clip-grad 1.0 --heartbeat-timeout 10 --zero 2"
  timeout -k 5 225 python3 -m scripts.soak_heal --gpus 0,1 --runs 1 --kills 6 --steps 240 --save-every-steps 80 \
    --signals SIGKILL --seed 7 --time-limit 215 --train-flags "$GPT" --out $OUT/soak-zero2-gpt2.jsonl > $OUT/soak-zero2-gpt2.log 2>&1
  echo "rc=$?" >> $OUT/soak-zero2-gpt2.log
  kill $W
  tail -3 $OUT/soak-zero2-gpt2.log | cut -c1-2500
fi
date -u +%FT%TZ > $OUT/ended.txt
