# x2 call H4: the replica's shift as one exchange per segment (not per bucket). 1) the tiny GPT with many buckets that hung
# in call H3 (variant g), 45 s at most; 2) if it ends, issue 30 run 4: the GPT-2 --zero 2 heal soak, 10 SIGKILLs;
# 3) the GPU test of a sharded heal with two buckets, graphed.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
git diff --stat > $OUT/diff.txt 2>/dev/null || true
date -u +%FT%TZ > $OUT/began.txt
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > $OUT/make-tokens.log 2>&1
BASE=(--gpus 0,1 --model gpt --model-options '{"size":"tiny"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20 --amp bf16 --clip-grad 1.0 --zero 2 --heal on --max-restarts 12 --bucket-mb 0.05)
mkdir -p /tmp/h4
setsid python3 Train.py "${BASE[@]}" --save /tmp/h4/s.pt --log-dir $OUT/g-tiny-buckets > $OUT/g-tiny-buckets.out 2> $OUT/g-tiny-buckets.err &
pid=$!
for i in $(seq 1 45); do sleep 1; kill -0 $pid 2>/dev/null || break; done
if kill -0 $pid 2>/dev/null; then echo "still running at 45 s" >> $OUT/g-tiny-buckets.err; kill -9 -- -$pid; sleep 2; fi
wait $pid; rc=$?; echo "rc=$rc" >> $OUT/g-tiny-buckets.err
echo "g: rc=$rc $(tr '\r' '\n' < $OUT/g-tiny-buckets.err | grep update/s | tail -1)"
if [ $rc = 0 ]; then
  export TMPDIR=/tmp/soakwork; mkdir -p $TMPDIR
  ( while sleep 10; do echo "== $(date -u +%T)"; for f in $TMPDIR/soak-*/*/metrics.jsonl; do [ -f "$f" ] && echo "$f $(wc -l < $f) $(grep -c '"recovered"' $f) $(tail -1 $f | cut -c1-160)"; done; done ) > $OUT/watch.log 2>&1 &
  W=$!
  GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --clip-grad 1.0 --heartbeat-timeout 10 --zero 2"
  timeout -k 5 330 python3 -m scripts.soak_heal --gpus 0,1 --runs 1 --kills 10 --steps 300 --save-every-steps 100 \
    --signals SIGKILL --seed 7 --time-limit 320 --train-flags "$GPT" --out $OUT/soak-zero2-gpt2.jsonl > $OUT/soak-zero2-gpt2.log 2>&1
  echo "rc=$?" >> $OUT/soak-zero2-gpt2.log
  kill $W; unset TMPDIR
  tail -3 $OUT/soak-zero2-gpt2.log | cut -c1-2500
fi
timeout 160 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 150 tests/test_heal_gpu.py -k "sharded and two-buckets" > $OUT/gpu-test.log 2>&1
echo "test rc=$?"; tail -3 $OUT/gpu-test.log
date -u +%FT%TZ > $OUT/ended.txt
