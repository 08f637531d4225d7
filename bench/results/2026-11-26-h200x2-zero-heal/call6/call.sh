# Device call Z5 (2 GPUs): issue 30 run 4, healing in place with --zero 2, graphed, on GPT-2 124M: 10 SIGKILLs at
# random moments (5, not 10: the device budget left), the final parameters against an uninterrupted run, kill-to-training-resumed times.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --clip-grad 1.0 --heartbeat-timeout 10 --zero 2"
timeout -k 5 290 python3 -m scripts.soak_heal --gpus 0,1 --runs 1 --kills 5 --steps 240 --save-every-steps 80 \
  --signals SIGKILL --seed 7 --time-limit 270 --train-flags "$GPT" --out $OUT/soak-zero2-gpt2.jsonl > $OUT/soak-zero2-gpt2.log 2>&1
echo "rc=$?" >> $OUT/soak-zero2-gpt2.log
tail -3 $OUT/soak-zero2-gpt2.log | cut -c1-1500
