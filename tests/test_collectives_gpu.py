"""NCCL collectives on GPU children: the same matrix as on CPU, a dead peer, a failing rank.
Run on a GPU machine: python -m pytest -m gpu tests/test_collectives_gpu.py"""
import pytest
import torch

from harness import ChildError, Parent
from tests.helpers.collectives import assert_dead_peer_raises_childfailed, check_matrix, make_inputs, run_matrix
from tests.helpers.gpus import has_gpus

pytestmark = pytest.mark.gpu


def _need(n):
    if not has_gpus(n):
        pytest.skip(f"needs {n} CUDA GPUs")


@pytest.mark.parametrize("n", [2, 4])
def test_nccl_matrix_matches_float64_reference(n):
    _need(n)
    inputs = make_inputs(n)
    with Parent() as parent:
        kids = parent.fork(n, gpus=list(range(n)))
        kids.exec(lambda ctx: ctx.communicator().backend)
        assert kids.wait() == ["nccl"] * n
        kids.exec(run_matrix, inputs)
        results = kids.wait()
    assert check_matrix(inputs, results) == n * len(results[0]) > 0


def test_nccl_runs_on_the_stream_it_is_given():
    _need(2)

    def work(ctx):
        stream = torch.cuda.Stream()
        comm = ctx.communicator(stream=stream)
        with torch.cuda.stream(stream):
            t = torch.full((1 << 20,), float(ctx.rank + 1), device="cuda")
            pointer = t.data_ptr()
            comm.all_reduce(t)
            total = t[0].item()
        return total, t.data_ptr() == pointer

    with Parent() as parent:
        kids = parent.fork(2, gpus=[0, 1])
        kids.exec(work)
        assert kids.wait() == [(3.0, True), (3.0, True)]


def test_failing_rank_releases_nccl_peers():
    _need(2)

    def work(ctx):
        comm = ctx.communicator()
        t = torch.ones(4, device="cuda")
        if ctx.rank == 1:
            comm.all_reduce(t.cpu())            # wrong device: fails before entering NCCL
        comm.all_reduce(t)
        torch.cuda.synchronize()                # rank 0 waits here for the peer that never comes
        return "unreachable"

    with Parent() as parent:
        kids = parent.fork(2, gpus=[0, 1])
        kids.exec(work)
        with pytest.raises(ChildError, match="needs cuda tensors") as info:
            kids.wait()
        assert info.value.rank == 1
        kids.exec(lambda ctx: "free")           # rank 0's collective was aborted: it serves again
        assert kids.wait() == ["free", "free"]


def test_peer_dying_mid_nccl_collective_raises_childfailed_quickly():
    _need(2)
    assert_dead_peer_raises_childfailed(2, [0, 1], victim=1)
