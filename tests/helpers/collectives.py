"""The collectives matrix, shared by the CPU (gloo), GPU (NCCL) and shared-device tests; a peer that
dies mid-collective; and ``Recording``, a real communicator that notes every call made on it.

``make_inputs`` draws fresh random data per rank in the parent (from a seed it draws itself unless
given one, named in every failed check); ``run_matrix`` runs in every child and returns what each
collective produced; ``check_matrix`` compares it with float64 numpy.
"""
from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest
import torch

from harness import ChildFailed, Parent
from tests.helpers.processes import wait_gone

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]
OPS = ["sum", "avg", "max", "min", "prod"]
NUMEL = 12          # divisible by 2, 3 and 4 ranks, for reduce_scatter
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float64: 1e-12}


def make_inputs(size: int, seed: int | None = None) -> dict:
    """Each rank's data for every dtype, and the roots; ``seed``: drawn from os.urandom if None."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    rng = np.random.default_rng(seed)
    inputs: dict[str, Any] = {"seed": seed}
    for dtype in DTYPES:
        if dtype.is_floating_point:
            values = rng.uniform(0.5, 1.5, size=(size, NUMEL))     # prod stays in range
        else:
            values = rng.integers(0, 4, size=(size, NUMEL))         # uint8 sums cannot overflow
        inputs[str(dtype)] = torch.tensor(values).to(dtype)
    inputs["roots"] = rng.integers(0, size, size=2).tolist()
    return inputs


def ops_for(dtype):
    return OPS if dtype.is_floating_point else [op for op in OPS if op != "avg"]


def run_matrix(ctx, inputs: dict, make_comm=None) -> dict:
    comm = make_comm(ctx) if make_comm else ctx.communicator()
    device = ctx.device
    reduce_root, bcast_root = inputs["roots"]
    results = {}
    for dtype in DTYPES:
        mine = inputs[str(dtype)][ctx.rank].to(device)
        for op in ops_for(dtype):
            t = mine.clone()
            comm.all_reduce(t, op=op)
            results[("all_reduce", "in", dtype, op)] = t.cpu()
            t, out = mine.clone(), torch.empty_like(mine)
            comm.all_reduce(t, op=op, out=out)
            results[("all_reduce", "out", dtype, op)] = out.cpu()
            results[("all_reduce", "out-input", dtype, op)] = t.cpu()
            t = mine.clone()
            comm.reduce(t, root=reduce_root, op=op)
            results[("reduce", "in", dtype, op)] = t.cpu()
            t, out = mine.clone(), torch.zeros_like(mine)
            comm.reduce(t, root=reduce_root, op=op, out=out)
            results[("reduce", "out", dtype, op)] = (out if ctx.rank == reduce_root else t).cpu()
            out = torch.empty(NUMEL // ctx.world_size, dtype=dtype, device=device)
            comm.reduce_scatter(out, mine.clone(), op=op)
            results[("reduce_scatter", "out", dtype, op)] = out.cpu()
        t = mine.clone()
        comm.broadcast(t, root=bcast_root)
        results[("broadcast", "in", dtype, None)] = t.cpu()
        out = torch.empty(NUMEL * ctx.world_size, dtype=dtype, device=device)
        comm.all_gather(out, mine)
        results[("all_gather", "out", dtype, None)] = out.cpu()
        work = comm.all_reduce(mine.clone(), async_op=True)
        work.wait()
    t = inputs[str(torch.float32)][ctx.rank].to(device)
    out = torch.empty_like(t)
    work = comm.all_reduce(t, op="avg", out=out, async_op=True)
    work.wait()
    results[("all_reduce", "async", torch.float32, "avg")] = out.cpu()
    comm.barrier()
    return results


def _reduce(values: np.ndarray, op: str) -> np.ndarray:
    return {"sum": values.sum(0), "avg": values.mean(0), "max": values.max(0), "min": values.min(0),
            "prod": values.prod(0)}[op]


def check_matrix(inputs: dict, results: list[dict]) -> int:
    """Assert every result; returns how many checks passed. A failure names the inputs' seed."""
    size, seed = len(results), inputs["seed"]
    reduce_root, bcast_root = inputs["roots"]
    checked = 0
    for rank, got in enumerate(results):
        for (name, mode, dtype, op), value in got.items():
            data = inputs[str(dtype)].to(torch.float64).numpy()
            if name == "all_reduce" and mode == "out-input":
                expected = data[rank]                                   # out of place leaves t alone
            elif name == "all_reduce":
                expected = _reduce(data, op)
            elif name == "reduce":
                expected = _reduce(data, op) if rank == reduce_root else data[rank]
            elif name == "reduce_scatter":
                chunk = NUMEL // size
                expected = _reduce(data, op)[rank * chunk:(rank + 1) * chunk]
            elif name == "broadcast":
                expected = data[bcast_root]
            else:
                expected = data.reshape(-1)
            assert value.dtype == dtype, (name, mode, dtype, op, value.dtype, f"seed {seed}")
            actual = value.to(torch.float64).numpy()
            tolerance = TOLERANCE.get(dtype, 0.0)
            error = np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12)
            assert error <= tolerance, f"rank {rank} {name} {mode} {dtype} {op}: rel. error {error:.2e} (seed {seed})"
            checked += 1
    return checked


def _die_mid_collective(ctx, victim: int, make_comm=None) -> None:
    comm = make_comm(ctx) if make_comm else ctx.communicator()
    t = torch.ones(1 << 20, device=ctx.device)
    for step in range(1000):
        comm.all_reduce(t)
        if t.is_cuda:
            torch.cuda.synchronize()
        if step == 1 and ctx.rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)


def assert_dead_peer_raises_childfailed(n: int, gpus, victim: int, make_comm=None) -> None:
    """A rank dies between collectives; the survivors' collectives must not hang the run: the wait
    ends in ChildFailed naming the victim (a hang would end in pytest's timeout instead)."""
    with Parent() as parent:
        kids = parent.fork(n, gpus=gpus)
        pids = kids.pids
        kids.exec(_die_mid_collective, victim, make_comm)
        with pytest.raises(ChildFailed) as info:
            kids.wait()
        assert info.value.rank == victim and "SIGKILL" in str(info.value)
    assert wait_gone(pids, 10) == []


class Recording:
    """A real communicator (``ctx.communicator()`` in a child) that notes each all_reduce made on it,
    as (data_ptr, numel, op, async_op), and passes it on: what the gradient synchronisers launch, in
    which order, checked against a group that really averages."""

    def __init__(self, comm: Any):
        self._comm = comm
        self.size = comm.size
        self.calls: list[tuple[int, int, str, bool]] = []

    def all_reduce(self, t: torch.Tensor, op: str = "sum", async_op: bool = False, **options: Any) -> Any:
        self.calls.append((t.data_ptr(), t.numel(), op, async_op))
        return self._comm.all_reduce(t, op=op, async_op=async_op, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


def small_model() -> torch.nn.Module:
    """Three linear layers (20-64-64-5), the same on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 5))
