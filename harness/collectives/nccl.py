"""NCCL through cupy.cuda.nccl, directly on torch tensors' memory, on torch's CUDA streams.

No copies and no host round trip: each call hands NCCL ``tensor.data_ptr()`` and the raw handle
of a torch stream. A synchronous call is enqueued on the current stream (or the one given to the
communicator), so it is ordered with the model's kernels without any device-wide sync. An
asynchronous call goes on a side stream that first waits for the current one; its handle's
``wait()`` makes the then-current stream wait for it, and ``record_stream`` keeps the caching
allocator from reusing the buffers before NCCL is done with them.

The unique id is made once by rank 0 and handed to the others over the control plane.
``abort()`` is safe from another thread: the parent's failure notice calls it from the
housekeeping thread, so a kernel waiting on a dead peer returns. It revokes the communicator
without holding the GIL where NCCL can (harness/collectives/ncclstop.py), and the rank may go on
(healing, harness/resilience/heal.py): the revoked communicator is destroyed when it is closed, after the
device has run what was queued behind its collectives. Without revoke it is cupy's ncclCommAbort.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from . import ncclstop
from .base import Communicator, Work

# The current stream's cudaStream_t. torch.cuda.current_stream() builds a Python Stream object
# each call (microseconds, on a path whose budget is ~20 us); reading the raw handle does not.
# Of the communicator's own device: a warm spare that took a rank's place sees several GPUs.
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    def _current_raw_stream(device: int) -> int:
        return torch._C._cuda_getCurrentRawStream(device)
else:                                                        # older or CPU-only builds
    def _current_raw_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def keep_graphs_unregistered() -> None:
    """NCCL_GRAPH_REGISTER=0 for this process, unless set: the collectives a CUDA graph captures then go through
    NCCL's own buffers instead of registering the tensors' memory with the peers. Registered, --zero's
    replica exchange (a send/recv) in one graph with the shards' reduce-scatters and all-gathers never
    finished its first replay (2 x H200, NCCL 2.28.9: bench/results/2026-11-26-h200x2-zero-heal-hang);
    unregistered, it runs. NCCL reads the variable once, at the process's first communicator: call before."""
    os.environ.setdefault("NCCL_GRAPH_REGISTER", "0")


def _nccl():
    try:
        from cupy.cuda import nccl
    except ImportError as error:
        raise ImportError("the NCCL backend needs CuPy with NCCL: pip install 'harness[cuda13]' for CUDA 13 "
                          "or 'harness[cuda12]' for CUDA 12, or use backend='gloo'") from error
    if not getattr(nccl, "available", True):
        raise ImportError("CuPy was built without NCCL; install nvidia-nccl-cu12/13 or use backend='gloo'")
    return nccl


class NcclCommunicator(Communicator):
    backend = "nccl"
    device_type = "cuda"

    def __init__(self, ctx: Any, stream: torch.cuda.Stream | None = None):
        super().__init__(ctx.rank, ctx.world_size)
        nccl = _nccl()
        # ncclDataType_t and ncclRedOp_t values are fixed by nccl.h; older CuPy lacks some names.
        self._dtypes = {torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6, torch.float32: 7,
                        torch.float64: 8, torch.bfloat16: 9}
        self._ops = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
        if self.size == 1:
            # The average of one is the sum, which NCCL gets right where its "avg" does not: 2.28.9 in a
            # world of one wrote wrong values into the last 10 of 301066 floats of an out-of-place
            # reduce-scatter or all-reduce (an H100; sum exact; bench/results/2026-11-25-h100x2-zero).
            self._ops["avg"] = self._ops["sum"]
        torch.cuda.set_device(ctx.device)
        self._device = ctx.device.index
        uid = ctx.exchange(ctx.unique_tag("nccl-id"), nccl.get_unique_id() if self.rank == 0 else None)[0]
        self._comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._stream = stream
        self._side: torch.cuda.Stream | None = None
        self._now: int = 0                   # raw handle of the stream the current call goes on
        self._revoked = False
        self._remove_hook = ctx.on_abort(self.abort)

    def _finish(self, pending: tuple[Callable[[], None], tuple[torch.Tensor, ...]], async_op: bool) -> Work | None:
        launch, tensors = pending
        if not async_op:
            self._now = self._stream.cuda_stream if self._stream is not None else _current_raw_stream(self._device)
            launch()
            return None
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(self._stream or torch.cuda.current_stream())
        self._now = self._side.cuda_stream
        launch()
        if not torch.cuda.is_current_stream_capturing():     # a graph's memory pool outlives its replays
            for t in tensors:
                t.record_stream(self._side)
        done = torch.cuda.Event()
        done.record(self._side)
        return Work(lambda: torch.cuda.current_stream().wait_event(done))

    # Each primitive returns (launcher, tensors it touches) for _finish.
    def _all_reduce(self, t, out, op):
        return (lambda: self._comm.allReduce(t.data_ptr(), out.data_ptr(), t.numel(), self._dtypes[t.dtype],
                                             self._ops[op], self._now), (t, out))

    def _broadcast(self, t, root):
        return (lambda: self._comm.broadcast(t.data_ptr(), t.data_ptr(), t.numel(), self._dtypes[t.dtype],
                                             root, self._now), (t,))

    def _reduce(self, t, out, op, root):
        return (lambda: self._comm.reduce(t.data_ptr(), out.data_ptr(), t.numel(), self._dtypes[t.dtype],
                                          self._ops[op], root, self._now), (t, out))

    def _all_gather(self, out, t):
        return (lambda: self._comm.allGather(t.data_ptr(), out.data_ptr(), t.numel(), self._dtypes[t.dtype],
                                             self._now), (t, out))

    def _reduce_scatter(self, out, t, op):
        return (lambda: self._comm.reduceScatter(t.data_ptr(), out.data_ptr(), out.numel(),
                                                 self._dtypes[t.dtype], self._ops[op], self._now), (t, out))

    def _shift(self, out, t):
        nccl = _nccl()

        def launch() -> None:
            nccl.groupStart()
            try:    # a group left open would hold back every later call of this thread
                self._comm.send(t.data_ptr(), t.numel(), self._dtypes[t.dtype], (self.rank + 1) % self.size,
                                self._now)
                self._comm.recv(out.data_ptr(), out.numel(), self._dtypes[t.dtype], (self.rank - 1) % self.size,
                                self._now)
            finally:
                nccl.groupEnd()
        return launch, (t, out)

    def _barrier(self) -> None:
        token = torch.zeros(1, device="cuda")
        self.all_reduce(token)
        (self._stream or torch.cuda.current_stream()).synchronize()
        self.check_alive()

    def _abort(self) -> None:
        self._revoked = ncclstop.revoke(self._comm)
        if not self._revoked:
            self._comm.abort()

    def _close(self) -> None:
        self._remove_hook()
        if self._comm is not None and (self.aborted is None or self._revoked):
            torch.cuda.synchronize()        # a revoked communicator's queued kernels still read it
            self._comm.destroy()
        self._comm = None
