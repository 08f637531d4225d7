set -u
# Session 13, call 1: is NCCL's registration of graph-captured user buffers what kills a GPT-2 survivor
# ("illegal memory access" right after its peer's SIGKILL; session 12 call 2/3)? Is eager GPT-2 deterministic?
# And can this machine make network namespaces (for GPU workers started through the ssh launcher)?
{ cat /etc/os-release | head -2; which ip ssh sshd; ip netns add probe && ip netns exec probe ip -br link && ip netns del probe && echo NETNS-OK; } > $OUT/env.txt 2>&1
python3 scripts/make_bench_data.py tokens /tmp/tok --train-gb 0.2 --val-mb 5 > $OUT/make-tokens.log 2>&1
GPT="--model gpt --model-options '{\"size\":\"124m\"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{\"block_size\":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10"
# 1. Does NCCL register our buffers in the captured graph? (NCCL's REG subsystem, 40 graphed updates)
eval "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG,INIT timeout 80 python3 Train.py --gpus 0,1 $GPT --max-steps 40 --log-dir /tmp/reg" > $OUT/reg-info.log 2>&1
echo "rc=$?" >> $OUT/reg-info.log
# 2. The graphed soak without graph registration: 8 SIGKILLs (with it, 5 of 14 kills crashed a survivor in session 12)
NCCL_GRAPH_REGISTER=0 timeout 200 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 8 --steps 300 --save-every-steps 100 \
  --signals SIGKILL --train-flags "$GPT" --out $OUT/gpt2-graphed-noreg.jsonl > $OUT/gpt2-graphed-noreg.log 2>&1
echo "rc=$?" >> $OUT/gpt2-graphed-noreg.log
# 3. Two uninterrupted eager runs: equal, or session 12's eager 0.029 may be nondeterminism rather than the heal
for i in 1 2; do
  eval "timeout 100 python3 Train.py --gpus 0,1 $GPT --no-cuda-graph --max-steps 300 --save /tmp/eager$i.pt --log-dir /tmp/eager$i" > $OUT/eager$i.log 2>&1
done
python3 -c "import torch; a,b=(torch.load(f'/tmp/eager{i}.pt',weights_only=False)['model'] for i in (1,2)); print('eager max abs diff', max((a[k].double()-b[k].double()).abs().max().item() for k in a))" > $OUT/eager-determinism.txt 2>&1
cat $OUT/env.txt $OUT/eager-determinism.txt; grep -c "register\|Register" $OUT/reg-info.log; tail -3 $OUT/gpt2-graphed-noreg.log
