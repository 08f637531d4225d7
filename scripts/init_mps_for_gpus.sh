#!/usr/bin/env bash
# Start one MPS control daemon serving a group of GPUs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {
    cat <<USAGE
usage: $MPS_PROG GPUS [--exclusive]

Start one NVIDIA MPS control daemon serving the GPUs GPUS (nvidia-smi indices separated by commas,
e.g. 0,1), with the pipe directory \$MPS_ROOT/nvidia-mps_GPUS and the log directory
\$MPS_ROOT/nvidia-log_GPUS (MPS_ROOT defaults to /tmp). Then point clients at it with
    source scripts/set_mps_env_for_gpus.sh GPUS
and stop it with scripts/stop_mps_for_gpus.sh GPUS.

  --exclusive  also set the GPUs to the EXCLUSIVE_PROCESS compute mode (nvidia-smi -c, needs root),
               so that only the MPS server can use them. Never done by default: MPS works in the
               DEFAULT compute mode, and on a shared machine you must not change the compute mode.
USAGE
}

mps_parse_args yes yes "$@"
mps_require "$MPS_CONTROL"
mps_use_group "$MPS_GPUS"
if mps_answers; then
    mps_die 1 "an MPS control daemon already answers on $CUDA_MPS_PIPE_DIRECTORY; stop it first with scripts/stop_mps_for_gpus.sh $MPS_GPUS"
fi
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if [[ $MPS_EXCLUSIVE == yes ]]; then
    mps_compute_mode "$MPS_GPUS" EXCLUSIVE_PROCESS
fi
export CUDA_DEVICE_ORDER=PCI_BUS_ID     # number the GPUs as nvidia-smi does
log_tail() {
    echo "last lines of $CUDA_MPS_LOG_DIRECTORY/control.log:"
    tail -n 20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null || echo '(no log)'
}
"$MPS_CONTROL" -d || mps_die 1 "$MPS_CONTROL -d failed (status $?); $(log_tail)"
mps_wait_answers yes 5 ||
    mps_die 1 "the MPS control daemon did not answer within 5 s; check nvidia-smi (GPUs seen, compute mode not PROHIBITED); $(log_tail)"
echo "MPS control daemon started for GPUs $MPS_GPUS: pipe directory $CUDA_MPS_PIPE_DIRECTORY, logs in $CUDA_MPS_LOG_DIRECTORY"
echo "point clients at it with: source $MPS_DIR/set_mps_env_for_gpus.sh $MPS_GPUS"
