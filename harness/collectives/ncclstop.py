"""Stopping an NCCL communicator that a dead peer has left hanging, without holding the GIL.

cupy.cuda.nccl does everything else, but it has no ``ncclCommRevoke`` and it calls
``ncclCommAbort`` holding the GIL. A rank that survives a dead peer must stay responsive while its
communicator stops (its heartbeat thread is Python; silence for the heartbeat timeout gets it
killed), and on ResNet-50 cupy's abort stalled it past that. So the one call is made here through
ctypes, which releases the GIL for the length of a foreign call, on the very library cupy loaded
(found in /proc/self/maps: a second copy would not know the communicator).

Revoke (NCCL >= 2.28.7) stops the in-flight collectives and keeps the communicator's memory until
it is destroyed, so kernels still queued behind them (a CUDA graph's, say) find it intact and
return; the communicator is destroyed once the device has drained (``NcclCommunicator._close``).
Older NCCL has no revoke: cupy's abort it is, GIL and all. The outputs of stopped collectives are
undefined: they hold stale values that look plausible, which is why each update
of a healing GPU worker is guarded by a ticket that names its step (harness/resilience/heal.py).

cupy keeps the ``ncclComm_t`` in a C field with no accessor; ``comm_pointer`` finds it in the
object's memory, trusting only a word that points at NCCL's start-of-communicator magic.
"""
from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

NCCL_MAGIC = 0x0280028002800280     # struct ncclComm's startMagic ("Nickel atomic number is 28")
REVOKE_SINCE = 22807                # ncclCommRevoke appeared in NCCL 2.28.7


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The libnccl this process has loaded (cupy's), or None."""
    with open("/proc/self/maps") as maps:
        paths = [line.split(None, 5)[5].strip() for line in maps if "libnccl.so" in line and len(line.split()) > 5]
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    if hasattr(lib, "ncclCommRevoke"):
        lib.ncclCommRevoke.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def version(lib: ctypes.CDLL) -> int:
    code = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(code))
    return code.value


def comm_pointer(comm: Any) -> int | None:
    """The ``ncclComm_t`` inside a cupy ``NcclCommunicator``, or None if it cannot be found for sure."""
    words = (ctypes.c_uint64 * (type(comm).__basicsize__ // 8)).from_address(id(comm))
    for word in words[2:]:          # past the object header (reference count, type)
        if word % 8 == 0 and 0x10000 <= word < 1 << 47 and ctypes.c_uint64.from_address(word).value == NCCL_MAGIC:
            return word
    return None


def can_revoke() -> bool:
    """Whether the NCCL this process loaded has ``ncclCommRevoke``. Without it a stopped communicator is
    freed at once (cupy's abort), under any CUDA graph that captured it: freeing that graph afterwards
    touches freed memory, so a GPU worker that heals then runs its step eagerly (harness/training/loop.py)."""
    lib = library()
    return lib is not None and version(lib) >= REVOKE_SINCE and hasattr(lib, "ncclCommRevoke")


def revoke(comm: Any) -> bool:
    """Revoke cupy communicator ``comm`` without the GIL (destroy it once the device has drained).
    False where this NCCL or this cupy does not allow it: the caller aborts through cupy instead."""
    if not can_revoke():
        return False
    lib = library()
    pointer = comm_pointer(comm)
    if pointer is None:
        return False
    status = lib.ncclCommRevoke(pointer, 0)
    if status != 0:
        print(f"harness: ncclCommRevoke returned {status}; aborting instead", file=sys.stderr)
    return status == 0
