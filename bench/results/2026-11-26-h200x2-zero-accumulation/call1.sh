# Device call 1 (2 GPUs), from .clean (the committed tree af6b853): the new single-GPU step test, then --zero 0/2
# against DDP and FSDP2 with one micro-batch an update. Run as: bash .devtools/on-device.sh bash call1.sh
cd "$(dirname "$0")/../.clean"
export PYTHONPATH=/tmp/site:$PWD NANOGPT_DIR=$PWD/../.nanogpt
timeout -k 5 120 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 100 -rfE tests/test_step_gpu.py > $OUT/step_gpu.log 2>&1
timeout -k 5 400 python3 -m scripts.bench.zero --out $OUT/zero-accum1 --workers 2 --gpus --peers --steps 60 --grad-accum 1 --zero 0,2 --variants harness,ddp,fsdp2 > $OUT/zero-accum1.log 2>&1
