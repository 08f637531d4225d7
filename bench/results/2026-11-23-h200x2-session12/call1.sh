set -u
# Session 12, call 1: the GPU warm spare with the communicator's own device stream (gpu-spare.patch):
# GPU heal tests, then a ResNet-50 soak and a GPT-2 124M soak of 10 SIGKILLs each on 2 GPUs.
HARNESS_STALL_DUMP_S=6 timeout 140 python3 -m pytest -q -p no:cacheprovider -s --durations=5 tests/test_heal_gpu.py > $OUT/heal-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/heal-gpu-tests.log
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16 --heartbeat-timeout 10"
HARNESS_STALL_DUMP_S=6 timeout 230 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 1500 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 16 --amp bf16 --optimizer adamw --lr 6e-4 --heartbeat-timeout 10"
HARNESS_STALL_DUMP_S=6 timeout 200 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 400 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$GPT" --out $OUT/heal-gpt2.jsonl > $OUT/heal-gpt2.log 2>&1
echo "rc=$?" >> $OUT/heal-gpt2.log
