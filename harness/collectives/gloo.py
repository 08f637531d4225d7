"""gloo through torch.distributed, for CPU children.

The ranks meet through a TCPStore that rank 0 serves (comm/store.py), and each rank's gloo device
listens on its ``ctx.address``: loopback on one machine, its interface toward the parent across hosts.
Gloo cannot average, so "avg" is a sum then a division.

Aborting: a gloo collective blocked on a live peer cannot be interrupted by gloo itself (the
process group's ``abort()`` and ``shutdown()`` leave its sockets open, and so does dropping it
while a failed operation is still referenced somewhere in C++), and a peer blocked on *us* is only
freed when our connections close. So ``abort()`` shuts down the TCP connections the process group
opened (noted when it was made, from /proc/self/fd): a collective blocked here fails at once, and
so does every peer's that waits on this rank. That is what lets the survivors of a dead rank all
reach the point where they heal (harness/resilience/heal.py). Should a wait still be stuck ABORT_GRACE
seconds later, this process ends itself rather than wait out gloo's timeout.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
import stat
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo, ReduceOp

from .base import Communicator, Work
from .store import open_store

# Seconds after the abort before a wait still in flight ends the process. A freed wait needs gloo's loop thread,
# a gloo worker and then the GIL before it counts itself done, and on a loaded machine that took more than 2 s
# once: a survivor of a SIGKILLed peer (a torchrun heal in CI) ended itself, so the heal failed. Not reproduced
# in 50 runs under load; every noted connection's shutdown freed every wait there. Only a wait that stays stuck
# pays this grace.
ABORT_GRACE = 10.0
_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
        "prod": ReduceOp.PRODUCT}


class GlooCommunicator(Communicator):
    backend = "gloo"
    device_type = "cpu"

    def __init__(self, ctx: Any, timeout: float = 1800.0):
        super().__init__(ctx.rank, ctx.world_size)
        delta = datetime.timedelta(seconds=timeout)
        self._store = open_store(ctx, timeout)
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=ctx.address)]     # where peers reach this rank
        options._timeout = delta
        before = _sockets()
        self._pg = ProcessGroupGloo(self._store, self.rank, self.size, options)
        self._connections = _opened(before, _sockets())
        self._in_flight = 0
        self._remove_hook = ctx.on_abort(self.abort)

    def _work(self, work: Any, then=None) -> Work:
        def wait() -> None:
            self.check_alive()
            self._in_flight += 1
            try:
                work.wait()
            finally:
                self._in_flight -= 1
            self.check_alive()
            if then is not None:
                then()
        return Work(wait)

    def _average(self, op: str, out: torch.Tensor):
        return (lambda: out.div_(self.size)) if op == "avg" else None

    def _all_reduce(self, t: torch.Tensor, out: torch.Tensor, op: str) -> Work:
        if out is not t:
            out.copy_(t)
        return self._work(self._pg.allreduce([out], _all_reduce_options(op)), self._average(op, out))

    def _broadcast(self, t: torch.Tensor, root: int) -> Work:
        return self._work(self._pg.broadcast([t], _broadcast_options(root)))

    def _reduce(self, t: torch.Tensor, out: torch.Tensor, op: str, root: int) -> Work:
        if self.rank == root:
            buf = out if out is t else out.copy_(t)
        else:
            buf = t.clone()        # gloo may use a non-root's buffer as scratch; ours stays unchanged
        return self._work(self._pg.reduce([buf], _reduce_options(op, root)),
                          self._average(op, buf) if self.rank == root else None)

    def _all_gather(self, out: torch.Tensor, t: torch.Tensor) -> Work:
        chunks = list(out.view(self.size, -1).unbind(0))
        return self._work(self._pg.allgather([chunks], [t.view(-1)]))

    def _reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> Work:
        options = dist.ReduceScatterOptions()
        options.reduceOp = _OPS[op]
        return self._work(self._pg._reduce_scatter_base(out, t, options), self._average(op, out))

    def _shift(self, out: torch.Tensor, t: torch.Tensor) -> Work:
        sent = self._pg.send([t], (self.rank + 1) % self.size, 0)
        received = self._pg.recv([out], (self.rank - 1) % self.size, 0)
        return self._work(sent, then=lambda: self._work(received).wait())

    def _barrier(self) -> None:
        self._work(self._pg.barrier()).wait()

    def _abort(self) -> None:
        if self._pg is not None:
            _shut_down(self._connections)
        timer = threading.Timer(ABORT_GRACE, self._end_if_stuck)   # a no-op unless a wait is still stuck then
        timer.daemon = True
        timer.start()

    def _end_if_stuck(self) -> None:
        if self._in_flight:
            sys.stderr.write(f"rank {self.rank}: gloo collective still blocked {ABORT_GRACE:.0f} s after "
                             f"the run was aborted ({self.aborted}); ending this worker\n")
            sys.stderr.flush()
            os._exit(70)

    def _close(self) -> None:
        self._remove_hook()
        self._pg = None
        self._store = None


def _sockets() -> dict[int, int]:
    """This process's open sockets, descriptor -> inode (none where there is no /proc)."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                status = os.stat(f"/proc/self/fd/{name}")
                if stat.S_ISSOCK(status.st_mode):
                    found[int(name)] = status.st_ino
    return found


def _opened(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """The sockets in ``after`` that were not in ``before``. By inode, not by number: a socket that
    another thread closed meanwhile (a previous process group, collected) frees its number for a
    new one."""
    return {fd: inode for fd, inode in after.items() if before.get(fd) != inode}


def _shut_down(sockets: dict[int, int]) -> None:
    """Shut down the TCP connections among ``sockets`` (descriptor -> inode); both ends' blocked reads
    then fail. A descriptor now naming another socket (its own was closed, the number reused) is
    left alone: it may be anyone's, the control plane's included."""
    for fd, inode in sockets.items():
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino != inode:
                continue
            with socket.socket(fileno=os.dup(fd)) as connection:
                if connection.family in (socket.AF_INET, socket.AF_INET6):
                    connection.shutdown(socket.SHUT_RDWR)


def _all_reduce_options(op: str):
    options = dist.AllreduceOptions()
    options.reduceOp = _OPS[op]
    return options


def _reduce_options(op: str, root: int):
    options = dist.ReduceOptions()
    options.reduceOp = _OPS[op]
    options.rootRank = root
    return options


def _broadcast_options(root: int):
    options = dist.BroadcastOptions()
    options.rootRank = root
    return options
