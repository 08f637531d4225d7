# Device call (1 GPU): what a checkpoint costs an async run of GPT-2 124M (two workers sharing the GPU, K = 50,
# 400 updates each, a checkpoint every 50): the parent writing it from the workers' parts (this tree) against
# rank 0 writing it after an exchange of every worker's state (.oldtree: commit bb28350), and no checkpoint at all.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 > /dev/null 2>&1
G='--gpus 0 --workers-per-gpu 2 --mode async --max-staleness 0 --outer-optimizer nesterov --optimizer adamw --model gpt'
G="$G --dataset tokens --data-dir /tmp/tok --batch-size 16 --amp bf16 --avg-every 50 --lr 3e-4 --max-steps 400"
run() {  # name, tree, flags...
  local name=$1 tree=$2; shift 2
  local t0=$(date +%s.%N)
  (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout -k 5 170 python3 Train.py $G --model-options '{"size": "124m", "block_size": 256}' \
    --dataset-options '{"block_size": 256}' --log-dir /tmp/runs/$name "$@" > /tmp/runs-$name.log 2>&1)
  local rc=$?
  echo "$name rc=$rc wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >> $OUT/summary.txt
  cp /tmp/runs/$name/metrics.jsonl $OUT/$name-metrics.jsonl 2>/dev/null
  tail -3 /tmp/runs-$name.log >> $OUT/summary.txt
}
mkdir -p /tmp/runs
run nosave . --save ''
run gathered . --save /tmp/g.pt --save-every-steps 50
run exchanged .oldtree --save /tmp/e.pt --save-every-steps 50
ls -la /tmp/g.pt /tmp/e.pt >> $OUT/summary.txt 2>&1
cat $OUT/summary.txt | grep -v "update/s"
