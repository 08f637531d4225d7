set -u
# Session 11, call 3: GPU workers' warm spare (sees the group's GPUs, takes the dead rank's): the GPU heal
# tests, then a ResNet-50 heal soak of 10 SIGKILLs in one run (graphed, the default).
HARNESS_STALL_DUMP_S=6 timeout 200 python3 -m pytest -q -p no:cacheprovider -s tests/test_heal_gpu.py > $OUT/heal-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/heal-gpu-tests.log
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16"
HARNESS_STALL_DUMP_S=6 timeout 340 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 600 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET --heartbeat-timeout 10" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
