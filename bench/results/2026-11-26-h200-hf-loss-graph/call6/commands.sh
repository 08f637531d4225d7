# Device call s6 (1 GPU): Hugging Face GPT-2, the Trainer as users run it (loss type unnamed) and the harness (named by its factory).
cd "$(dirname "$0")/.."
S='{"resnet50": 300, "gpt-nanogpt": 40, "gpt-builtin": 40, "gpt-hf": 40}'
timeout -k 5 500 python -m scripts.bench.single --out $OUT/gpt-hf --models gpt-hf --variants hf-trainer-compile,harness-compile --steps "$S" > $OUT/gpt-hf.log 2>&1
tail -2 $OUT/gpt-hf.log
rm -rf $OUT/gpt-hf/tokens; cd $OUT && tar czf all.tgz gpt-hf && rm -rf gpt-hf
