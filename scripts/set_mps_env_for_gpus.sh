#!/usr/bin/env bash
# Point MPS clients at the daemon of a group of GPUs: source it, or eval its output.
# Sourced: run as a program, and its exports are applied to the sourcing shell.
[[ ${BASH_SOURCE[0]} == "$0" ]] || { source "$(dirname "${BASH_SOURCE[0]}")/mps_exports.sh" "${BASH_SOURCE[0]}" "$@"; return; }
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {   # to stderr: stdout is for the export lines
    cat >&2 <<USAGE
usage: source $MPS_PROG GPUS      or      eval "\$($MPS_PROG GPUS)"

Point CUDA programs started from this shell at the MPS daemon that init_mps_for_gpus.sh started
for the GPUs GPUS (nvidia-smi indices separated by commas, e.g. 0,1): exports
CUDA_MPS_PIPE_DIRECTORY=\$MPS_ROOT/nvidia-mps_GPUS, CUDA_MPS_LOG_DIRECTORY=\$MPS_ROOT/nvidia-log_GPUS
(MPS_ROOT defaults to /tmp) and CUDA_VISIBLE_DEVICES=0,...,N-1: the MPS server numbers the N GPUs
it serves from 0 (for GPUS=2,3 clients must name 0,1). Run as a program, it prints the exports.
USAGE
}

mps_parse_args yes no "$@"
mps_use_group "$MPS_GPUS"
clients=$(seq -s, 0 $(( $(tr -cd , <<<"$MPS_GPUS" | wc -c) )))
if ! mps_answers; then
    echo "$MPS_PROG: warning: no MPS daemon answers on $CUDA_MPS_PIPE_DIRECTORY yet (start it with scripts/init_mps_for_gpus.sh $MPS_GPUS); without it, CUDA_VISIBLE_DEVICES=$clients names the machine's GPUs $clients" >&2
fi
echo "export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY@Q}"
echo "export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY@Q}"
echo "export CUDA_VISIBLE_DEVICES=${clients@Q}"
