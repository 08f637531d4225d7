set -u
# Planned for session 13 (not run): is NCCL's graph registration of user buffers what kills a GPT-2 survivor
# ("illegal memory access" right after its peer's SIGKILL, session 12 call 2/3)? And is eager GPT-2 deterministic?
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10"
NCCL_GRAPH_REGISTER=0 timeout 150 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 8 --steps 300 --signals SIGKILL \
  --train-flags "$GPT" --out $OUT/gpt2-graphed-noreg.jsonl > $OUT/gpt2-graphed-noreg.log 2>&1; echo "rc=$?" >> $OUT/gpt2-graphed-noreg.log
for i in 1 2; do   # two uninterrupted eager runs: equal, or the 0.029 of call 3 is nondeterminism
  eval "timeout 90 python3 Train.py --gpus 0,1 $GPT --no-cuda-graph --max-steps 300 --save $OUT/eager$i.pt --log-dir /tmp/eager$i" > $OUT/eager$i.log 2>&1
done
python3 -c "import torch; a,b=(torch.load(f'$OUT/eager{i}.pt',weights_only=False)['model'] for i in (1,2)); print(max((a[k].double()-b[k].double()).abs().max().item() for k in a))" > $OUT/eager-determinism.txt 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_train_gpu.py tests/test_collectives_gpu.py > $OUT/train-collectives-gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/train-collectives-gpu-tests.log
