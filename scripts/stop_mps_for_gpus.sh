#!/usr/bin/env bash
# Stop the MPS control daemon of a group of GPUs (started by init_mps_for_gpus.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {
    cat <<USAGE
usage: $MPS_PROG GPUS [--exclusive]

Stop the NVIDIA MPS control daemon that init_mps_for_gpus.sh started for the GPUs GPUS
(nvidia-smi indices separated by commas, e.g. 0,1; pipe directory \$MPS_ROOT/nvidia-mps_GPUS,
MPS_ROOT defaults to /tmp). Says so, and succeeds, if none was running.

  --exclusive  also set the GPUs back to the DEFAULT compute mode (nvidia-smi -c, needs root);
               give it only if you started the daemon with --exclusive.
USAGE
}

mps_parse_args yes yes "$@"
mps_use_group "$MPS_GPUS"
if mps_answers; then
    echo quit | timeout 10 "$MPS_CONTROL" || true
    mps_wait_answers no 10 ||
        mps_die 1 "the MPS control daemon on $CUDA_MPS_PIPE_DIRECTORY still answers 10 s after quit; MPS waits for its clients, so check nvidia-smi for CUDA processes still running on GPUs $MPS_GPUS"
    echo "MPS control daemon for GPUs $MPS_GPUS stopped"
else
    echo "no MPS control daemon was running for GPUs $MPS_GPUS (nothing answers on $CUDA_MPS_PIPE_DIRECTORY)"
fi
if [[ $MPS_EXCLUSIVE == yes ]]; then
    mps_compute_mode "$MPS_GPUS" DEFAULT
fi
