# Device call s3 (1 GPU): where Hugging Face GPT-2's memory goes, harness --compile (validation compiled) and the Trainer + compile.
cd "$(dirname "$0")/.."
S='{"resnet50": 300, "gpt-nanogpt": 40, "gpt-builtin": 40, "gpt-hf": 30}'
timeout -k 5 400 python -m scripts.bench.single --out $OUT/hf-profile --profile --models gpt-hf --variants hf-trainer-compile,harness-compile --steps "$S" > $OUT/hf-profile.log 2>&1
rm -rf $OUT/*/tokens; find $OUT -name 'trace.json*' -delete
python - <<'PY'
import json, glob, os
for f in glob.glob(os.environ["OUT"] + "/hf-profile/profiles/*/profile.json"):
    m = json.load(open(f)).get("memory")
    print("==", f); print(json.dumps(m, indent=1)[:3000])
PY
grep -E '"validation"|"done"' $OUT/hf-profile/*-1gpu/metrics.jsonl | cut -c1-300
cd $OUT && tar czf all.tgz hf-profile && rm -rf hf-profile
