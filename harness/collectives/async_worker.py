"""A worker of the asynchronous parameter server (``--mode async``): its synchroniser and stop vote.

The server (harness/collectives/server.py) runs in the parent, behind ``ctx.request("server", ...)``:
the parent already talks to every worker, tensors travel as out-of-band ZeroMQ frames, the server's
state is a few CPU tensors, and one push and one pull per worker every K updates is the traffic of
DiLoCo's all-reduce on a few hosts. Workers never run a collective with each other: one that did
(the loop's stop vote, its loss totals, validation) would hold a fast worker back to a slow one's
pace. So each worker's communicator is ``Solo``, a world of one, and what the group must share comes
from the server: the initial parameters (rank 0's, or a checkpoint's, handed out at the join), how many
inner updates this worker runs before its next push (its *grant*: in proportion to its speed at S >= 1,
harness/collectives/grants.py; 0 once the run's budget is spent or the run stops), when it is to
validate the anchor it was answered with (``validate``), and the consistent points of a checkpoint and of
the run's end (every worker parked, everyone answered with the same anchor; ``save``).

With --outer-delay D the answer says how many updates (``ahead``) the worker may run past its next push
before it takes that push's answer: the push is sent (``ctx.ask``) and the worker trains on; as soon as the
answer is there (``ctx.answered``), and at the latest once it has run those updates (or at a consistent point: a
checkpoint, the end), it takes the answer (``ctx.answer``) and continues from half its own parameters, half the
new anchor (``outer.MIX``, as a late streaming fragment lands). A slow link's exchange, or the wait for a slower
worker, then runs under the inner updates instead of stopping them. Parking pushes never run ahead.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import torch

from .base import Communicator, Work
from .compress import Codec
from .flat import FlatParameters
from .outer import anchored, host, land
from .shared import SHARED, SharedAreas
from .sync import Synchroniser
from .wire import Wire

DIVERGED, BAD_SAMPLES = -1, -2      # why a push stops the run where no signal does: a loss that is not finite, or
                                    # more bad samples than --max-bad-samples on the pushing worker


def to_server(ctx: Any) -> Callable[[dict], None]:
    """How an async worker's records reach metrics.jsonl: through the parent's server, whatever its rank (the
    parent reads only rank 0's own sends), without waiting for an answer."""
    return lambda record: ctx.ask("server", ("report", record))


class Solo(Communicator):
    """A world of one: every collective leaves the tensor as it is (``out``, if given, gets a copy); its tensors
    live on ``device_type`` (a GPU worker's loss totals and stop flags are on its GPU)."""

    backend = "solo"

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(0, 1)
        self.device_type = device_type

    def _all_reduce(self, t: torch.Tensor, out: torch.Tensor, op: str) -> Work:
        if out is not t:
            out.copy_(t)
        return Work()

    def _broadcast(self, t: torch.Tensor, root: int) -> Work:
        return Work()

    def _reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> Work:
        return self._all_reduce(t, out, op)

    def _all_gather(self, out: torch.Tensor, t: torch.Tensor) -> Work:
        return self._all_reduce(t, out, "sum")

    def _barrier(self) -> None:
        pass

    def _abort(self) -> None:
        pass

    def _close(self) -> None:
        pass


class AsyncSynchroniser(Synchroniser):
    """Push ``anchor - parameters`` after the updates the server granted, and continue from the anchor answered.
    ``workers``: how many there are; ``ctx``: the worker's context, whose ``request``, ``ask`` and ``answer``
    reach the parent's "server"; ``signal()``: the SIGINT/SIGTERM this worker received, if any; ``served``: a
    checkpoint's server state, which rank 0 brings to the join (None: its initial parameters start the server);
    ``wire``: how pushes and pulls are encoded (harness/collectives/wire.py; default fp32); ``held``: the anchor this
    rank saved in that checkpoint (with compressed pulls, the server's view of it, which the join hands back);
    ``place()``: the worker's (epoch, update, position in the epoch), which each push and the join tell the server,
    for a replacement to go on from should this worker die (a replacement, ``ctx.replacing``, rejoins the running
    server and is answered with its predecessor's, ``place``)."""

    def __init__(self, flat: FlatParameters, rank: int, workers: int, ctx: Any,
                 signal: Callable[[], int | None], served: dict | None = None, wire: Wire | None = None,
                 held: list[torch.Tensor] | None = None, place: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)):
        super().__init__(Solo(flat.params[0].device.type), flat)
        self.rank, self.workers, self.ctx, self.signal = rank, workers, ctx, signal
        self.served, self.wire, self.held, self.where = served, wire or Wire(Codec()), held, place
        self.predecessor: tuple[int, int, int] | None = None   # a replacement's: where the dead worker last pushed
        self.kept = False               # the join left this worker the anchor it saved (compressed pulls)
        # a compressed push's rounding error, sent with the next push
        self.residual = [torch.zeros_like(t, dtype=torch.float32) for t in flat.params] if self.wire.compressed else None
        self.staged: list[torch.Tensor] | None = None      # a GPU worker's fp32 push, on the host
        self.shared: SharedAreas | None = None      # its pushes and pulls in shared memory (harness/collectives/shared.py)
        self.ahead = 0                  # updates this worker may run past its next push before taking the answer
        self.in_flight = False          # a push is out whose answer it has not taken
        self.waited = 0.0               # seconds it waited for the last answer it took late
        self.sending = 0.0              # seconds a push that runs ahead took to send
        self.stood: float | None = None     # seconds it stood still for its last applied push, to send with the next
        self.diverged = False           # this worker's loss was not finite (ServerVote): the server stops everyone
        self.finite: torch.Tensor | None = None     # whether every loss since the last push was, on their device
        self.bad_samples = False        # this worker met more bad samples than it may skip: the same, but saved
        self.anchor = [t.detach().clone() for t in flat.params]
        self.version, self.stop_why = 0, 0
        self.grant = 0                  # the updates to run after ``pushed_at`` before the next push (0: none, the end)
        self.updates = 0                # the server's count of updates applied, all workers', at the last answer
        self.pushed_at = 0              # the update this worker last pushed after
        self.step = 0                   # the update this worker last made
        self.parked = False             # the last answer was a consistent point's
        self.final = False              # and the run's last one
        self.asked: set[str] = set()    # what answers asked that the loop has not done yet: "validate", "save"

    def start(self) -> None:
        """Join the server: rank 0 brings its parameters (or the checkpoint's server state); every worker
        starts from the anchor answered once all have joined, with its first grant. A dead worker's replacement
        rejoins the running server instead, which answers it at once (or at the consistent point being gathered)."""
        if self.ctx.replacing is not None:
            self._join("rejoin", {"generation": self.ctx.generation})
            return
        state = (self.served or {"anchor": host(self.flat.params), "momentum": None, "version": 0}) \
            if self.rank == 0 else {}
        state = {**state, "place": self.where()}
        if self.held is not None:
            state = {**state, "view": self.held}
        if self.rank == 0 and self.flat.buffers:        # rank 0's floating-point buffers start everyone
            state = {**state, "buffers": host(self.flat.buffers)}
        self._join("join", state)

    def _join(self, kind: str, state: dict) -> None:
        """The join (or rejoin) request, with the shared areas offered, and its answer taken."""
        if not self.wire.compressed:
            self.shared = SharedAreas.offered([t.numel() for t in self.flat.params], self.flat.params[0].is_cuda)
        if self.shared is not None:
            state = {**state, "shared": self.shared.paths}
        try:
            reply = self.ctx.request("server", (kind, state))
        finally:
            if self.shared is not None:
                SharedAreas.unlink(self.shared.paths)
        if self.shared is not None and reply.get("anchor") != SHARED:     # the server could not map them
            self.shared = None
        self.kept = "anchor" not in reply
        self._adopt(reply)
        self._wait()

    def after_step(self, step: int) -> None:
        self.step = step
        if self.in_flight and (step - self.pushed_at >= self.ahead or self.ctx.answered()):
            self._collect()
        if not self.in_flight and self.grant and step - self.pushed_at >= self.grant:     # its grant is known
            self._push(step, park=False)

    def over(self, step: int, total: int) -> bool:
        """The run ends for this worker when the server grants it no more updates (the budget is spent,
        or the run stops), not at ``total``: a fast worker runs more updates than that, a slow one fewer."""
        return self.grant == 0

    def position(self, step: int) -> int:
        """Where the run stands in updates of a synchronous run with the samples trained on so far: all
        workers' updates at the last answer over N, plus this worker's own since (equal to ``step`` at S = 0)."""
        return self.updates // self.workers + step - self.pushed_at

    def end_of_run(self, step: int) -> None:
        self.finish()

    def finish(self) -> None:
        """A consistent point (before a checkpoint, at the end): park, unless this worker is at one already
        (it was answered by a release and has made no update since) and the server knows all it has to say. A
        worker that met its bad samples past the limit (or a loss that is not finite) at the update a release
        answered, and so was granted more, parks again with that news: otherwise the others' next consistent point
        waited for it for ever, while it waited for them in the final exchange of bad samples."""
        self._collect()
        untold = (self.bad_samples or self.diverged) and self.grant and not self.final
        if not (self.parked and self.step == self.pushed_at) or untold:
            self._push(self.step, park=True)

    def before_evaluation(self) -> None:
        """Nothing: the worker the server asked evaluates the anchor it was answered with; no barrier."""

    def take(self, what: str) -> bool:
        """Whether an answer asked for ``what`` ("validate", "save") since it was last taken."""
        asked = what in self.asked
        self.asked.discard(what)
        return asked

    def evaluation_due(self, scheduled: bool) -> bool:
        """When the server asks this worker (every --validate-every updates of all workers' over N), not on
        the loop's schedule."""
        return self.take("validate")

    def evaluation_share(self, rank: int, world: int) -> tuple[int, int]:
        """The whole split: the one worker the server asked evaluates it."""
        return 0, 1

    def report_validation(self, record: dict, send: Callable[[dict], None] | None) -> None:
        """A validation record, to metrics.jsonl through the server (this worker may not be rank 0)."""
        to_server(self.ctx)({**record, "version": self.version, "updates": self.updates})

    def save_part(self, part: dict) -> None:
        """This worker's part of the checkpoint the server asked for (harness/training/loop_save.py's ``part``), to the
        parent, which writes the checkpoint once every worker's is in (harness/resilience/gathered.py); not waited
        for: there is no exchange of it with the other workers."""
        self.ctx.ask("server", ("part", part))

    def checkpoint_due(self, scheduled: bool) -> bool:
        """When the server has parked every worker for a checkpoint, not on the loop's schedule."""
        return "save" in self.asked

    def ready_to_save(self, unsaved: bool) -> bool:
        """At a consistent point (a worker that stops alone parks here), if the server said so: every worker,
        whatever its own update, then saves together."""
        self.finish()
        return self.take("save")

    def _push(self, step: int, park: bool) -> None:
        """Push the updates since the last push (every caller has taken the answer to the one before): the
        answer taken now, or (``ahead`` granted, not parking and nothing to report) after ``ahead`` more updates
        at the latest, in ``after_step``."""
        began = time.monotonic()
        nothing_new = step == self.pushed_at
        delta = None if nothing_new else self._pseudo_gradient()
        if self.finite is not None:         # read once a push, which waits for the device anyway
            self.diverged, self.finite = self.diverged or not bool(self.finite), None
        why = DIVERGED if self.diverged else self.signal() or (BAD_SAMPLES if self.bad_samples else 0)
        ahead = self.ahead if not (park or nothing_new or why) else 0
        body = {"step": step, "updates": step - self.pushed_at, "delta": delta, "park": park, "signal": why,
                "ahead": ahead, "waited": self.waited, "stood": self.stood, "place": self.where(),
                "buffers": host(self.flat.buffers) if delta is not None and self.flat.buffers else None}
        self.pushed_at, self.waited, self.stood = step, 0.0, None
        if ahead:
            self.ctx.ask("server", ("push", body))
            self.in_flight = True
            self.sending = time.monotonic() - began
            return
        self._adopt(self.ctx.request("server", ("push", body)))
        if delta is not None:
            self._stood(time.monotonic() - began)
        self._wait()

    def _pseudo_gradient(self) -> Any:
        """``anchor - parameters`` on the host: fp32 tensors, or one encoded vector (wire.py). A GPU worker's fp32
        push is copied into page-locked buffers kept for it, 40x faster than into fresh pageable memory (0.01
        against 0.39 s for 124M parameters on an H200's host: bench/results/2026-11-27-h200-async-gpu). They are
        overwritten only at the next push, which comes after this one's answer, so the server has it by then."""
        delta = [a - p for a, p in zip(self.anchor, self.flat.params)]
        if self.residual is not None:
            return self.wire.send(delta, self.residual)
        if self.shared is None and not delta[0].is_cuda:
            return [d.float() for d in delta]
        if self.shared is None and self.staged is None:
            self.staged = [torch.empty(d.shape, dtype=torch.float32, pin_memory=True) for d in delta]
        on_host = self.shared.push if self.shared is not None else self.staged
        for kept, d in zip(on_host, delta):
            kept.copy_(d, non_blocking=True)
        if delta[0].is_cuda:
            torch.cuda.current_stream().synchronize()
        return SHARED if self.shared is not None else on_host

    def _collect(self) -> None:
        """Take the answer to a push that ran ahead, if one is out: the parameters become half their own, half the
        new anchor (``MIX``), or the anchor where this worker has made no update since the push. Not the new anchor
        plus all it moved since the push: a late streaming fragment landing so left streaming 1.9% behind DiLoCo's
        loss, mixed it ends 0.04% behind (bench/results/2026-11-27-cpu2-slow-link-final-average)."""
        if not self.in_flight:
            return
        began = time.monotonic()
        reply = self.ctx.answer()
        self.waited = time.monotonic() - began
        self.in_flight = False
        self._adopt(reply, late=self.step != self.pushed_at)
        self._stood(self.sending + time.monotonic() - began)
        self._wait()

    def _stood(self, seconds: float) -> None:
        """This worker's inner steps stood still ``seconds`` for its push just answered (its pseudo-gradient, the
        trip, the server, the answer applied): the push's record says it (server.py's ``measured``). Sent with the
        next push; after the run's last answer, which no push follows, at once."""
        self.stood = seconds
        if self.final:
            self.ctx.ask("server", ("stood", seconds))
            self.stood = None

    def _wait(self) -> None:
        """Granted nothing at a release that is not the run's last (one with fewer updates left than workers):
        park until the last, which every worker takes part in (its checkpoint is everyone's)."""
        while self.parked and not self.grant and not self.final:
            self._push(self.pushed_at, park=True)

    def _adopt(self, reply: dict, late: bool = False) -> None:
        """The answer taken: the anchor (or its encoded change, added) in the anchor and the parameters (``late``: an
        answer taken after updates made since its push, mixed into them: outer.py's ``land``)."""
        if "anchor" in reply:
            for anchor, served in zip(self.anchor, self.shared.pull if reply["anchor"] == SHARED else reply["anchor"]):
                anchor.copy_(served)
        elif reply["change"] is not None:       # None: a resumed run's join, which keeps the anchor saved
            for anchor, change in zip(self.anchor, self.wire.received(reply["change"], self.anchor)):
                anchor.add_(change)
        for anchor, param in zip(self.anchor, self.flat.params):
            land(param, anchor, late)
        for buffer, served in zip(self.flat.buffers, reply.get("buffers") or ()):
            buffer.copy_(served)
        self.version, self.stop_why, self.grant = reply["version"], reply["stop_why"], reply["grant"]
        self.ahead = reply.get("ahead", 0)
        self.updates, self.parked, self.final = reply["updates"], reply["parked"], reply["final"]
        self.asked |= {what for what in ("validate", "save") if reply[what]}
        self.ctx.follow_heal(reply.get("generation", 0))      # a replacement joined: its exchanges are the next ones
        if "place" in reply:        # this worker replaces a dead one, which pushed last at this place
            self.predecessor = reply["place"]
            self.pushed_at = self.step = self.predecessor[1]

    def watch(self, loss: torch.Tensor) -> None:
        """Note whether an update's ``loss`` is finite, on its device: a GPU worker does not wait for each update
        to know it, the next push reads the note."""
        finite = torch.isfinite(loss.detach())
        self.finite = finite if self.finite is None else self.finite & finite

    def stopping(self) -> int:
        """The reason every worker stops (a signal's number, or -1: some worker's loss was not finite) once
        the server grants no more, else 0."""
        return self.stop_why if self.grant == 0 else 0

    def global_weights(self) -> contextlib.AbstractContextManager:
        """The anchor last pulled in the model's parameters, for evaluation or a checkpoint; then back."""
        return anchored(self.flat, self.anchor)

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint, taken at a consistent point: where it pushed last, and with compressed
        pulls its parameters, its view of the anchor (the server's view of it, which a resumed join hands back) and
        its push's residual. With fp32 pulls the parameters and anchor are the model's (every worker is answered the
        anchor whole at the consistent point), so they are not sent. The server's state goes with rank 0's part
        (harness/collectives/server.py's ``part``), which the resumed run's join hands back to the server."""
        compressed = self.wire.compressed
        return {"params": host(self.flat.params) if compressed else None,
                "anchor": host(self.anchor) if compressed else None, "server": None, "pushed_at": self.pushed_at,
                "residual": host(self.residual)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """After the join: the parameters and anchor saved where the join kept them (else every worker stays on
        the anchor it sent whole), and the residual of a compressed push."""
        restored = [(self.flat.params, state["params"]), (self.anchor, state["anchor"])] if self.kept else []
        if self.residual is not None and state.get("residual") is not None:
            restored.append((self.residual, state["residual"]))
        for mine, saved in restored:
            for t, value in zip(mine, saved):
                t.copy_(value)
        self.pushed_at = self.step = state["pushed_at"]


class ServerVote:
    """The loop's stop vote in async mode (``poll`` as harness/resilience/interrupt.py's StopVote):
    a signal, a non-finite loss or this worker's bad samples past the limit (``bad_samples``) go to the server
    with the next push; every worker stops once the server grants it no more updates, all of them parked at the
    same consistent point."""

    def __init__(self, sync: AsyncSynchroniser):
        self.sync = sync

    def poll(self, step: int, loss: torch.Tensor) -> tuple[int, bool]:
        self.sync.watch(loss)
        why = self.sync.stopping()
        return (why, False) if why > 0 else (0, why == DIVERGED)

    def bad_samples(self) -> None:
        """This worker met more bad samples than the run may skip (it counts alone: harness/data/bad_samples.py's
        Tally): the run stops at its next push, and saves."""
        self.sync.bad_samples = True
