#!/usr/bin/env bash
# The GPU tests and the GPU benchmarks, run on a machine with NVIDIA GPUs:
#
#     bash scripts/gpu_checks.sh PART...      PART: collectives train data shared startup mps multi zero all
#
#   collectives  tests/test_collectives_gpu.py, the collectives demo, all-reduce bandwidth against
#                torch.distributed, the control-plane benchmark
#   train        tests/test_train_gpu.py and tests/test_heal_gpu.py, then Train.py + Test.py on 2 and 4
#                GPUs (as many as there are) in grad and param mode, on digits and on synthetic images
#   data         scripts.bench.data (flags from $DATA_FLAGS, e.g. DATA_FLAGS="--parts resident jpeg"),
#                then tests/test_pipeline_gpu.py
#   shared       several workers per GPU: tests/test_shared_gpu.py and a short workers-per-GPU benchmark
#   startup      where the default commands' time goes: Train.py and Test.py twice each, Train.py's
#                start-up timeline, Test.py's imports and profile, import torch and a CUDA context
#   mps          the MPS scripts around Train.py and Test.py, then Train.py --mps (the GPUs' compute
#                mode is never changed)
#   multi        scripts.bench.multi on every GPU, one model a call ($MULTI_MODELS: gpt-nanogpt or resnet50):
#                Train.py against torchrun + DDP (compiled both ways, and eager) and nanoGPT's train.py
#                under torchrun (a nanoGPT checkout in .nanogpt: carry it)
#   zero         scripts.bench.zero --peers on every GPU: --zero 0/1/2 against DDP, ZeRO and FSDP2
#   all          every part, in that order (multi and zero need several GPUs; each is a call of its own)
#
# It runs from the checkout root with the project installed (pip install -e .) and writes its logs
# and results under $OUT (default /tmp/gpu-checks); many small files (training runs' logs) go in
# one tarball each. What is worth keeping is unpacked into bench/results/DATE-DEVICE-WHAT/ with a
# README.md that names this command.
#
# On the lent GPU machine (the device tool: it copies this working tree there and sends $OUT back):
# once, from the checkout root here, run the workplace's shared/device/prep.sh, which puts a pyzmq
# wheel in .whl/ and the device-side runner in .devtools/ (both ignored by git; add a simplejpeg wheel
# to .whl/ the same way, which the data tests decode with); then call the device tool with carry
# [".whl", ".devtools"] (and ".nanogpt" for multi and zero) and the command
#     bash .devtools/on-device.sh bash scripts/gpu_checks.sh collectives
# on-device.sh installs the carried wheels, keeps NVLink multicast off, puts the checkout on
# PYTHONPATH and runs the rest. A call may run for 10 minutes at most: one or two parts a call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp/gpu-checks}
mkdir -p "$out"

gpu_count() { nvidia-smi --query-gpu=index --format=csv,noheader | wc -l; }

gpu_tests() {   # gpu_tests LOG SECONDS TEST_FILE...: the GPU tests of these files, logged
    local log=$1 seconds=$2
    shift 2
    timeout "$seconds" python3 -m pytest -q -p no:cacheprovider -m gpu "$@" 2>&1 | tee "$out/$log"
}

collectives() {
    python3 -c "import cupy, cupy.cuda.nccl as n, torch; print('cupy', cupy.__version__, 'nccl', n.get_version(), 'torch', torch.__version__, 'gpus', torch.cuda.device_count())"
    nvidia-smi topo -m || true
    gpu_tests collectives-tests.log 300 tests/test_collectives_gpu.py
    python3 -m scripts.collectives_demo --gpus all 2>&1 | tail -8 | tee "$out/collectives_demo.log"
    python3 -m scripts.bench.allreduce --gpus all --out "$out/allreduce" 2>&1 | tee "$out/allreduce.log"
    python3 -m scripts.bench.control --json "$out/control.json" 2>&1 | tee "$out/control.log"
}

train_runs() {  # Train.py in both modes on digits and synthetic images, then Test.py on its checkpoint
    local runs=$out/train-runs n gpus mode data name extra
    mkdir -p "$runs"
    for n in 2 4; do
        (( n <= $(gpu_count) )) || continue
        gpus=$(seq -s, 0 $((n - 1)))
        for mode in grad param; do
            for data in digits synthetic; do
                name=${data}-${n}gpu-${mode}
                extra=()
                [ "$mode" = param ] && extra=(--avg-every 4)
                [ "$data" = synthetic ] && extra+=(--model cnn --dataset synthetic --epochs 8 --lr 0.02)
                python3 Train.py --gpus "$gpus" --mode "$mode" "${extra[@]}" \
                    --save "/tmp/$name.pt" --log-dir "$runs/$name" >"$runs/$name.log" 2>&1
                echo "$name: exit $? | $(grep -a 'Epoch ' "$runs/$name.log" | tail -1 | tr -d '\r' | sed 's/.*Epoch/Epoch/')"
                python3 Test.py --checkpoint "/tmp/$name.pt" --gpus "$gpus" | grep '^accuracy' | sed "s/^/  $name test /"
            done
        done
    done
    tar -czf "$out/train-runs.tar.gz" -C "$out" train-runs && rm -rf "$runs"
}

train() {
    gpu_tests train-tests.log 400 tests/test_train_gpu.py tests/test_heal_gpu.py
    train_runs
}

data() {
    local work=/tmp/bench-data-out
    python3 -c "import torch, simplejpeg, os; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'simplejpeg', simplejpeg.__version__, 'cores', os.cpu_count())"
    # shellcheck disable=SC2086   # DATA_FLAGS is a list of flags
    timeout 330 python3 -m scripts.bench.data --out "$work" ${DATA_FLAGS:-} 2>&1 | tee "$out/bench_data.log"
    cp "$work"/bench_data.json "$work"/bench_data.md "$work"/bench_data.png "$out"/
    tar czf "$out/data-logs.tar.gz" -C "$work" logs
    gpu_tests data-tests.log 200 tests/test_pipeline_gpu.py
}

