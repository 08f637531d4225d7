set -u
# Session 12, call 2: where a GPU heal's seconds go (each rank's phases in the "recovered" record):
# ResNet-50 soak of 10 SIGKILLs, then GPT-2 124M (after the fix of the ticket's 0-d skip flag), then
# torchrun's restart of GPT-2 for comparison.
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16 --heartbeat-timeout 10"
HARNESS_STALL_DUMP_S=6 timeout 230 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 1500 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 16 --amp bf16 --optimizer adamw --lr 6e-4 --heartbeat-timeout 10"
HARNESS_STALL_DUMP_S=6 timeout 210 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 400 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$GPT" --out $OUT/heal-gpt2.jsonl > $OUT/heal-gpt2.log 2>&1
echo "rc=$?" >> $OUT/heal-gpt2.log
timeout 120 python3 scripts/torchrun_restart.py --gpus 2 --model gpt2-124m --kills 3 --save-every 100 --out $OUT/torchrun-restart-gpt2.jsonl > $OUT/torchrun-restart-gpt2.log 2>&1
echo "rc=$?" >> $OUT/torchrun-restart-gpt2.log
