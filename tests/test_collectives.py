"""Collectives on CPU children (gloo): the full matrix, bad input, and a peer dying mid-collective."""
import contextlib
import socket

import numpy as np
import pytest
import torch

from harness import ChildError, Parent
from tests.helpers.collectives import assert_dead_peer_raises_childfailed, check_matrix, make_inputs, run_matrix


@pytest.fixture(scope="module")
def parent():
    with Parent() as p:
        yield p


@pytest.fixture(scope="module", params=[2, 3])
def kids(parent, request):
    return parent.fork(request.param)


@pytest.fixture(scope="module")
def pair(parent):
    return parent.fork(2)


def test_every_op_dtype_and_placement_matches_float64_reference(kids):
    inputs = make_inputs(len(kids))
    kids.exec(run_matrix, inputs)
    results = kids.wait()
    assert check_matrix(inputs, results) == len(kids) * len(results[0]) > 0


def test_communicator_reports_rank_size_backend(kids):
    kids.exec(lambda ctx: (lambda c: (c.rank, c.size, c.backend))(ctx.communicator()))
    assert kids.wait() == [(r, len(kids), "gloo") for r in range(len(kids))]


def _shifted(ctx):
    comm = ctx.communicator()
    t = torch.arange(5, dtype=torch.float32) + 10 * comm.rank
    out = torch.zeros(5)
    comm.shift(out, t)
    twice = torch.zeros(5)
    comm.shift(twice, out, async_op=True).wait()
    return out.tolist(), twice.tolist()


def test_shift_passes_each_rank_its_predecessors_tensor(kids):
    kids.exec(_shifted)
    n = len(kids)
    for rank, (once, twice) in enumerate(kids.wait()):
        assert once == [float(i + 10 * ((rank - 1) % n)) for i in range(5)]
        assert twice == [float(i + 10 * ((rank - 2) % n)) for i in range(5)]


BAD_CALLS = {
    "non-contiguous": (ValueError, "not contiguous", lambda c, t: c.all_reduce(torch.zeros(4, 4).t())),
    "wrong device": (ValueError, "needs cpu tensors", lambda c, t: c.all_reduce(torch.zeros(4, device="meta"))),
    "out size": (ValueError, "this collective needs 8", lambda c, t: c.all_gather(torch.zeros(7), t)),
    "out dtype": (TypeError, "must match", lambda c, t: c.all_reduce(t, out=torch.zeros(4, dtype=torch.float64))),
    "root": (ValueError, "out of range", lambda c, t: c.broadcast(t, root=5)),
    "dtype": (TypeError, "supported", lambda c, t: c.all_reduce(torch.zeros(4, dtype=torch.complex64))),
    "op": (ValueError, "not supported", lambda c, t: c.all_reduce(t, op="mean")),
    "avg on int": (TypeError, "floating-point", lambda c, t: c.all_reduce(torch.zeros(4, dtype=torch.int32), op="avg")),
    "not a tensor": (TypeError, "torch.Tensor", lambda c, t: c.all_reduce(np.zeros(4))),
    "scatter size": (ValueError, "not divisible", lambda c, t: c.reduce_scatter(torch.zeros(1), torch.zeros(3))),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_fails_fast_on_the_caller(pair, case):
    error, message, call = BAD_CALLS[case]

    def work(ctx):
        comm = ctx.communicator()
        try:
            call(comm, torch.zeros(4))
        except error as e:
            return str(e)
        return "no error"

    pair.exec(work)
    messages = pair.wait()
    assert all(message in m for m in messages), messages


def test_bad_input_on_one_rank_does_not_leave_the_others_hanging():
    def work(ctx):
        comm = ctx.communicator()
        t = torch.ones(4)
        if ctx.rank == 1:
            comm.all_reduce(t, op="median")      # fails its check; rank 0 is already waiting
        comm.all_reduce(t)
        return t.tolist()

    with Parent() as parent:
        kids = parent.fork(2)
        kids.exec(work)
        with pytest.raises(ChildError, match="median") as info:
            kids.wait()
        assert info.value.rank == 1
        kids.exec(lambda ctx: "free")          # the waiting rank was released, not left blocked
        assert kids.wait() == ["free", "free"]


def test_peer_dying_mid_collective_raises_childfailed_quickly():
    assert_dead_peer_raises_childfailed(3, None, victim=2)


def test_torch_distributed_can_be_joined_through_the_control_plane(pair):
    def work(ctx):
        import torch.distributed as dist
        from harness.collectives.store import init_torch_distributed
        init_torch_distributed(ctx, "gloo")
        t = torch.full((3,), float(ctx.rank + 1))
        dist.all_reduce(t)
        dist.destroy_process_group()
        return t.tolist()

    pair.exec(work)
    assert pair.wait() == [[3.0] * 3] * 2


def test_an_aborted_gloo_group_shuts_down_its_own_sockets_and_never_a_reused_descriptor():
    """gloo's abort shuts down the connections its process group opened, which it knows by descriptor
    and inode: a number that was closed and reused meanwhile names someone else's socket."""
    from harness.collectives.gloo import _opened, _shut_down, _sockets

    with contextlib.ExitStack() as sockets:
        keep = sockets.enter_context
        ours, _ = (keep(s) for s in socket.socketpair(socket.AF_UNIX))
        listener = keep(socket.create_server(("127.0.0.1", 0)))
        before = _sockets()
        gloo_side = socket.create_connection(listener.getsockname())
        keep(listener.accept()[0])
        opened = _opened(before, _sockets())
        assert gloo_side.fileno() in opened and ours.fileno() not in opened
        number = gloo_side.fileno()
        gloo_side.close()
        reused = keep(socket.create_connection(listener.getsockname()))   # the lowest free number: the same
        other_end = keep(listener.accept()[0])
        assert reused.fileno() == number and _opened(before, _sockets())[number] != opened[number]
        _shut_down(opened)
        reused.sendall(b"alive")                  # not shut down: it is not the socket that was noted
        assert other_end.recv(5) == b"alive"
        _shut_down(_opened(before, _sockets()))
        assert other_end.recv(5) == b""           # this one is: its end sees the connection close
