# Device call (1 GPU used): time to the first step before (b98a986, .devtools/before) and after the torch-free
# parent, GPT-2 on nanoGPT's model and Hugging Face's GPT-2, Train.py --compile, 10 updates; one warm-up row first
# (cold caches), then before/after alternating.
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
HERE=$PWD
row() {  # row NAME DIR MODEL
  ( cd $2 && PYTHONPATH=/tmp/site:$2 timeout 200 python3 -m scripts.bench.single --out /tmp/fs/$1 --models $3 \
      --variants harness-compile --nanogpt $HERE/.devtools/nanogpt --steps "{\"$3\": 10}" ) > $OUT/$1.log 2>&1
  mkdir -p $OUT/$1 && cp /tmp/fs/$1/bench_single.json $OUT/$1/ 2>/dev/null
  find /tmp/fs/$1 -name metrics.jsonl -exec cp {} $OUT/$1/ \;
  python3 -c "import json,sys; r=json.load(open('$OUT/$1/bench_single.json'))['rows'][0]; print('$1', r.get('first_step_s'), r.get('step_ms'), r.get('error'))" 2>&1 | tail -1
}
for model in gpt-nanogpt; do
  row $model-warmup $HERE $model
  for i in 1 2 3; do
    row $model-before-$i $HERE/.devtools/before $model
    row $model-after-$i $HERE $model
  done
done
cd $OUT && tar czf first_step.tgz --exclude first_step.tgz . && find . -mindepth 1 ! -name first_step.tgz -delete
