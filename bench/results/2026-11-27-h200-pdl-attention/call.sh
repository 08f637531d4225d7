#!/bin/bash
# Inductor's programmatic dependent launch (PDL) under Train.py --compile; attention kernels
git rev-parse HEAD > $OUT/commit.txt; git status --short >> $OUT/commit.txt
S='{"gpt-nanogpt": 40}'
python -m scripts.bench.single --nanogpt .nanogpt --out /tmp/s1 --models gpt-nanogpt --variants nanogpt,harness-compile --steps "$S" > /tmp/s1.log 2>&1
TORCHINDUCTOR_ENABLE_PDL=1 python -m scripts.bench.single --nanogpt .nanogpt --out /tmp/s2 --models gpt-nanogpt --variants harness-compile --steps "$S" > /tmp/s2.log 2>&1
echo "PDL kernels in the cache: $(grep -rl gdc_wait /tmp/torchinductor_* 2>/dev/null | wc -l)" > $OUT/pdl-check.txt
python -m scripts.bench.single --nanogpt .nanogpt --out /tmp/s1 --models gpt-nanogpt --variants harness-compile --steps "$S" > /tmp/s1b.log 2>&1
TORCHINDUCTOR_ENABLE_PDL=1 python -m scripts.bench.single --nanogpt .nanogpt --out /tmp/s2 --models gpt-nanogpt --variants harness-compile,nanogpt --steps "$S" > /tmp/s2b.log 2>&1
cp /tmp/s1/rows.jsonl $OUT/default.rows.jsonl; cp /tmp/s2/rows.jsonl $OUT/pdl.rows.jsonl
tail -c 3000 /tmp/s2.log > $OUT/pdl.log
python -m scripts.bench.attention --out /tmp/att --steps 40 > /tmp/att.log 2>&1; cp /tmp/att/bench_attention.json $OUT/; tail -c 2000 /tmp/att.log > $OUT/attention.log
cat $OUT/*.rows.jsonl | cut -c1-200; cat $OUT/pdl-check.txt
