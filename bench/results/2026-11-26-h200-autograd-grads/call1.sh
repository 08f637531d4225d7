# Device call (1 GPU): a world of one lets autograd hand its gradients over (no flat gradient buffer, no add
# kernel per parameter): this tree against .ab_old (HEAD without that change), beside the plain loops.
cd "$(dirname "$0")/.."
root=$PWD
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv > $OUT/gpus.txt
timeout -k 5 170 python3 -m pytest -m gpu -q -n 2 -p no:cacheprovider --timeout 160 tests/test_train_gpu.py > $OUT/train_gpu_tests.log 2>&1
tail -2 $OUT/train_gpu_tests.log
single() {   # tree name args...
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=/tmp/site:$tree NANOGPT_DIR=$root/.nanogpt timeout -k 5 150 python3 -m scripts.bench.single \
     --nanogpt $root/.nanogpt --out $OUT/$name "$@" > $OUT/$name.log 2>&1; echo "$name rc=$?")
}
single $root resnet-plain --models resnet50 --variants plain-compile-graph
single $root resnet-new --models resnet50 --variants harness-compile
single $root/.ab_old resnet-old --models resnet50 --variants harness-compile
single $root gpt-nanogpt --models gpt-nanogpt --variants nanogpt
single $root gpt-new --models gpt-nanogpt --variants harness-compile
single $root/.ab_old gpt-old --models gpt-nanogpt --variants harness-compile
