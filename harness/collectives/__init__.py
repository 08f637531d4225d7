"""Collectives behind one small interface: NCCL (through cupy.cuda.nccl) for GPU children,
gloo (through torch.distributed) for CPU children. ``ctx.communicator()`` picks by device."""
from __future__ import annotations

from typing import Any

from .base import DTYPES, OPS, Communicator, Work

__all__ = ["Communicator", "Work", "OPS", "DTYPES", "open_communicator"]


def open_communicator(ctx: Any, backend: str | None = None, **options: Any) -> Communicator:
    """Collective call on every child of the group. Closed automatically when the child's function ends.

    GPU children that share a GPU (several workers per GPU) get a HierarchicalCommunicator: they
    combine through CUDA IPC and one leader per GPU joins NCCL, which refuses two ranks on one GPU."""
    backend = backend or ("nccl" if ctx.gpu is not None else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend={backend!r}: choose 'nccl' (GPU children) or 'gloo' (CPU children)")
    if backend == "nccl" and ctx.gpu is None:
        raise ValueError("backend='nccl' needs GPU children (parent.fork(n, gpus=...)); CPU children use 'gloo'")
    # (host, GPU): GPU 0 of one host is not GPU 0 of another
    gpus = ctx.exchange(ctx.unique_tag("gpus"), (ctx.host, ctx.gpu)) if backend == "nccl" else []
    if len(set(gpus)) < len(gpus):
        if options:
            raise ValueError(f"options {sorted(options)} are not supported when workers share a GPU")
        from .hierarchical import HierarchicalCommunicator
        comm: Communicator = HierarchicalCommunicator(ctx, gpus, backend)
    elif backend == "nccl":
        from .nccl import NcclCommunicator
        comm = NcclCommunicator(ctx, **options)
    else:
        from .gloo import GlooCommunicator
        comm = GlooCommunicator(ctx, **options)
    ctx.own(comm)
    return comm
