set -u
# Session 13, call 3, on the code with the in-flight bound: the GPU tests; two uninterrupted graphed GPT-2 runs
# compared (is the healed run's 0.039 of call 2 the heal, or GPT-2's own nondeterminism?); the ResNet-50 soak again.
timeout 120 python3 -m pytest -q -p no:cacheprovider -s tests/test_heal_gpu.py > $OUT/heal-gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/heal-gpu-tests.log
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > /dev/null 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10"
for i in 1 2; do
  eval "timeout 60 python3 Train.py --gpus 0,1 $GPT --max-steps 300 --max-restarts 2 --save-every-steps 100 --save /tmp/graphed$i.pt --log-dir /tmp/graphed$i" > /dev/null 2>> $OUT/gpt2-determinism.err
done
python3 -c "import torch; a,b=(torch.load(f'/tmp/graphed{i}.pt',weights_only=False)['model'] for i in (1,2)); print('graphed GPT-2, two uninterrupted runs: max abs diff', max((a[k].double()-b[k].double()).abs().max().item() for k in a))" > $OUT/gpt2-determinism.txt 2>&1
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16 --heartbeat-timeout 10"
timeout 240 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 10 --steps 1000 --save-every-steps 100 --signals SIGKILL \
  --train-flags "$RESNET" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1; echo "rc=$?" >> $OUT/heal-resnet50.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_train_gpu.py tests/test_collectives_gpu.py > $OUT/train-collectives-gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/train-collectives-gpu-tests.log
tail -2 $OUT/heal-gpu-tests.log $OUT/train-collectives-gpu-tests.log; cat $OUT/gpt2-determinism.txt
python3 -c "import json; r=json.loads(open('$OUT/heal-resnet50.jsonl').readline()); print({k: r[k] for k in ('kills','restarts','recover_s_median','recover_s_max','steps_lost_max','max_abs_diff_vs_uninterrupted','queued','orphans','orphans_left')})"
