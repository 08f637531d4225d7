# Device call C (2 GPUs): bench_multi's missing rows: nanoGPT's train.py under torchrun (with DDP compiled on the
# same machine), and ResNet-50's eager DDP beside its compiled DDP and Train.py --compile.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
timeout -k 5 250 python -m scripts.bench.multi --gpus 2 --models gpt-nanogpt --variants nanogpt-torchrun,ddp-compile --steps '{"gpt-nanogpt": 20}' --out /tmp/bm > $OUT/multi_gpt.log 2>&1
timeout -k 5 290 python -m scripts.bench.multi --gpus 2 --models resnet50 --variants ddp,ddp-compile,harness-compile --steps '{"resnet50": 150}' --out /tmp/bm2 > $OUT/multi_resnet.log 2>&1
cat /tmp/bm/rows.jsonl /tmp/bm2/rows.jsonl > $OUT/multi_rows.jsonl
tar czf $OUT/logs.tgz /tmp/bm/*gpu /tmp/bm2/*gpu 2>/dev/null
cut -c1-300 $OUT/multi_rows.jsonl
