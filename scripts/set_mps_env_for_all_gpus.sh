#!/usr/bin/env bash
# Point MPS clients at the daemon serving every GPU: source it, or eval its output.
# Sourced: run as a program, and its exports are applied to the sourcing shell.
[[ ${BASH_SOURCE[0]} == "$0" ]] || { source "$(dirname "${BASH_SOURCE[0]}")/mps_exports.sh" "${BASH_SOURCE[0]}" "$@"; return; }
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mps_common.sh"

usage() {   # to stderr: stdout is for the export lines
    cat >&2 <<USAGE
usage: source $MPS_PROG      or      eval "\$($MPS_PROG)"

set_mps_env_for_gpus.sh for the group of every GPU nvidia-smi lists (e.g. 0,1,2,3): points CUDA
programs started from this shell at the daemon that init_mps_for_all_gpus.sh started.
USAGE
}

mps_parse_args no no "$@"
gpus=$(mps_all_gpus)
exec "${BASH:-bash}" "$MPS_DIR/set_mps_env_for_gpus.sh" "$gpus"
