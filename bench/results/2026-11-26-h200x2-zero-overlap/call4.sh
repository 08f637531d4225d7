# Device call (2 GPUs), commit 20bc81e: --profile of --zero 0, 1 and 2 with nanoGPT's four micro-batches (GPT-2 on
# nanoGPT's model and recipe), updates 21-23: why --zero 1 is 0.8 ms an update behind --zero 0 with accumulation
# while it is 0.5 ms ahead with one micro-batch.
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
python3 -c "from pathlib import Path; from scripts.bench.single import make_tokens; make_tokens(Path('/tmp/tok'))"
for z in 0 1 2; do
  timeout -k 5 150 python3 Train.py --gpus 0,1 --model scripts.bench.nanogpt_model:gpt2 --dataset tokens --data-dir /tmp/tok \
    --dataset-options '{"block_size": 1024, "vocab_size": 50257}' --batch-size 16 --grad-accum 4 --optimizer adamw --lr 6e-4 \
    --weight-decay 0.1 --clip-grad 1.0 --amp bf16 --lr-schedule cosine --warmup-steps 2000 --min-lr 6e-5 --zero $z \
    --max-steps 30 --save '' --profile /tmp/prof$z --profile-from 20 --profile-updates 3 --log-dir /tmp/log$z > /tmp/profile-z$z.log 2>&1
  mkdir -p $OUT/z$z; cp /tmp/prof$z/profile.json $OUT/z$z/; gzip -c /tmp/prof$z/trace.json > $OUT/z$z/trace.json.gz
  echo "z$z"; python3 -c "
import json; p=json.load(open('/tmp/prof$z/profile.json')); print({k: p[k] for k in p if k.endswith('_ms')})"
done
tar czf $OUT/logs.tgz -C /tmp profile-z0.log profile-z1.log profile-z2.log
