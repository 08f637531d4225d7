# Device call (2 GPUs), from .clean (af6b853): --profile of --zero 0 and --zero 2 on GPT-2, nanoGPT's recipe
# (accumulation 4), updates 21-23, to see where --zero 2's extra time per update goes.
cd "$(dirname "$0")/../.clean"
export PYTHONPATH=/tmp/site:$PWD NANOGPT_DIR=$PWD/../.nanogpt
python3 -c "from pathlib import Path; from scripts.bench.single import make_tokens; make_tokens(Path('/tmp/tok'))"
for z in 0 2; do
  timeout -k 5 200 python3 Train.py --gpus 0,1 --model scripts.bench.nanogpt_model:gpt2 --dataset tokens --data-dir /tmp/tok \
    --dataset-options '{"block_size": 1024, "vocab_size": 50257}' --batch-size 16 --grad-accum 4 --optimizer adamw --lr 6e-4 \
    --weight-decay 0.1 --clip-grad 1.0 --amp bf16 --lr-schedule cosine --warmup-steps 2000 --min-lr 6e-5 --zero $z \
    --max-steps 30 --save '' --profile /tmp/prof$z --profile-from 20 --profile-updates 3 --log-dir /tmp/log$z > $OUT/profile_z$z.log 2>&1
  mkdir -p $OUT/z$z; cp /tmp/prof$z/profile.json /tmp/prof$z/profile.txt $OUT/z$z/; gzip -c /tmp/prof$z/trace.json > $OUT/z$z/trace.json.gz
  tail -2 $OUT/profile_z$z.log
done
