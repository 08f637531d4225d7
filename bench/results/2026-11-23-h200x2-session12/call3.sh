set -u
# Session 12, call 3: which part of the GPT-2 soak makes a survivor die of "illegal memory access" when its
# peer is killed (call 2): 5 SIGKILLs each on GPT-2 eager with AdamW, GPT-2 graphed with SGD, ResNet-50
# graphed with AdamW; NCCL's warnings on. Then the GPU tests that were not run on the last two sessions' code.
export NCCL_DEBUG=WARN
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --heartbeat-timeout 10"
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":1024}' --batch-size 64 --amp bf16 --heartbeat-timeout 10"
run() {   # name, timeout, steps, flags
  timeout $2 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 5 --steps $3 --save-every-steps 100 --signals SIGKILL \
    --train-flags "$4" --out $OUT/$1.jsonl > $OUT/$1.log 2>&1
  echo "rc=$?" >> $OUT/$1.log
}
run gpt2-eager-adamw 120 300 "$GPT --optimizer adamw --no-cuda-graph"
run gpt2-graphed-sgd 120 300 "$GPT --optimizer sgd"
run resnet50-graphed-adamw 110 800 "$RESNET --optimizer adamw --lr 1e-3"
unset NCCL_DEBUG
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_pipeline_gpu.py tests/test_shared_gpu.py > $OUT/pipeline-shared-gpu-tests.log 2>&1
echo "rc=$?" >> $OUT/pipeline-shared-gpu-tests.log
