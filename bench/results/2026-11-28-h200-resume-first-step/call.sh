# Device call (1 GPU): Train.py --resume of a GPT-2 124M checkpoint (nanoGPT's model), its first update
# with the config read by the parent with torch (f5a48a9, .devtools/old) and without (the working tree).
set -u
export NANOGPT_DIR=$PWD/.devtools/nanogpt
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
python3 -c "from pathlib import Path; from scripts.bench.single import make_tokens; make_tokens(Path('/tmp/tok'))"
COMMON="--gpus 0 --model scripts.bench.nanogpt_model:gpt2 --dataset tokens --data-dir /tmp/tok --dataset-options {\"block_size\":1024,\"vocab_size\":50257} --batch-size 16 --grad-accum 4 --optimizer adamw --lr 6e-4 --amp bf16"
python3 Train.py $COMMON --max-steps 5 --save /tmp/g.pt --log-dir $OUT/first > $OUT/first.log 2>&1
ls -la /tmp/g.pt >> $OUT/first.log
for i in 1 2 3; do
  for v in old new; do
    d=$PWD; [ $v = old ] && d=$PWD/.devtools/old
    (cd $d && PYTHONPATH=/tmp/site:$d python3 Train.py $COMMON --max-steps 8 --resume /tmp/g.pt --save /tmp/$v$i.pt --log-dir $OUT/$v$i > $OUT/$v$i.log 2>&1)
    python3 -c "
import json
r=[json.loads(l) for l in open('$OUT/$v$i/metrics.jsonl')]
s=[x for x in r if x['event']=='startup'][0]['parent']
print('$v', $i, round(s['forked']-s['process'],2), round(s['first_step']-s['process'],2))" | tee -a $OUT/resume.txt
  done
done
