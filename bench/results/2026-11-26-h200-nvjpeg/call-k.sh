#!/bin/bash
# Device call K (one GPU): nvjpeg's stages apart (scripts/bench/decode.py), to say where the batched crop loses.
set -u
cd "$(dirname "$0")/.."
timeout -k 5 300 python -m scripts.bench.decode --images 2560 --out $OUT/decode-h200.json > $OUT/decode.log 2>&1
echo "rc=$?" >> $OUT/decode.log
tail -14 $OUT/decode.log
