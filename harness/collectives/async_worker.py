"""A worker of the asynchronous parameter server (``--mode async``): its synchroniser and stop vote.

The server (harness/collectives/server.py) runs in the parent, behind ``ctx.request("server", ...)``:
the parent already talks to every worker, tensors travel as out-of-band ZeroMQ frames, the server's
state is a few CPU tensors, and one push and one pull per worker every K updates is the traffic of
DiLoCo's all-reduce on a few hosts. Workers never run a collective with each other: one that did
(the loop's stop vote, its loss totals, validation) would hold a fast worker back to a slow one's
pace. So each worker's communicator is ``Solo``, a world of one, and the decisions the group must
share come from the server: the initial parameters (rank 0's, or a checkpoint's, handed out at the
join), the step where a Ctrl-C or SIGTERM stops every worker (``stop_at``, in every answer), and the
consistent points of a checkpoint and of the run's end (``park``: every worker's progress pushed, and
everyone answered with the same anchor; a barrier).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from .base import Communicator, Work
from .flat import FlatParameters
from .outer import anchored, host
from .sync import Synchroniser


class Solo(Communicator):
    """A world of one: every collective leaves the tensor as it is (``out``, if given, gets a copy)."""

    backend = "solo"

    def __init__(self) -> None:
        super().__init__(0, 1)

    def _all_reduce(self, t: torch.Tensor, out: torch.Tensor, op: str) -> Work:
        if out is not t:
            out.copy_(t)
        return Work()

    def _broadcast(self, t: torch.Tensor, root: int) -> Work:
        return Work()

    def _barrier(self) -> None:
        pass

    def _abort(self) -> None:
        pass

    def _close(self) -> None:
        pass


class AsyncSynchroniser(Synchroniser):
    """Every ``every`` updates: push ``anchor - parameters`` and continue from the anchor answered.
    ``request(payload)``: the server's answer (``ctx.request`` bound to "server"); ``signal()``: the
    SIGINT/SIGTERM this worker received, if any; ``served``: a checkpoint's server state, which rank 0
    brings to the join (None: its initial parameters start the server)."""

    def __init__(self, flat: FlatParameters, every: int, rank: int, request: Callable[[tuple], dict],
                 signal: Callable[[], int | None], served: dict | None = None):
        super().__init__(Solo(), flat)
        self.every, self.rank, self.request, self.signal = every, rank, request, signal
        self.served = served
        self.diverged = False           # this worker's loss was not finite (ServerVote): the server stops everyone
        self.anchor = [t.detach().clone() for t in flat.params]
        self.version, self.stop_at, self.stop_why = 0, None, 0
        self.pushed_at = 0              # the update this worker last pushed after
        self.step = 0                   # the update this worker last made
        self.server_state: dict | None = None       # rank 0's: the server's at the last consistent point

    def start(self) -> None:
        """Join the server: rank 0 brings its parameters (or the checkpoint's server state); every worker
        starts from the anchor answered once all have joined."""
        state = (self.served or {"anchor": host(self.flat.params), "momentum": None, "version": 0}) \
            if self.rank == 0 else None
        self._adopt(self.request(("join", state)))

    def after_step(self, step: int) -> None:
        self.step = step
        if step % self.every == 0:
            self._push(step, park=False)

    def end_of_run(self, step: int) -> None:
        self.park(step)

    def finish(self) -> None:
        """Before a checkpoint or an evaluation: a consistent point (every rank reaches it at the same update)."""
        self.park(self.step)

    def park(self, step: int) -> None:
        """A consistent point (a checkpoint, the run's end): this worker's progress pushed, then the
        anchor every worker gets once all have parked."""
        self._push(step, park=True)

    def _push(self, step: int, park: bool) -> None:
        nothing_new = park and self.pushed_at == step       # pushed after this very update already
        delta = None if nothing_new else [(a - p).float().cpu() for a, p in zip(self.anchor, self.flat.params)]
        why = -1 if self.diverged else self.signal() or 0
        self._adopt(self.request(("push", {"step": step, "delta": delta, "park": park, "signal": why})))
        self.pushed_at = step

    def _adopt(self, reply: dict) -> None:
        for anchor, param, served in zip(self.anchor, self.flat.params, reply["anchor"]):
            anchor.copy_(served)
            param.copy_(anchor)
        self.version, self.stop_at, self.stop_why = reply["version"], reply["stop_at"], reply["stop_why"]
        if "momentum" in reply:
            self.server_state = {"anchor": host(self.anchor), "momentum": reply["momentum"], "version": self.version}

    def stopping(self, step: int) -> int:
        """The reason every worker stops after update ``step`` (a signal's number, or -1: some worker's
        loss was not finite), else 0."""
        return self.stop_why if self.stop_at is not None and step >= self.stop_at else 0

    def global_weights(self) -> contextlib.AbstractContextManager:
        """The anchor last pulled in the model's parameters, for evaluation or a checkpoint; then back."""
        return anchored(self.flat, self.anchor)

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint, taken at a consistent point (parameters = anchor); rank 0's
        carries the server's state, which the resumed run's join hands back to the server."""
        return {"params": host(self.flat.params), "anchor": host(self.anchor), "server": self.server_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mine, saved in ((self.flat.params, state["params"]), (self.anchor, state["anchor"])):
            for t, value in zip(mine, saved):
                t.copy_(value)


class ServerVote:
    """The loop's stop vote in async mode (``poll`` as harness/resilience/interrupt.py's StopVote):
    a signal or a non-finite loss goes to the server with the next push; every worker stops at the
    ``stop_at`` the server announces, the same update on all of them."""

    def __init__(self, sync: AsyncSynchroniser):
        self.sync = sync

    def poll(self, step: int, loss: torch.Tensor) -> tuple[int, bool]:
        self.sync.diverged = self.sync.diverged or not bool(torch.isfinite(loss))
        why = self.sync.stopping(step)
        return (why, False) if why > 0 else (0, why < 0)
