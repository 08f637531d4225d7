# Device call 1 (2 GPUs), commit 6db6c19 (the all-gather overlapped with the next forward): --zero 0/1/2 against
# DDP and FSDP2 on GPT-2 124M, nanoGPT's recipe (4 micro-batches), then one micro-batch an update; then the
# single-GPU step test. Run as: bash .devtools/on-device.sh bash call1.sh (carry .whl, .devtools, .nanogpt)
cd "$(dirname "$0")/.."
export NANOGPT_DIR=$PWD/.nanogpt
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv > $OUT/gpus.txt
timeout -k 5 300 python3 -m scripts.bench.zero --out $OUT/accum4 --workers 2 --gpus --peers --steps 60 --zero 0,1,2 --variants harness,ddp,fsdp2 > $OUT/accum4.log 2>&1
timeout -k 5 220 python3 -m scripts.bench.zero --out $OUT/accum1 --workers 2 --gpus --peers --steps 60 --grad-accum 1 --zero 0,1,2 --variants harness,ddp > $OUT/accum1.log 2>&1
timeout -k 5 60 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 50 -rfE tests/test_step_gpu.py > $OUT/step_gpu.log 2>&1
