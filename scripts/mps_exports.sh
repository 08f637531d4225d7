# Sourced by set_mps_env_*.sh when the user sources them: runs the script ($1) as a program with the
# other arguments, and applies the export lines it prints to the user's shell. Nothing else of the
# script (its shell options, its functions) reaches that shell. The status is the program's.
if _mps_exports=$("${BASH:-bash}" "$@"); then
    eval "$_mps_exports"
    unset _mps_exports
    return 0
fi
unset _mps_exports
return 1
