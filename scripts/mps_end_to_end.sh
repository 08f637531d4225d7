#!/usr/bin/env bash
# MPS end to end on a GPU machine: the init/set_env/stop scripts around Train.py and Test.py, then
# Train.py --mps. Each step's outcome is printed; nothing changes the GPUs' compute mode.
# On the lent device: bash .devtools/on-device.sh bash scripts/mps_end_to_end.sh
set -uo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
run=$(mktemp -d /tmp/mps-e2e.XXXXXX)
servers() { echo get_server_list | nvidia-cuda-mps-control 2>&1 | tr '\n' ' '; }
leftover() { pgrep -a -f nvidia-cuda-mps || echo "none"; }

bash "$here/init_mps_for_all_gpus.sh" && source "$here/set_mps_env_for_all_gpus.sh"
echo "=== init all: rc=$? pipe=${CUDA_MPS_PIPE_DIRECTORY:-unset}"
python3 Train.py --gpus all --workers-per-gpu 4 --epochs 2 --save "$run/all.pt" --log-dir "$run/all" 2>&1 | tail -3
echo "=== train under the scripts' daemon: rc=${PIPESTATUS[0]}; servers: $(servers)"
python3 Test.py --checkpoint "$run/all.pt" --gpus all 2>&1 | grep -m1 accuracy
bash "$here/stop_mps_for_all_gpus.sh"
echo "=== stop all: rc=$?; MPS processes left: $(leftover)"
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

bash "$here/init_mps_for_gpus.sh" 0 && source "$here/set_mps_env_for_gpus.sh" 0
echo "=== init 0: rc=$? pipe=${CUDA_MPS_PIPE_DIRECTORY:-unset}"
python3 Train.py --gpus 0 --workers-per-gpu 2 --epochs 1 --save "" --log-dir "$run/gpu0" 2>&1 | tail -2
echo "=== train on GPU 0: rc=${PIPESTATUS[0]}"
bash "$here/stop_mps_for_gpus.sh" 0
echo "=== stop 0: rc=$?; MPS processes left: $(leftover)"
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

python3 Train.py --gpus all --workers-per-gpu 4 --mps --epochs 1 --save "" --log-dir "$run/private" 2>&1 | tail -3
echo "=== Train.py --mps: rc=${PIPESTATUS[0]}; MPS processes left: $(leftover)"
