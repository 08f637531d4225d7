#!/bin/bash
# Device call P (one GPU): SM clock and power draw sampled every 100 ms while nanoGPT's train.py and Train.py --compile
# train GPT-2 124M (nanoGPT's model and recipe), one after the other: does the busier step run at lower clocks?
set -u
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
(nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; date -u +%FT%TZ) > $OUT/env.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -lms 100 > $OUT/smi.csv 2>&1 &
S=$!
i=0
for v in nanogpt harness-compile nanogpt harness-compile; do
  i=$((i + 1))
  echo "$v start $(date -u +%T.%N)" >> $OUT/marks.txt
  timeout -k 5 150 python -m scripts.bench.single --nanogpt .nanogpt --out /tmp/p-$i --models gpt-nanogpt --variants $v \
    --steps '{"gpt-nanogpt": 150}' > /tmp/p.log 2>&1
  echo "$v end $(date -u +%T.%N) rc=$?" >> $OUT/marks.txt
  grep -h step_ms /tmp/p-$i/rows.jsonl | tail -1 | cut -c1-160 >> $OUT/marks.txt
done
kill $S
rm -rf /tmp/p-*/tokens; tar czf $OUT/rows.tgz /tmp/p-* 2>/dev/null
cat $OUT/marks.txt
