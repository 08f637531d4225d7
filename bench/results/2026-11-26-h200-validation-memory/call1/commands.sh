# Device call s1 (1 GPU): issue 28 (HF GPT-2, validation compiled; the Trainer validates too) and issue 27's GPT-2 rows.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
git log -1 --format='%H %s' > $OUT/commit.txt 2>/dev/null || true
S='{"resnet50": 300, "gpt-nanogpt": 40, "gpt-builtin": 40, "gpt-hf": 40}'
timeout -k 5 280 python -m scripts.bench.single --nanogpt .nanogpt --out $OUT/gpt-hf --models gpt-hf --variants hf-trainer-compile,harness-compile --steps "$S" > $OUT/gpt-hf.log 2>&1
timeout -k 5 200 python -m scripts.bench.single --nanogpt .nanogpt --out $OUT/gpt-nanogpt --models gpt-nanogpt --variants nanogpt,harness-compile --steps "$S" > $OUT/gpt-nanogpt.log 2>&1
timeout -k 5 100 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 python -m scripts.bench.single --nanogpt .nanogpt --out $OUT/gpt-nanogpt-cdt --models gpt-nanogpt --variants harness-compile --steps "$S" > $OUT/gpt-nanogpt-cdt.log 2>&1
for f in $OUT/*/bench_single.json; do echo "== $f"; python -c "import json,sys; [print(r.get('model'), r.get('variant'), r.get('step_ms'), r.get('peak_mb'), r.get('first_step_s'), r.get('vs_best_plain'), r.get('error','')[:300]) for r in json.load(open(sys.argv[1]))['rows']]" $f; done
