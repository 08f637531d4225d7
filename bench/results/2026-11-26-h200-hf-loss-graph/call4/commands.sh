# Device call s4 (1 GPU): why Hugging Face GPT-2's captured step holds ~1.2 GB more than the Trainer's compiled step.
cd "$(dirname "$0")/.."
python -c "from scripts.bench.single import make_tokens; from pathlib import Path; make_tokens(Path('/tmp/tok'))"
R=(--gpus 0 --save "" --compile --model hf-causal-lm --model-options '{"model_type": "gpt2"}' --dataset scripts.bench.hf_tokens:windows --data-dir /tmp/tok --optimizer adamw --lr 6e-4 --weight-decay 0.1 --clip-grad 1.0 --amp bf16 --max-steps 8)
run() { name=$1; shift; timeout -k 5 150 "$@" > $OUT/$name.log 2>&1; echo "$name: $(grep -o '"peak_gpu_mb": [0-9.]*' /tmp/$name/metrics.jsonl)"; }
run graph-accum4 env TORCH_LOGS=graph_breaks python Train.py "${R[@]}" --batch-size 16 --grad-accum 4 --log-dir /tmp/graph-accum4
run eager-accum4 python Train.py "${R[@]}" --batch-size 16 --grad-accum 4 --no-cuda-graph --log-dir /tmp/eager-accum4
run graph-accum1 python Train.py "${R[@]}" --batch-size 16 --grad-accum 1 --log-dir /tmp/graph-accum1
run eager-accum1 python Train.py "${R[@]}" --batch-size 16 --grad-accum 1 --no-cuda-graph --log-dir /tmp/eager-accum1
grep -i "graph break" -A3 $OUT/graph-accum4.log | head -40
