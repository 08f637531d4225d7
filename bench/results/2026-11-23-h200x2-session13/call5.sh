set -u
# Session 13, call 5: call 4 again with the fixed script (stderr to a file, workers killed by pid), in what device time was left.
python3 scripts/torchrun_restart.py --gpus 2 --model gpt2-124m --kills 2 --save-every 50 --time-limit 110 \
  --out $OUT/torchrun-restart-gpt2.jsonl > $OUT/torchrun-restart-gpt2.log 2>&1; echo "rc=$?" >> $OUT/torchrun-restart-gpt2.log
tail -c 2500 $OUT/torchrun-restart-gpt2.log
