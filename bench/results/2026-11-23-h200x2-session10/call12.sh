set -u
# Session 10, call 2: the whole GPU suite (GPU heal included) and the ResNet-50 heal soak, after the optimizer-state stride fix.
HARNESS_STALL_DUMP_S=6 timeout 330 python3 -m pytest -q -p no:cacheprovider -s -m gpu tests/ > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16"
HARNESS_STALL_DUMP_S=6 timeout 190 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 4 --steps 400 --save-every-steps 100 --signals SIGKILL \
  --heal on --train-flags "$RESNET --heartbeat-timeout 10" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
