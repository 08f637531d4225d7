# Device call s2 (1 GPU): HF GPT-2 harness-compile, validation eager (HEAD, in .alt) against compiled (working tree);
# then issue 27's GPT-2 harness-compile with coordinate-descent tuning.
cd "$(dirname "$0")/.."
S='{"resnet50": 300, "gpt-nanogpt": 40, "gpt-builtin": 40, "gpt-hf": 20}'
(cd .alt && PYTHONPATH=/tmp/site:$PWD timeout -k 5 170 python -m scripts.bench.single --out $OUT/hf-eager-eval --models gpt-hf --variants harness-compile --steps "$S" > $OUT/hf-eager-eval.log 2>&1)
timeout -k 5 170 python -m scripts.bench.single --out $OUT/hf-compiled-eval --models gpt-hf --variants harness-compile --steps "$S" > $OUT/hf-compiled-eval.log 2>&1
timeout -k 5 240 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 python -m scripts.bench.single --nanogpt .nanogpt --out $OUT/gpt-nanogpt-cdt --models gpt-nanogpt --variants harness-compile --steps "$S" > $OUT/gpt-nanogpt-cdt.log 2>&1
rm -rf $OUT/*/tokens
for f in $OUT/*/bench_single.json; do echo "== $f"; python -c "import json,sys; [print(r.get('model'), r.get('variant'), r.get('step_ms'), r.get('peak_mb'), r.get('first_step_s'), r.get('error','')[:300]) for r in json.load(open(sys.argv[1]))['rows']]" $f; done
for f in $OUT/*/*-1gpu/metrics.jsonl; do echo "== $f"; grep -E '"validation"|"done"' $f | cut -c1-400; done
