set -u
# Session 12, call 4: ResNet-50 soak of 10 SIGKILLs with a replacement that takes the warm spare even while it
# is still importing (call 2: every other heal started a fresh worker, 10.5-12.4 s).
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16 --heartbeat-timeout 10"
timeout 220 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 1000 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
