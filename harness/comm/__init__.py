"""Collectives behind one small interface: NCCL (through cupy.cuda.nccl) for GPU children,
gloo (through torch.distributed) for CPU children. ``ctx.communicator()`` picks by device."""
from __future__ import annotations

from typing import Any

from .base import DTYPES, OPS, Communicator, Work

__all__ = ["Communicator", "Work", "OPS", "DTYPES", "open_communicator"]


def open_communicator(ctx: Any, backend: str | None = None, **options: Any) -> Communicator:
    """Collective call on every child of the group. Closed automatically when the child's function ends."""
    backend = backend or ("nccl" if ctx.gpu is not None else "gloo")
    if backend == "nccl":
        from .nccl import NcclCommunicator as cls
    elif backend == "gloo":
        from .gloo import GlooCommunicator as cls
    else:
        raise ValueError(f"backend={backend!r}: choose 'nccl' (GPU children) or 'gloo' (CPU children)")
    comm = cls(ctx, **options)
    ctx.own(comm)
    return comm
