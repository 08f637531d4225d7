# Device call (1 GPU): a world of one, autograd's gradients handed over, warm-up's gradients let go before the
# capture: memory and speed of Train.py --compile on GPT-2 (nanoGPT's model) and ResNet-50, with --profile's pools.
cd "$(dirname "$0")/.."
root=$PWD
single() {   # name args...
  local name=$1; shift
  timeout -k 5 200 python3 -m scripts.bench.single --nanogpt $root/.nanogpt --out $OUT/$name "$@" > $OUT/$name.log 2>&1; echo "$name rc=$?"
}
single gpt-new --models gpt-nanogpt --variants harness-compile --profile
single resnet-new --models resnet50 --variants harness-compile
for f in $OUT/*/bench_single.json; do python3 -c "
import json,sys; d=json.load(open('$f'))
for r in d['rows']: print('$f'.split('/')[-2], r['model'], r['variant'], round(r['step_ms'],2), round(r['peak_mb']), r.get('first_step_s'))"; done
find $OUT -name profile.json | while read f; do echo $f; python3 -c "import json; m=json.load(open('$f')).get('memory'); print(json.dumps(m)[:1800])"; done
find $OUT -name trace.json -delete; find $OUT -name "*.bin" -delete
