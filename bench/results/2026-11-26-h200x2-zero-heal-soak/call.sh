#!/bin/bash
# Device call S (2 GPUs): issue 30 run 4, heal in place with --zero 2, graphed, GPT-2 124M: 10 SIGKILLs at random moments.
set -u
cd "$(dirname "$0")/.."
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null; date -u +%FT%TZ > $OUT/began.txt
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > $OUT/make-tokens.log 2>&1
export TMPDIR=/tmp/soakwork; mkdir -p $TMPDIR
( while sleep 15; do echo "== $(date -u +%T)"; for f in $TMPDIR/soak-*/*/metrics.jsonl; do [ -f "$f" ] && echo "$f $(wc -l < $f) $(grep -c '"recovered"' $f) $(tail -1 $f | cut -c1-160)"; done; done ) > $OUT/watch.log 2>&1 &
W=$!
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --clip-grad 1.0 --heartbeat-timeout 10 --zero 2"
timeout -k 5 420 python3 -m scripts.soak_heal --gpus 0,1 --runs 1 --kills 10 --steps 400 --save-every-steps 100 \
  --signals SIGKILL --seed 11 --time-limit 410 --train-flags "$GPT" --out $OUT/soak-zero2-gpt2.jsonl > $OUT/soak-zero2-gpt2.log 2>&1
echo "rc=$?" >> $OUT/soak-zero2-gpt2.log
kill $W; date -u +%FT%TZ > $OUT/ended.txt
tail -3 $OUT/soak-zero2-gpt2.log | cut -c1-1500
