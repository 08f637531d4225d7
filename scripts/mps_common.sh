# Shared by the *mps*.sh scripts, which source it; not meant to be run or sourced by hand.
# The daemon of GPU group G (nvidia-smi indices, e.g. 0,1) uses the pipe directory
# $MPS_ROOT/nvidia-mps_G and the log directory $MPS_ROOT/nvidia-log_G; MPS_ROOT defaults to /tmp.

MPS_CONTROL=nvidia-cuda-mps-control
MPS_PROG=$(basename "$0")
MPS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

mps_die() {     # mps_die STATUS MESSAGE: print the error and exit
    local status=$1
    shift
    printf '%s: error: %s\n' "$MPS_PROG" "$*" >&2
    exit "$status"
}

mps_bad_usage() {   # a bad command line: usage, the error, exit status 2
    usage >&2
    mps_die 2 "$*"
}

mps_check_list() {
    [[ $1 =~ ^[0-9]+(,[0-9]+)*$ ]] ||
        mps_bad_usage "bad GPU list '$1': give GPU indices as nvidia-smi numbers them, separated by commas, no spaces (e.g. 0,1)"
}

# mps_parse_args LIST EXCLUSIVE ARGS...: LIST and EXCLUSIVE (yes/no) say whether a GPU list is
# required and whether --exclusive is accepted. Sets MPS_GPUS and MPS_EXCLUSIVE (yes/no).
mps_parse_args() {
    local want_list=$1 want_exclusive=$2 arg
    shift 2
    MPS_GPUS='' MPS_EXCLUSIVE=no
    for arg in "$@"; do
        case $arg in
            -h|--help) usage; exit 0 ;;
            --exclusive) [[ $want_exclusive == yes ]] || mps_bad_usage "unknown option '$arg'"; MPS_EXCLUSIVE=yes ;;
            -*) mps_bad_usage "unknown option '$arg'" ;;
            *)
                [[ $want_list == yes && -z $MPS_GPUS ]] || mps_bad_usage "unexpected argument '$arg'"
                mps_check_list "$arg"
                MPS_GPUS=$arg ;;
        esac
    done
    [[ $want_list == no || -n $MPS_GPUS ]] || mps_bad_usage "no GPU list given (e.g. 0,1)"
}

mps_require() {     # mps_require COMMAND: exit unless COMMAND is on PATH
    command -v "$1" >/dev/null 2>&1 ||
        mps_die 1 "$1 not found on PATH; install the NVIDIA driver utilities or add their directory to PATH"
}

mps_use_group() {   # mps_use_group LIST: export the daemon environment of that group of GPUs
    local root=${MPS_ROOT:-/tmp}
    export CUDA_VISIBLE_DEVICES=$1
    export CUDA_MPS_PIPE_DIRECTORY=$root/nvidia-mps_$1
    export CUDA_MPS_LOG_DIRECTORY=$root/nvidia-log_$1
    # MPS puts a unix socket named "control" in the pipe directory: its path must fit in 108 bytes
    (( ${#CUDA_MPS_PIPE_DIRECTORY} + 8 <= 100 )) ||
        mps_die 1 "pipe directory $CUDA_MPS_PIPE_DIRECTORY is too long for a unix socket path; set a shorter MPS_ROOT"
}

mps_answers() {     # true if a daemon answers on $CUDA_MPS_PIPE_DIRECTORY
    [[ -e $CUDA_MPS_PIPE_DIRECTORY/control ]] &&
        command -v "$MPS_CONTROL" >/dev/null 2>&1 &&
        timeout 5 "$MPS_CONTROL" <<<get_server_list >/dev/null 2>&1
}

mps_wait_answers() {    # mps_wait_answers yes|no SECONDS: wait until mps_answers is (not) true
    local want=$1 tenths=$(( $2 * 10 ))
    while (( tenths-- > 0 )); do
        if mps_answers; then [[ $want == yes ]] && return 0; else [[ $want == no ]] && return 0; fi
        sleep 0.1
    done
    return 1
}

mps_all_gpus() {    # print every GPU's index, joined by commas
    local ids
    mps_require nvidia-smi
    ids=$(nvidia-smi --query-gpu=index --format=csv,noheader) ||
        mps_die 1 "nvidia-smi could not list the GPUs (its message is above)"
    ids=$(tr -d ' \r' <<<"$ids" | paste -sd, -)
    [[ -n $ids ]] || mps_die 1 "nvidia-smi lists no GPU"
    [[ $ids =~ ^[0-9]+(,[0-9]+)*$ ]] || mps_die 1 "unexpected GPU list from nvidia-smi: '$ids'"
    printf '%s\n' "$ids"
}

mps_compute_mode() {    # mps_compute_mode LIST MODE: set each GPU of LIST to compute mode MODE
    local id
    mps_require nvidia-smi
    for id in ${1//,/ }; do
        nvidia-smi -i "$id" -c "$2" ||
            mps_die 1 "could not set GPU $id to compute mode $2 (that needs root: use sudo, or leave out --exclusive)"
    done
}
