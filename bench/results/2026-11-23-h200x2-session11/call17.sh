set -u
# Session 11, call 4: after the fix of the handed-over optimizer state's device (the donor's "cuda:0" is not a
# spare's): GPU heal tests, ResNet-50 soak of 8 SIGKILLs in one run, then GPU training and collective tests.
HARNESS_STALL_DUMP_S=6 timeout 150 python3 -m pytest -q -p no:cacheprovider -s tests/test_heal_gpu.py > $OUT/heal-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/heal-gpu-tests.log
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16"
HARNESS_STALL_DUMP_S=6 timeout 200 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 8 --steps 500 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET --heartbeat-timeout 10" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
timeout 190 python3 -m pytest -q -p no:cacheprovider tests/test_train_gpu.py tests/test_collectives_gpu.py > $OUT/train-collectives-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/train-collectives-gpu-tests.log
