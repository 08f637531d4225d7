#!/usr/bin/env bash
# Start one MPS control daemon serving every GPU (see init_mps_for_gpus.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {
    cat <<USAGE
usage: $MPS_PROG [--exclusive]

Run init_mps_for_gpus.sh for every GPU nvidia-smi lists (as one group, e.g. 0,1,2,3): one MPS
control daemon serving them all.

  --exclusive  also set the GPUs to the EXCLUSIVE_PROCESS compute mode (needs root). Never done by
               default: MPS works in the DEFAULT compute mode, and on a shared machine you must not
               change the compute mode.
USAGE
}

mps_parse_args no yes "$@"
gpus=$(mps_all_gpus)
exec "${BASH:-bash}" "$MPS_DIR/init_mps_for_gpus.sh" "$gpus" "$@"
