# Device call 2 (2 GPUs): --profile of --zero 1 and 2, one micro-batch an update, GPT-2 on nanoGPT's model and recipe,
# updates 21-23, on the previous code (.ab_old = git archive 9122501: the all-gather at the end of the step) and on
# 6db6c19 (overlapped with the next forward). Carry .whl, .devtools, .nanogpt, .ab_old.
cd "$(dirname "$0")/.."
root=$PWD
export NANOGPT_DIR=$root/.nanogpt
python3 -c "from pathlib import Path; from scripts.bench.single import make_tokens; make_tokens(Path('/tmp/tok'))"
for code in new old; do
  dir=$root; [ $code = old ] && dir=$root/.ab_old
  for z in 1 2; do
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout -k 5 150 python3 Train.py --gpus 0,1 --model scripts.bench.nanogpt_model:gpt2 --dataset tokens --data-dir /tmp/tok \
      --dataset-options '{"block_size": 1024, "vocab_size": 50257}' --batch-size 16 --grad-accum 1 --optimizer adamw --lr 6e-4 \
      --weight-decay 0.1 --clip-grad 1.0 --amp bf16 --lr-schedule cosine --warmup-steps 2000 --min-lr 6e-5 --zero $z \
      --max-steps 30 --save '' --profile /tmp/prof-$code$z --profile-from 20 --profile-updates 3 --log-dir /tmp/log-$code$z > $OUT/profile-$code-z$z.log 2>&1)
    mkdir -p $OUT/$code-z$z; cp /tmp/prof-$code$z/profile.json $OUT/$code-z$z/; gzip -c /tmp/prof-$code$z/trace.json > $OUT/$code-z$z/trace.json.gz
    echo "$code z$z"; python3 -c "
import json; p=json.load(open('/tmp/prof-$code$z/profile.json')); print({k: p[k] for k in p if k.endswith('_ms')})"
  done
done
