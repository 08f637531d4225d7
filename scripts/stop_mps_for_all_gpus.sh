#!/usr/bin/env bash
# Stop the MPS control daemon serving every GPU (see stop_mps_for_gpus.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {
    cat <<USAGE
usage: $MPS_PROG [--exclusive]

Run stop_mps_for_gpus.sh for the group of every GPU nvidia-smi lists (e.g. 0,1,2,3), the daemon
that init_mps_for_all_gpus.sh started.

  --exclusive  also set the GPUs back to the DEFAULT compute mode (needs root); give it only if
               you started the daemon with --exclusive.
USAGE
}

mps_parse_args no yes "$@"
gpus=$(mps_all_gpus)
exec "${BASH:-bash}" "$MPS_DIR/stop_mps_for_gpus.sh" "$gpus" "$@"
