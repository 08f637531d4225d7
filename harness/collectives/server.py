"""The asynchronous parameter server's rule (``--mode async``): stale-synchronous outer steps on versions.

The server holds the global parameters (the *anchor*), the outer optimizer's momentum and a *version*
that counts the outer steps applied. Each answer grants the worker a number of inner updates
(harness/collectives/grants.py: K each at S = 0; at S >= 1 in proportion to its measured speed, from a
budget all workers share); the worker runs them, pushes its pseudo-gradient (anchor it last pulled minus
its parameters) and blocks until it is answered with the new anchor, version and grant. The version it
pulled is its *base*, and a push applied at version V has staleness ``V - base``.
On each push (and after each step it applies) the server repeats, until neither applies:

1. every active worker has a pending push: one outer step with their average (summed in rank order,
   then divided by the number of workers N, as a gloo all-reduce averages), all of them answered;
2. else the oldest pending push alone, as its 1/N share of a round (its delta divided by the number of
   workers: applied whole, one worker's pushes moved the anchor N times too far, and the slow-link bench
   ended at a validation loss of 3.78 against 2.76), if no active worker without a pending push, and no
   other pending push, would then be more than S versions behind: ``(V + 1) - base_u <= S`` for each such u
   (a pending push left out counts too: with three workers it was later applied S + 1 stale), and unless every
   worker without a pending push is due back within HOLD of a round (its grant at its measured rate, harness/collectives/grants.py;
   or not measured yet: the first round), in which case the push waits for them and rule 1 averages them.

With S = 0 rule 2 never fires: every version is one synchronous round, the very arithmetic of
``--mode param --outer-optimizer nesterov`` (harness/collectives/outer.py). With S >= 1 a fast
worker waits only where it would leave a slow one more than S versions behind, or where the others are
about to come back: grants in proportion to speed bring the workers back at about the same moment, and
pushes applied one by one, each stale by one version, ended the slow-link bench at a validation loss of
3.27 to 3.59 (3.02 with both hosts at full speed) against DiLoCo's 2.67. A push is never applied more than
S versions stale (while u has no push pending, V stays <= base_u + S).

The run's shared points are counted in updates applied, all workers' together (``Plan``), never in a
worker's own updates, which differ from worker to worker:
- a validation: once a push passes a multiple of ``validate_every``, the fastest worker (by measured rate;
  the pusher while none is measured) is asked in its next answer (``validate``) to evaluate the anchor it
  was answered with; the others train on. Not a barrier; a multiple passed before that answer is not asked
  again.
- a checkpoint, the run's end and a stop need a consistent point: *parking*. A parked push is applied like
  any other but answered only once every worker is parked; parked workers are not waited for (rules 1 and
  2 skip them). Then all of them get the same anchor and version. Once the updates applied pass a multiple
  of a ``save_every``, every push is parked until all are, and the answers say ``save``. Once nothing is
  left to grant, or a worker's push reports a signal (or a loss that is not finite, or more bad samples than it
  may skip), every push is parked: each worker's after the updates it was granted. The answers then grant 0,
  are ``final`` and say ``save`` (but after a loss that is not finite), and at the run's end (not at a stop) ask
  the fastest worker to ``validate`` the final anchor. Every worker is granted at least one update at any other
  release (a checkpoint is not made with fewer updates left than workers); where it cannot be (a resume with
  fewer left), a worker granted 0 parks until the final release, so that every worker saves at every release.

With --outer-delay D (``ahead``) a worker does not wait for its push's answer: it trains on, for up to D
updates (set aside by the answer before: harness/collectives/grants.py), until it takes the answer and
continues from the new anchor plus the progress it made meanwhile, so the exchange runs under its updates,
as streaming DiLoCo's does. Such a push is never parked (its worker is past it): where it would be (a checkpoint, the end, a stop),
it is answered with a grant of the updates set aside for it to run ahead (its window), and the worker pushes
again, parked, once it has run them.

Each applied push is an ``outer_sync`` record whose ``blocked_s`` is how long its worker's inner steps stood
still for that exchange (its push, the wait here, the outer step, the answer, taken on the device): the worker
measures it and sends it with its next message (``stood``), so a record leaves ``drain`` only once its worker has
sent it, in the order the pushes were applied. Where it never comes (the run's last push, a worker that died) the
record keeps what the server saw: the time the push waited here (none where its worker ran ahead).

A dead worker is replaced in place (``lose``, then its replacement's ``rejoin``): the others train on and are never
aborted (they share no collective), waiting for the replacement only where the rule above would wait for any worker.
What the dead worker was granted and had not delivered (its running grant, a push not applied yet, the updates set
aside for it to run ahead) goes back to the budget, so nothing is lost before its last applied push: the
replacement continues from that push's place in the data (``places``: each worker's epoch, update and position
there, or at its join) with the anchor answered whole and a fresh inner optimizer, and redoes the samples after it.
A checkpoint's release asks each worker for its part (its own state, generators; rank 0's also the model), which
it sends here (``part``) and trains on; once all are in, the parent writes the checkpoint (``gathered``,
harness/resilience/gathered.py). No worker waits for another's part, so a death then is healed like any other; a
checkpoint whose part the dead worker never sent is dropped (a "save_dropped" record), and the next is written.
Not healed in place: a death after the run's last release (every worker then takes part in one last exchange of
the bad samples it met); the group restarts from the last checkpoint. The replacement's join brings the group's new
generation (harness/child.py), which every later answer carries, so that the survivors' exchanges are the
replacement's.

Pure and synchronous: the parent serves ``handle`` (``Children.serve``, harness/training/driver.py), which
runs on its socket thread and returns the answers to send; tests call ``join``/``push`` directly.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .async_worker import BAD_SAMPLES
from .compress import Codec
from .grants import Grants
from .outer import AVERAGE, OuterOptimizer
from .shared import SHARED, SharedAreas
from .wire import Wire

HOLD = 1.0      # a push waits for workers due back within this share of a round (rule 2): on the slow-link
                # bench, under a changing load, returns came up to a round off their prediction, and each miss
                # (two pushes applied one by one) cost the final validation loss 2.67 -> 2.81
Answer = tuple[int, dict | None]        # (rank, what that rank is answered)


@dataclass(frozen=True)
class Plan:
    """The run's length and shared points, in updates of all workers together (N times a synchronous run's
    updates): ``budget``, a validation each time the updates applied pass a multiple of ``validate_every``
    (0: at the end only), a checkpoint at each multiple of one of ``save_every`` and at the end, if
    ``saves`` (the run writes checkpoints)."""
    budget: int
    validate_every: int = 0
    save_every: tuple[int, ...] = ()
    saves: bool = False


@dataclass
class Push:
    """A worker's pending push: ``updates`` run since its last, and their pseudo-gradient (None: nothing
    new, only parking) against ``base``."""
    rank: int
    step: int
    updates: int
    base: int
    delta: list[torch.Tensor] | None
    park: bool
    arrived: float
    ahead: int = 0          # the updates its worker runs before it takes the answer (--outer-delay)
    nbytes: int = 0         # what it carried on the wire
    buffers: list[torch.Tensor] | None = None   # its model's floating-point buffers (BatchNorm statistics)
    place: tuple[int, int, int] | None = None   # its worker's (epoch, update, position in the epoch) at the push


def mean_into(total: list[torch.Tensor], parts: list[list[torch.Tensor]], n: int) -> list[torch.Tensor]:
    """``parts`` (lists of tensors like ``total``) summed in their order into ``total``, then divided by ``n``, as a
    gloo all-reduce averages (so that S = 0 is param mode's arithmetic); returns ``total``."""
    for t, first in zip(total, parts[0]):
        t.copy_(first)
    for part in parts[1:]:
        for t, more in zip(total, part):
            t.add_(more)
    for t in total:
        t.div_(n)
    return total


def passes(before: int, after: int, every: int) -> bool:
    """Whether counting from ``before`` to ``after`` passes a multiple of ``every`` (0: never)."""
    return bool(every) and before // every < after // every


class ParameterServer:
    """The rule of the module's docstring for ``workers`` workers; ``every`` is K; ``clock``: the seconds the
    grants measure speed in; ``hold``: HOLD (0: a push never waits for workers due back; tests of the
    staleness rule alone); ``ahead``: --outer-delay (the updates a worker runs past a push before it takes the
    answer); ``past_bad_limit(record)``: whether a worker's reported record brings the run past
    --max-bad-samples (harness/data/bad_samples.py's ``RunCount``), which stops it as one worker's own count
    does; ``wire``: how pushes and pulls are encoded (harness/collectives/wire.py; default fp32). ``records``
    collects one "outer_sync" record per applied push (and the workers' validation and bad sample records), for
    the run's metrics.jsonl."""

    def __init__(self, workers: int, outer: OuterOptimizer, every: int, max_staleness: int, plan: Plan,
                 clock: Callable[[], float] = time.monotonic, hold: float = HOLD, ahead: int = 0,
                 past_bad_limit: Callable[[dict], bool] = lambda record: False, wire: Wire | None = None):
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness}: must be 0 or more (0 is synchronous DiLoCo)")
        if not 0 <= ahead < every:
            raise ValueError(f"ahead={ahead}: must be 0 or more and under K={every}")
        self.workers, self.outer, self.every, self.max_staleness = workers, outer, every, max_staleness
        self.plan, self.clock, self.hold, self.ahead = plan, clock, hold, ahead
        self.past_bad_limit, self.wire = past_bad_limit, wire or Wire(Codec())
        self.grants = Grants(plan.budget, every, workers, proportional=max_staleness > 0)
        self.anchor: list[torch.Tensor] | None = None
        self.views: list[list[torch.Tensor]] = []     # compressed pulls: the anchor each worker holds
        self.momentum: list[torch.Tensor] | None = None
        self.total: list[torch.Tensor] = []     # the pushes of an outer step summed, kept from step to step
        self.served: list[torch.Tensor] | None = None   # a copy of the anchor answered, until the anchor changes
        self.shared: dict[int, SharedAreas] = {}        # the workers that push and pull through shared memory
        self.buffers: list[list[torch.Tensor]] = []     # the floating-point buffers each worker holds, as last told
        self.version = 0
        self.base = [0] * workers
        self.places: list[tuple[int, int, int] | None] = [None] * workers  # at each worker's last applied push or join
        self.lost: dict[int, tuple[float, int]] = {}    # dead workers not replaced yet: since when, updates returned
        self.placing: set[int] = set()  # replacements whose next answer says where they go on from
        self.generation = 0             # the group's (harness/child.py), as the last replacement's join brought it
        self.parts: dict[int, dict] | None = None   # the workers' parts of the checkpoint asked for, until all are in
        self.gathered: list[list[dict]] = []    # checkpoints whose parts are all in, each in rank order, to write
        self.at_save: dict | None = None        # the server's state at the release that asked for them (``state``)
        self.ended = False              # the run's last release is answered
        self.pending: list[Push] = []
        self.parked: set[int] = set()
        self.joined: dict[int, dict | None] = {}
        self.stop_why = 0               # the signal that stops the run, or -1: a worker's loss was not finite, or -2: a
                                        # worker met more bad samples than --max-bad-samples (async_worker.py)
        self.saving = False             # a checkpoint is due: every push parks until all have
        self.saved = 0                  # the updates applied at the last checkpoint
        self.validator: int | None = None       # the worker to ask for a validation in its next answer
        self.records: collections.deque[dict] = collections.deque()    # appended here, drained by the main thread
        self.healed: list[dict] = []            # replacements' rejoins, drained ahead of ``records``
        self.unmeasured: dict[int, dict] = {}   # each worker's last applied push's record, until it sends ``stood``
        self.lock = threading.Lock()            # ``handle`` runs on the socket's thread, ``drain`` on the main one

    @property
    def applied(self) -> int:
        """Updates applied to the anchor, all workers' together."""
        return sum(self.grants.given) - sum(self.grants.current)

    def join(self, rank: int, state: dict | None) -> list[Answer]:
        """A worker's start: rank 0 brings the state to serve (``{"anchor", "momentum", "version",
        "updates"}``: its initial parameters, or a checkpoint's server state), the others None; on a resume each
        also brings ``view``, the anchor it saved (the server's view of it, where pulls are compressed). Everyone is
        answered once all have joined: this is also the broadcast that starts every replica from the same
        parameters."""
        self.joined[rank] = state
        if len(self.joined) < self.workers:
            return []
        self.places = [(self.joined[r] or {}).get("place") for r in range(self.workers)]
        state = self.joined[0]
        self.anchor, self.served = [t.clone() for t in state["anchor"]], None
        saved = state.get("momentum")
        self.momentum = ([t.clone() for t in saved] if saved is not None else [torch.zeros_like(t) for t in self.anchor]) \
            if self.outer.kind == "nesterov" else None
        self.version, self.base = state.get("version", 0), [state.get("version", 0)] * self.workers
        self.grants.given = list(state.get("updates") or [0] * self.workers)
        self.grants.rates = list(state.get("rates") or [None] * self.workers)    # a resumed run's, as measured then
        self.saved = self.applied
        views = [(self.joined[r] or {}).get("view") for r in range(self.workers)]
        kept = self.wire.compressed and all(view is not None for view in views)
        self.views = [[t.clone() for t in view] for view in views] if kept else []
        self.shared = self._attach()
        self.buffers = [state["buffers"]] * self.workers if state.get("buffers") else []     # rank 0's, to everyone
        self.joined = {}
        return self._release(kept)

    def _attach(self) -> dict[int, SharedAreas]:
        """The shared areas the joined workers offered (harness/collectives/shared.py), mapped and unlinked; a
        worker whose areas are not on this machine is answered through the socket, which tells it to push there."""
        attached = {rank: self._mapped(state) for rank, state in self.joined.items()}
        return {rank: areas for rank, areas in attached.items() if areas is not None}

    def _mapped(self, state: dict | None) -> SharedAreas | None:
        """The shared areas a joining worker's ``state`` offers, mapped and unlinked (None: none, or not here)."""
        if not (state and state.get("shared")) or self.wire.compressed:
            return None
        try:
            areas = SharedAreas(state["shared"], [t.numel() for t in self.anchor])
        except (OSError, ValueError):
            return None
        SharedAreas.unlink(state["shared"])
        return areas

    def lose(self, rank: int) -> str | None:
        """Worker ``rank`` died: None where its replacement may rejoin (what it was granted and did not deliver goes
        back to the budget, a push of its not applied yet is dropped, and the others train on), else why not."""
        with self.lock:
            if self.anchor is None:
                return "it died before every worker had joined the parameter server"
            if self.ended:
                return "the run's last answer was given"
            if self.parts is not None and rank not in self.parts:   # nobody waits for it: that checkpoint is not written
                self.parts = None
                self.records.append({"event": "save_dropped", "time": time.time(), "rank": rank, "updates": self.saved,
                                     "why": f"worker {rank} died before it sent its part; the next checkpoint is written"})
            self.pending = [push for push in self.pending if push.rank != rank]
            self.parked.discard(rank)
            self.unmeasured.pop(rank, None)     # its last record keeps the server's figure
            self.lost[rank] = time.monotonic(), self.grants.lose(rank)
            return None

    def rejoin(self, rank: int, state: dict) -> list[Answer]:
        """A dead worker's replacement joins the running server: answered at once with the anchor whole, a grant
        and its predecessor's place (``place``), or parked with the others where a consistent point is being gathered
        (a checkpoint, the end, a stop); ``state``: the group's new ``generation`` and any shared areas it offers."""
        if rank not in self.lost:
            raise RuntimeError(f"worker {rank} rejoined the parameter server, but it had not died")
        since, returned = self.lost.pop(rank)
        self.placing.add(rank)
        self.generation = max(self.generation, state.get("generation", 0))
        areas = self._mapped(state)
        if areas is not None:
            self.shared[rank] = areas
        else:
            self.shared.pop(rank, None)
        self.base[rank] = self.version
        place = self.places[rank]
        self.healed.append({"event": "healed", "time": time.time(), "rank": rank, "step": place[1] if place else 0,
                            "mode": "async", "version": self.version, "returned_updates": returned,
                            "seconds": time.monotonic() - since})       # from the death seen to the rejoin, not to when the log had it
        if self.saving or self._finished():
            self.parked.add(rank)
            return self._settle()
        grant = self._grants([rank], self.clock())[0]
        return [(rank, self._reply(rank, grant, whole=True, buffers=self._averaged()))] + self._settle()

    def part(self, rank: int, part: dict) -> list[Answer]:
        """Worker ``rank``'s part of the checkpoint its last release asked for (harness/training/loop_save.py's ``part``);
        once every worker's is in, the checkpoint is ``gathered`` for the parent to write
        (harness/resilience/gathered.py). Not answered: the worker goes on training."""
        if self.parts is not None:
            self.parts[rank] = part
            if len(self.parts) == self.workers:     # rank 0's own part carries the server's state, as it resumes it
                self.gathered.append([{**self.parts[0], "server": self.at_save},
                                      *(self.parts[r] for r in range(1, self.workers))])
                self.parts = self.at_save = None
        return []

    def push(self, rank: int, step: int, updates: int, delta: Any, park: bool = False,
             signal: int = 0, ahead: int = 0, waited: float = 0.0, stood: float | None = None,
             buffers: list[torch.Tensor] | None = None, place: tuple[int, int, int] | None = None) -> list[Answer]:
        """Worker ``rank``'s push after update ``step``, ``updates`` since its last, ``delta`` their pseudo-gradient
        (fp32 tensors, an encoded vector, SHARED: in its shared area, or None: a park; ``signal``: the SIGINT/SIGTERM
        it received, -1 if its loss was not finite, 0 if neither; ``ahead``, ``waited``: see ``Push``; ``stood``:
        the seconds it stood still for its last applied push, ``measured``; ``buffers``: its model's floating-point
        buffers, ``averaged``; ``place``: its (epoch, update, position), where a replacement goes on from once the
        push is applied); returns the answers now due, to this worker or to others that waited."""
        self.measured(rank, stood)
        if ahead and (park or delta is None or ahead != self.grants.ahead[rank]):
            raise RuntimeError(f"worker {rank} ran {ahead} updates ahead of its push at update {step}, which was "
                               f"{'parked' if park or delta is None else f'set aside {self.grants.ahead[rank]}'}")
        if any(p.rank == rank for p in self.pending) or rank in self.parked:
            raise RuntimeError(f"worker {rank} pushed at update {step} while its previous push is unanswered")
        self.stop_why = self.stop_why or signal
        arrived = self.clock()
        self.grants.measure(rank, updates, arrived, waited)
        if delta is None:
            self.grants.deliver(rank, 0)
            self.parked.add(rank)
        else:
            if isinstance(delta, str) and delta == SHARED:
                delta = self.shared[rank].push
            if self.wire.compressed:
                nbytes, delta = self.wire.nbytes(delta), self.wire.received(delta, self.anchor)
            else:
                nbytes = sum(t.nbytes for t in delta)
            self.pending.append(Push(rank, step, updates, self.base[rank], delta, park, arrived, ahead, nbytes,
                                     buffers, place))
        return self._settle()

    def _settle(self) -> list[Answer]:
        answers: list[Answer] = []
        while (batch := self._next_batch()) is not None:
            answers += self._apply(batch)
        if len(self.parked) == self.workers and not self.pending:      # everyone at the consistent point
            answers += self._release()
        return answers

    def _next_batch(self) -> list[Push] | None:
        """The pushes of the next outer step (rule 1, else rule 2), or None if none may be applied yet."""
        if not self.pending:
            return None
        waiting = {p.rank for p in self.pending}
        idle = [r for r in range(self.workers) if r not in waiting and r not in self.parked]
        if not idle:
            return sorted(self.pending, key=lambda p: p.rank)
        behind = [self.base[u] for u in idle] + [push.base for push in self.pending[1:]]
        if all(self.version + 1 - base <= self.max_staleness for base in behind) \
                and not (self.hold and self.grants.back_within(idle, self.clock(), self.hold)):
            return [self.pending[0]]
        return None

    def _outer_for(self) -> OuterOptimizer:
        """Plain averaging for the run's last outer steps (nothing left to grant, no stop), as param mode ends
        (outer.py: end_of_run): the run's model is the workers' mean; else the outer optimizer."""
        return AVERAGE if self.grants.left <= 0 and not self.stop_why else self.outer

    def _apply(self, batch: list[Push]) -> list[Answer]:
        """One outer step with the batch's average; its pushes counted, then answered or parked (all of them
        parked if any passes a checkpoint's point: at S = 0 every worker must stop at the same round)."""
        self.total = self.total or [torch.empty_like(t, dtype=torch.float32) for t in self.anchor]
        mean_into(self.total, [push.delta for push in batch], self.workers)     # each push its 1/N share of a round
        momentum = self.momentum or [None] * len(self.anchor)
        outer = self._outer_for()
        for anchor, t, m in zip(self.anchor, self.total, momentum):
            outer.step(anchor, t.to(anchor.dtype), m)
        self.served = None
        before, self.version = self.version, self.version + 1
        now = self.clock()
        for push in batch:
            self.pending.remove(push)
            self._count(push)
            if push.buffers is not None and self.buffers:
                self.buffers[push.rank] = push.buffers
            if push.place is not None:
                self.places[push.rank] = push.place
            record = {"event": "outer_sync", "step": push.step, "rank": push.rank, "fragment": 0,
                      "blocked_s": 0.0 if push.ahead else now - push.arrived, "bytes": push.nbytes,
                      "staleness": before - push.base, "version": self.version,
                      "inner_updates": push.updates, "ahead": push.ahead,
                      "via": "shared memory" if push.rank in self.shared else "socket"}
            self.records.append(record)
            self.unmeasured[push.rank] = record
            self.base[push.rank] = self.version
        return self._answer(batch, now)

    def _answer(self, batch: list[Push], now: float) -> list[Answer]:
        """The applied pushes answered with their next grants, or parked; a push whose worker runs ahead is
        never parked: it is granted its window, and the worker pushes again, parked."""
        answered, ending = [], []
        for push in batch:
            if not (push.park or self.saving or self._finished()):
                answered.append(push.rank)
            elif push.ahead:
                ending.append(push.rank)
            else:
                self.parked.add(push.rank)
        buffers = self._averaged()
        answers = [(rank, self._reply(rank, grant, buffers=buffers))
                   for rank, grant in zip(answered, self._grants(answered, now))]
        answers += [(rank, self._reply(rank, self.grants.settle(rank, now), reserve=False, buffers=buffers))
                    for rank in ending]
        for push in batch:
            if push.ahead:      # its worker started this grant at its push, not at our answer
                self.grants.since[push.rank] = push.arrived
        return answers

    def _grants(self, ranks: list[int], now: float) -> list[int]:
        """The next grants of ``ranks``, answered now: nothing once the run stops; together where they are all
        the workers still taking grants (harness/collectives/grants.py), else the one alone."""
        active = set(range(self.workers)) - self.parked
        if self.stop_why or not ranks:
            return [0] * len(ranks)
        if active <= set(ranks):
            return self.grants.share_out(ranks, now)
        return [self.grants.grant(rank, now, active) for rank in ranks]

    def _count(self, push: Push) -> None:
        """The push's updates counted; the points they pass (a validation, a checkpoint) made due."""
        before = self.applied
        self.grants.deliver(push.rank, push.updates, ahead=bool(push.ahead))
        after = self.applied
        if after < self.plan.budget:        # the end validates and saves anyway
            if passes(before, after, self.plan.validate_every):
                self.validator = self.grants.fastest(otherwise=push.rank)
            # not with fewer updates left than workers: at the release each must be granted one
            self.saving = self.saving or self.plan.saves and self.grants.left >= self.workers \
                and any(passes(before, after, every) for every in self.plan.save_every)

    def _finished(self) -> bool:
        """Whether no more updates will be granted: the budget is spent, or the run stops."""
        return bool(self.stop_why) or self.grants.left <= 0

    def _release(self, kept: bool = False) -> list[Answer]:
        """Every worker answered at a consistent point, with the same anchor and version: ``save`` if a
        checkpoint is due, or the run ends with something new to save (then rank 0, which writes it, gets the
        server's state too), and at the run's end the fastest worker asked to validate the final anchor.
        Compressed pulls (wire.py) send the anchor whole at the join of a new run and once the budget is spent
        (the run's end, with or without a stop in its last round), else its change as any answer does, so that a
        stop's release is no different from the answer an uninterrupted run gets there; ``kept``: a resumed run's
        join, whose workers keep the anchors they saved."""
        finished = self._finished()
        save = self.plan.saves and (self.saving or finished and self.stop_why != -1 and self.applied != self.saved)
        if save:
            self.saved, self.parts = self.applied, {}
        self.ended = finished
        if finished and not self.stop_why:
            self.validator = self.grants.fastest(otherwise=0)
        self.parked, self.saving = set(), False
        self.base = [self.version] * self.workers
        now = self.clock()
        ranks = list(range(self.workers))
        whole = not self.views or self.grants.left <= 0
        if save:        # before the grants below: what every worker has run; goes with the workers' parts
            self.at_save = self.state()
        buffers = self._averaged()
        return [(r, {**self._reply(r, grant, whole=whole, kept=kept, buffers=buffers), "parked": True, "save": save,
                     "final": finished})
                for r, grant in zip(ranks, self._grants(ranks, now))]

    def _reply(self, rank: int, grant: int, reserve: bool = True, whole: bool = False,
               kept: bool = False, buffers: list[torch.Tensor] | None = None) -> dict[str, Any]:
        """The anchor (``_anchor_for``) and version, the worker's next grant, whether it is to validate that
        anchor, (``reserve``, --outer-delay) the updates it may run past its next push before it takes
        that push's answer, and the floating-point ``buffers`` it is to hold (``_averaged``)."""
        if buffers is not None:
            self.buffers[rank] = buffers
        validate = self.validator == rank
        if validate:
            self.validator = None
        ahead = self.grants.reserve(rank, self.ahead) if reserve and grant and not self._finished() else 0
        placed = {"place": self.places[rank]} if rank in self.placing else {}
        self.placing.discard(rank)
        return {**self._anchor_for(rank, whole or bool(placed), kept), "version": self.version, "grant": grant,
                "updates": self.applied, "validate": validate, "stop_why": self.stop_why, "parked": False,
                "save": False, "final": False, "ahead": ahead, "buffers": buffers, "generation": self.generation,
                **placed}

    def _averaged(self) -> list[torch.Tensor] | None:
        """The floating-point buffers (BatchNorm statistics) every worker is answered with: the mean of those the
        workers hold, each as it last pushed them or was answered, summed in rank order and divided by N (param
        mode's all-reduce); where every worker holds the same ones already, those very tensors. None: the model
        has none."""
        if not self.buffers:
            return None
        first = self.buffers[0]
        if all(held is first for held in self.buffers):
            return first
        return mean_into([torch.empty_like(t) for t in first], self.buffers, self.workers)

    def _anchor_for(self, rank: int, whole: bool, kept: bool = False) -> dict[str, Any]:
        """``anchor``: a copy of the anchor (the server goes on updating its own), at fp32 and where ``whole``;
        else ``change``: the change since the anchor the worker holds, encoded (wire.py), or None (``kept``)."""
        if not self.wire.compressed or whole:
            if self.wire.compressed:
                self.views = self.views or [[] for _ in range(self.workers)]
                self.views[rank] = [t.clone() for t in self.anchor]
            if rank in self.shared:
                for area, t in zip(self.shared[rank].pull, self.anchor):
                    area.copy_(t)
                return {"anchor": SHARED}
            if self.served is None:     # one copy for every answer of this version (they are sent as it is)
                self.served = [t.clone() for t in self.anchor]
            return {"anchor": self.served}
        if kept:
            return {"change": None}
        view = self.views[rank]
        change = self.wire.send([a - v for a, v in zip(self.anchor, view)])
        for v, d in zip(view, self.wire.received(change, view)):
            v.add_(d)
        return {"change": change}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the server, taken at a consistent point (a resumed run's join hands it back): the
        anchor, the outer momentum, the version, the updates each worker has run (the budget spent) and their
        measured rates (a resumed run grants by them from its first round)."""
        return {"anchor": [t.clone() for t in self.anchor], "version": self.version, "updates": list(self.grants.given),
                "rates": list(self.grants.rates),
                "momentum": [t.clone() for t in self.momentum] if self.momentum is not None else None}

    def report(self, rank: int, record: dict) -> list[Answer]:
        """A worker's record (a validation, a bad sample), stamped with the server's clock (the parent's), for
        metrics.jsonl. Not answered: the worker sends it without waiting (``ctx.ask``), also while its push's
        answer is out. A bad sample that brings the run past --max-bad-samples stops it: the next pushes park."""
        self.records.append({**record, "time": time.time(), "rank": rank})
        if self.past_bad_limit(record):
            self.stop_why = self.stop_why or BAD_SAMPLES
        return []

    def measured(self, rank: int, stood: float | None) -> list[Answer]:
        """Worker ``rank`` stood still ``stood`` seconds for its last applied push (None: not measured), which
        that push's record says; any message of the worker's after that push ends the record's wait for it."""
        record = self.unmeasured.pop(rank, None)
        if record is not None and stood is not None:
            record["blocked_s"] = stood
        return []

    def handle(self, rank: int, request: tuple[str, Any]) -> list[Answer]:
        """``ctx.request("server", request)`` in the parent (``Children.serve``, on the thread that reads the
        socket): ("join", state), ("rejoin", state), ("push", {"step", "updates", "delta", "park", "signal", "ahead",
        "waited", "stood", "buffers", "place"}), ("report", record), ("stood", seconds) or ("part", part). What a
        dead worker sent that is read after its death (``lose``) is ignored."""
        with self.lock:
            if rank in self.lost and request[0] != "rejoin":
                return []
            return self._handle(rank, request)

    def _handle(self, rank: int, request: tuple[str, Any]) -> list[Answer]:
        kind, body = request
        if kind == "join":
            return self.join(rank, body)
        if kind == "rejoin":
            return self.rejoin(rank, body)
        if kind == "part":
            return self.part(rank, body)
        if kind == "push":
            return self.push(rank, **body)
        if kind == "report":
            return self.report(rank, body)
        if kind == "stood":
            return self.measured(rank, body)
        raise ValueError(f"request {kind!r}: the parameter server answers join, rejoin, push, report, stood and part")

    def checkpoints(self) -> list[list[dict]]:
        """The checkpoints whose parts are all in since the last call, each a list of parts in rank order."""
        with self.lock:
            gathered, self.gathered = self.gathered, []
            return gathered

    def drain(self, everything: bool = False) -> list[dict]:
        """The records since the last drain (the parent's main thread writes them), up to the first whose worker
        has not sent what it measured (``everything``: all of them, at the run's end); a replacement's "healed" record
        at once, ahead of those (the parent's heal ends with it, and a failure before that is not healed in place)."""
        with self.lock:     # the socket's thread adds records and measures while the main thread drains
            waiting = {id(record) for record in self.unmeasured.values()} if not everything else set()
            drained, self.healed = self.healed, []
            while self.records and id(self.records[0]) not in waiting:
                drained.append(self.records.popleft())
            return drained