shared() {
    command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control: the MPS test will fail"
    gpu_tests shared-tests.log 400 tests/test_shared_gpu.py
    timeout 200 python3 -m scripts.bench.workers_per_gpu --gpus 1 --models mlp --workers-per-gpu 1 4 \
        --warmup 10 --windows 3 --steps 10 --out "$out/workers_per_gpu" 2>&1 | tee "$out/workers_per_gpu.log"
}

wall() {   # wall LOG CMD...: runs CMD with its output to LOG; prints "S s wall, exit RC"
    local log=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1
    rc=$?
    echo "$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s wall, exit $rc"
}

startup() {
    local dir=$out/startup i
    mkdir -p "$dir"
    python3 -c "import time; t = time.perf_counter(); import torch; a = time.perf_counter(); torch.zeros(1, device='cuda'); \
print(f'import torch {a - t:.2f} s, CUDA context {time.perf_counter() - a:.2f} s, {torch.cuda.device_count()} GPUs')"
    for i in 1 2; do
        echo "python Train.py (run $i): $(wall "$dir/train$i.log" python3 Train.py --log-dir "$dir/train$i")"
        python3 -m scripts.startup_timeline "$dir/train$i" | tee "$dir/timeline$i.txt"
        echo "python Test.py (run $i): $(wall "$dir/test$i.log" python3 Test.py); $(grep '^accuracy' "$dir/test$i.log")"
    done
    python3 -X importtime Test.py 2>"$dir/test-importtime.log" >/dev/null
    echo "Test.py's slowest imports (cumulative us):"
    sort -t'|' -k2 -n -r "$dir/test-importtime.log" | head -15
    python3 -m cProfile -s cumtime Test.py 2>&1 | grep -A35 'Ordered by' | tee "$dir/test-profile.txt"
    tar -czf "$out/startup.tar.gz" -C "$out" startup && rm -rf "$dir"
}

mps() {   # every step's outcome is printed
    local run
    run=$(mktemp -d /tmp/mps-e2e.XXXXXX)
    servers() { echo get_server_list | nvidia-cuda-mps-control 2>&1 | tr '\n' ' '; }
    leftover() { pgrep -a -f nvidia-cuda-mps || echo "none"; }
    bash scripts/init_mps_for_all_gpus.sh && source scripts/set_mps_env_for_all_gpus.sh
    echo "=== init all: rc=$? pipe=${CUDA_MPS_PIPE_DIRECTORY:-unset}"
    python3 Train.py --gpus all --workers-per-gpu 4 --epochs 2 --save "$run/all.pt" --log-dir "$run/all" 2>&1 | tail -3
    echo "=== train under the scripts' daemon: rc=${PIPESTATUS[0]}; servers: $(servers)"
    python3 Test.py --checkpoint "$run/all.pt" --gpus all 2>&1 | grep -m1 accuracy
    bash scripts/stop_mps_for_all_gpus.sh
    echo "=== stop all: rc=$?; MPS processes left: $(leftover)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

    bash scripts/init_mps_for_gpus.sh 0 && source scripts/set_mps_env_for_gpus.sh 0
    echo "=== init 0: rc=$? pipe=${CUDA_MPS_PIPE_DIRECTORY:-unset}"
    python3 Train.py --gpus 0 --workers-per-gpu 2 --epochs 1 --save "" --log-dir "$run/gpu0" 2>&1 | tail -2
    echo "=== train on GPU 0: rc=${PIPESTATUS[0]}"
    bash scripts/stop_mps_for_gpus.sh 0
    echo "=== stop 0: rc=$?; MPS processes left: $(leftover)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY CUDA_VISIBLE_DEVICES

    python3 Train.py --gpus all --workers-per-gpu 4 --mps --epochs 1 --save "" --log-dir "$run/private" 2>&1 | tail -3
    echo "=== Train.py --mps: rc=${PIPESTATUS[0]}; MPS processes left: $(leftover)"
}

multi() {      # ~8 minutes on 2 GPUs a model: MULTI_MODELS=resnet50 or gpt-nanogpt (default), one a call
    local n
    n=$(gpu_count)
    timeout 560 python3 -m scripts.bench.multi --gpus "$n" --models "${MULTI_MODELS:-gpt-nanogpt}" \
        --steps '{"resnet50": 150, "gpt-nanogpt": 20}' --out "$out/multi" 2>&1 | tee "$out/multi.log"
    cp "$out/multi/rows.jsonl" "$out/multi_rows.jsonl"
}

zero() {       # ~4 minutes on 2 GPUs: GPT-2 under --zero 0/1/2, DDP, ZeroRedundancyOptimizer, FSDP2
    timeout 400 python3 -m scripts.bench.zero --workers "$(gpu_count)" --gpus --peers --steps 30 \
        --out "$out/zero" 2>&1 | tee "$out/zero.log"
    cp "$out/zero/rows.jsonl" "$out/zero_rows.jsonl"
}

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

[ $# -gt 0 ] || { usage >&2; exit 2; }
parts=()
for part in "$@"; do
    case $part in
        collectives|train|data|shared|startup|mps|multi|zero) parts+=("$part") ;;
        all) parts+=(collectives train data shared startup mps multi zero) ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; echo "gpu_checks.sh: unknown part '$part'" >&2; exit 2 ;;
    esac
done
for part in "${parts[@]}"; do
    echo "=== $part"
    "$part"
done
