# Device call (1 GPU): async mode's heal in place on GPT-2 124M, two workers sharing the GPU (K = 100), killed
# twice by scripts.soak_heal.
cd "$(dirname "$0")/.."
t0=$(date +%s)
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
TF="--workers-per-gpu 2 --mode async --max-staleness 0 --outer-optimizer nesterov --optimizer adamw"
TF="$TF --model gpt --model-options '{\"size\": \"124m\", \"block_size\": 256}' --dataset tokens --data-dir /tmp/tok"
TF="$TF --dataset-options '{\"block_size\": 256}' --batch-size 16 --amp bf16 --avg-every 100 --lr 3e-4"
echo "$TF" > $OUT/train_flags.txt
timeout -k 5 400 python3 -m scripts.soak_heal --gpus 0 --runs 1 --kills 2 --steps 800 --save-every-steps 400 \
  --signals SIGKILL --train-flags "$TF" --time-limit 390 --out $OUT/gpt2.jsonl > $OUT/gpt2.log 2>&1
echo "gpt2 rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
cat $OUT/summary.txt; tail -n 3 $OUT/gpt2.log | cut -c1-3000
