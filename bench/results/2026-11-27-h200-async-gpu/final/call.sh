# Device call (1 GPU): the async GPU tests on the final code, and async mode's round on GPT-2 124M (one GPU
# worker, K = 100, shared memory) against grad mode in the same call.
cd "$(dirname "$0")/.."
t0=$(date +%s)
timeout -k 5 200 python3 -m pytest -q -m gpu tests/test_async_gpu.py -p no:cacheprovider -rs > $OUT/async_gpu.log 2>&1
echo "async tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
tail -2 $OUT/async_gpu.log
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
G='--gpus 0 --model gpt --model-options {"size":"124m","block_size":256} --dataset tokens --data-dir /tmp/tok --dataset-options {"block_size":256} --batch-size 16 --optimizer adamw --lr 3e-4 --amp bf16 --max-steps 400 --save /tmp/o.pt'
run() {  # name, flags...
  local name=$1; shift
  timeout -k 5 150 python3 Train.py $G "$@" --log-dir /tmp/runs/$name > /tmp/runs-$name.log 2>&1
  echo "$name rc=$? eager=$(grep -c 'running eagerly' /tmp/runs-$name.log) $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
  cp /tmp/runs/$name/metrics.jsonl $OUT/$name-metrics.jsonl 2>/dev/null
}
mkdir -p /tmp/runs
run grad
run async --mode async --avg-every 100 --outer-optimizer nesterov
echo "left in /dev/shm: $(ls /dev/shm | grep -c harness-async)" >> $OUT/summary.txt
cat $OUT/summary.txt
