set -u
# Session 13, call 4: torchrun + DDP's restart of GPT-2 124M after a SIGKILL, beside the harness's heal (call 2).
python3 scripts/torchrun_restart.py --gpus 2 --model gpt2-124m --kills 3 --save-every 100 --time-limit 280 \
  --out $OUT/torchrun-restart-gpt2.jsonl > $OUT/torchrun-restart-gpt2.log 2>&1; echo "rc=$?" >> $OUT/torchrun-restart-gpt2.log
tail -c 3000 $OUT/torchrun-restart-gpt2.log
