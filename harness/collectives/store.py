"""Rendezvous for torch.distributed, through the control plane.

Rank 0 serves a TCPStore on a free port of its address (loopback on one machine, its interface
toward the parent across hosts; port 0: the OS picks, so there is no race between choosing and
binding) and the address reaches the other ranks over ZeroMQ, as the NCCL unique id does. gloo communicators use it, and so can users who want torch.distributed itself
(DDP, say) inside harness children.
"""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

def open_store(ctx: Any, timeout: float = 1800.0, host: str | None = None) -> dist.TCPStore:
    """Collective call on every child: a TCPStore shared by the whole group, served by rank 0 at
    ``host`` (default: rank 0's ``ctx.address``, loopback when the group runs on one machine)."""
    tag = ctx.unique_tag("store")
    delta = datetime.timedelta(seconds=timeout)
    if ctx.rank == 0:
        host = host or ctx.address
        store = dist.TCPStore(host, 0, ctx.world_size, True, delta, wait_for_workers=False)
        ctx.exchange(tag, (host, store.port))
        return store
    host, port = ctx.exchange(tag, None)[0]
    return dist.TCPStore(host, port, ctx.world_size, False, delta)


def init_torch_distributed(ctx: Any, backend: str = "nccl", timeout: float = 1800.0) -> None:
    """Collective call on every child: join torch.distributed's default process group."""
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    dist.init_process_group(backend, store=open_store(ctx, timeout), rank=ctx.rank, world_size=ctx.world_size,
                            timeout=datetime.timedelta(seconds=timeout), device_id=device)
