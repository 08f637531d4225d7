# Device call D (2 GPUs): nanoGPT's train.py under torchrun, beside Train.py --compile and DDP compiled on the same machine.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 400 python -m scripts.bench.multi --gpus 2 --models gpt-nanogpt --variants nanogpt-torchrun,harness-compile,ddp-compile-inner --steps '{"gpt-nanogpt": 20}' --out /tmp/bm > $OUT/multi_gpt.log 2>&1
cp /tmp/bm/rows.jsonl $OUT/multi_rows.jsonl
tar czf $OUT/logs.tgz /tmp/bm/*gpu 2>/dev/null
cut -c1-300 $OUT/multi_rows.jsonl
