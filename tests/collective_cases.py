"""The collectives matrix, shared by the CPU (gloo) and GPU (NCCL) tests.

``make_inputs`` draws fresh random data per rank in the parent; ``run_matrix`` runs in every child
and returns what each collective produced; ``check_matrix`` compares it with float64 numpy.
"""
import os
import signal
import time

import numpy as np
import pytest
import torch

from conftest import wait_gone
from harness import ChildFailed, Parent

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]
OPS = ["sum", "avg", "max", "min", "prod"]
NUMEL = 12          # divisible by 2, 3 and 4 ranks, for reduce_scatter
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float64: 1e-12}


def make_inputs(size: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    inputs = {}
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
    """Assert every result; returns how many checks passed."""
    size = len(results)
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
            assert value.dtype == dtype, (name, mode, dtype, op, value.dtype)
            actual = value.to(torch.float64).numpy()
            tolerance = TOLERANCE.get(dtype, 0.0)
            error = np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12)
            assert error <= tolerance, f"rank {rank} {name} {mode} {dtype} {op}: rel. error {error:.2e}"
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
    """A rank dies between collectives; the survivors' collectives must not hang the run."""
    with Parent() as parent:
        kids = parent.fork(n, gpus=gpus)
        pids = kids.pids
        kids.exec(_die_mid_collective, victim, make_comm)
        start = time.monotonic()
        with pytest.raises(ChildFailed) as info:
            kids.wait()
        assert time.monotonic() - start < 20
        assert info.value.rank == victim and "SIGKILL" in str(info.value)
    assert wait_gone(pids, 10) == []
