"""DiLoCo on parameter mode: an outer optimizer over the flat parameters, streamed in fragments,
overlapped with the inner steps and compressed.

Every worker keeps the parameters of the last synchronisation, the *anchor*. Each worker trains on
its own (the inner steps, its own optimizer state) and every K updates (``--avg-every``) sends the
*pseudo-gradient* ``anchor - parameters``; the ranks average it, and the outer optimizer updates the
anchor with that average, identically on every rank, which every worker then continues from:

    average:  anchor -= lr * delta                                  (lr 1: plain parameter averaging)
    nesterov: m = momentum * m + delta;  anchor -= lr * (delta + momentum * m)     (DiLoCo: 0.7, 0.9)

Streaming (``fragments`` F, ``delay`` D): the flat buffers are cut into F fragments (slice f of each
buffer), whose syncs are staggered over the K updates (fragment f at the updates ``f*K/F`` mod K), so
the link carries a 1/F of the model at a time. A fragment's exchange is launched asynchronously and
applied D updates later, so the inner steps never wait for the link unless it is slower than D updates; the
fragment's parameters then become half their own, half the new anchor (Streaming DiLoCo's mixing, alpha 0.5).
Moved to the new anchor plus all the local progress made since the launch instead, streaming ended 1.9% behind
DiLoCo's loss on the slow-link bench; mixed, 0.04% (bench/results/2026-11-27-cpu2-slow-link-final-average).

Compression (``codec``, harness/collectives/compress.py): bf16, fp16 or int8 deltas, with error
feedback: what rounding took from a delta (``residual``) is added to the next one, so nothing is lost,
only late. Floating-point buffers (BatchNorm statistics) are averaged when fragment 0 is launched.

What a checkpoint needs for an exact resume is per rank (each worker's parameters and inner optimizer
state differ between syncs, and so do the residuals): ``state_dict()`` gives this rank's, on the host,
the anchor and momentum (the same on every rank) included, and exchanges still in flight waited for
(the worker adds its inner optimizer's state).
Validation and the checkpoint's model are the anchor (``global_weights``), the model the run agrees on. The
run's last sync is a plain average (``end_of_run``), so the run ends on the replicas' mean; the anchors validated
before it are ahead of the replicas by the outer momentum's step, and validate worse than their mean would.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .base import Communicator
from .compress import Codec, encode_with_feedback
from .flat import FlatParameters
from .sync import Synchroniser


@dataclass
class OuterOptimizer:
    """``kind`` average or nesterov, with its learning rate and momentum."""
    kind: str = "nesterov"
    lr: float = 0.7
    momentum: float = 0.9

    def step(self, anchor: torch.Tensor, delta: torch.Tensor, momentum: torch.Tensor | None) -> None:
        """One outer step on ``anchor``; ``delta`` is the caller's scratch, overwritten (a model's size of memory
        not allocated: on a parameter server's CPU, allocating is what an outer step costs most)."""
        if self.kind == "nesterov":
            momentum.mul_(self.momentum).add_(delta)
            delta.add_(momentum, alpha=self.momentum)
        anchor.sub_(delta, alpha=self.lr)


AVERAGE = OuterOptimizer("average", lr=1.0)     # the outer step that makes the anchor the replicas' mean
MIX = 0.5       # a late exchange's fragment: this much of the replica's own parameters, the rest the new anchor


def land(param: torch.Tensor, anchor: torch.Tensor, late: bool) -> None:
    """A replica's parameters after an outer step: the new anchor, or where the exchange landed after local updates
    (``late``: streaming's delayed fragments, async's answers taken late) ``MIX`` of their own, the rest the anchor."""
    if late:
        param.mul_(MIX).add_(anchor, alpha=1 - MIX)
    else:
        param.copy_(anchor)


@dataclass
class _Exchange:
    """A fragment's pseudo-gradient on its way: launched after update ``launched``, applied after ``apply_at``."""
    fragment: int
    launched: int
    apply_at: int
    finish: Callable[[], torch.Tensor]
    nbytes: int
    outer: OuterOptimizer
    result: torch.Tensor | None = None

    def average(self) -> torch.Tensor:
        if self.result is None:
            self.result = self.finish()
        return self.result


def host(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """Copies of ``tensors`` on the host, as a checkpoint keeps them (None stays None)."""
    return None if tensors is None else [t.detach().to("cpu", copy=True) for t in tensors]


@contextlib.contextmanager
def anchored(flat: FlatParameters, anchor: list[torch.Tensor]) -> Iterator[None]:
    """``anchor`` in the flat parameters for the block (the model the run agrees on), then this rank's own back."""
    local = [p.clone() for p in flat.params]
    for param, value in zip(flat.params, anchor):
        param.copy_(value)
    try:
        yield
    finally:
        for param, mine in zip(flat.params, local):
            param.copy_(mine)


def fragment_slices(sizes: list[int], fragments: int) -> list[list[tuple[int, int, int]]]:
    """For each fragment, its (buffer, start, stop) in each of the buffers of ``sizes``: slice f of F
    near-equal slices of every buffer."""
    return [[(b, size * f // fragments, size * (f + 1) // fragments) for b, size in enumerate(sizes)]
            for f in range(fragments)]


class OuterSynchroniser(Synchroniser):
    """Parameter mode with an outer optimizer (see the module's docstring). ``every``: K; ``report``: called
    with each applied sync's "outer_sync" record (rank 0), or None."""

    def __init__(self, comm: Communicator, flat: FlatParameters, every: int, outer: OuterOptimizer, codec: Codec,
                 fragments: int = 1, delay: int = 0,
                 report: Callable[[dict], None] | None = None):
        super().__init__(comm, flat)
        if not 1 <= fragments <= every or not 0 <= delay < max(1, every // fragments):
            raise ValueError(f"fragments={fragments}, delay={delay} with every={every}: need 1 <= fragments <= every "
                             "and 0 <= delay < every / fragments (a fragment's exchange lands before its next one)")
        self.every, self.outer, self.codec = every, outer, codec
        self.delay, self.report = delay, report
        self.slices = fragment_slices([t.numel() for t in flat.params], fragments)
        self.offsets = [f * every // fragments for f in range(fragments)]
        self.anchor = [t.detach().clone() for t in flat.params]
        self.momentum = [torch.zeros_like(t) for t in flat.params] if outer.kind == "nesterov" else None
        self.residual = [torch.zeros_like(t, dtype=torch.float32) for t in flat.params]
        self.pending: list[_Exchange] = []
        self.launched = [0] * fragments         # the update each fragment was last sent after
        self.last: int | None = None            # the update the run ends after (``ends_after``)

    def start(self) -> None:
        super().start()
        for anchor, param in zip(self.anchor, self.flat.params):
            anchor.copy_(param)

    def ends_after(self, total: int) -> None:
        self.last = total

    def after_step(self, step: int) -> None:
        for exchange in [e for e in self.pending if e.apply_at == step]:
            self._apply(exchange, step)
        if step == self.last:       # end_of_run syncs every fragment
            return
        for fragment, offset in enumerate(self.offsets):
            if step % self.every == offset:
                self._launch(fragment, step)

    def end_of_run(self, step: int) -> None:
        """The run's last update: every exchange in flight applied, then every fragment synced by plain averaging,
        so that every rank ends on the replicas' mean. An outer step with momentum carries the anchor ahead of
        the replicas, for them to train on from there; the run's model is their mean (DiLoCo's validation loss
        at the end of the slow-link bench's 4000 updates: 1.3461, against 1.3779 after a last Nesterov step;
        streaming's, whose fragments all end mid-round, 1.4004 when they took one)."""
        for exchange in list(self.pending):
            self._apply(exchange, step)
        for fragment in range(len(self.slices)):
            if self.launched[fragment] != step:     # one sent after this very update has nothing new to send
                self._launch(fragment, step, delay=0, outer=AVERAGE)

    def _views(self, tensors: list[torch.Tensor], fragment: int) -> list[torch.Tensor]:
        return [tensors[b][start:stop] for b, start, stop in self.slices[fragment]]

    def _launch(self, fragment: int, step: int, delay: int | None = None, outer: OuterOptimizer | None = None) -> None:
        delay = self.delay if delay is None else delay
        self.launched[fragment] = step
        params, anchor = self._views(self.flat.params, fragment), self._views(self.anchor, fragment)
        residual = self._views(self.residual, fragment)
        payload = encode_with_feedback(self.codec, [a - p for a, p in zip(anchor, params)], residual)
        if fragment == 0:
            for buffer in self.flat.buffers:
                self.comm.all_reduce(buffer, op="avg")
        exchange = _Exchange(fragment, step, step + delay, self.codec.exchange(self.comm, payload),
                             self.codec.nbytes(payload), outer or self.outer)
        self.pending.append(exchange)
        if not delay:
            self._apply(exchange, step)

    def _apply(self, exchange: _Exchange, step: int) -> None:
        """The outer step on the fragment's anchor, and the parameters moved to it (when the exchange was in
        flight, half way: ``MIX``)."""
        began = time.monotonic()
        average = exchange.average()
        blocked = time.monotonic() - began
        self.pending.remove(exchange)
        fragment = exchange.fragment
        momentum = self._views(self.momentum, fragment) if self.momentum is not None else [None] * len(self.slices[fragment])
        offset = 0
        for i, (anchor, param) in enumerate(zip(self._views(self.anchor, fragment), self._views(self.flat.params, fragment))):
            delta = average[offset:offset + anchor.numel()].to(anchor.dtype)
            offset += anchor.numel()
            exchange.outer.step(anchor, delta, momentum[i])
            land(param, anchor, late=exchange.launched != step)
        if self.report is not None:
            self.report({"event": "outer_sync", "step": step, "launched": exchange.launched, "fragment": fragment,
                         "blocked_s": blocked, "bytes": exchange.nbytes, "staleness": 0})

    def global_weights(self) -> contextlib.AbstractContextManager:
        """The anchor in the model's parameters, for evaluation or a checkpoint's model; then back."""
        return anchored(self.flat, self.anchor)

    def kept_through_heal(self) -> dict[str, Any]:
        """The outer state (harness/resilience/heal.py: hand_over_anchor); exchanges in flight are not kept: the
        communicator that carried them is gone."""
        return {"anchor": self.anchor, "momentum": self.momentum, "residual": self.residual}

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint, on the host (exchanges in flight waited for, not applied)."""
        return {"params": host(self.flat.params), "anchor": host(self.anchor), "momentum": host(self.momentum),
                "residual": host(self.residual),
                "pending": [(e.fragment, e.launched, e.apply_at, e.average().to("cpu", copy=True), e.nbytes)
                            for e in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pairs = [(self.flat.params, state["params"]), (self.anchor, state["anchor"]), (self.residual, state["residual"])]
        if self.momentum is not None:
            pairs.append((self.momentum, state["momentum"]))
        for mine, saved in pairs:
            for t, value in zip(mine, saved):
                t.copy_(value)
        device = self.anchor[0].device
        # (fragment, launched, apply_at, average, [snapshot at launch: checkpoints of before the mixing,] nbytes)
        self.pending = [_Exchange(f, launched, at, lambda: None, nbytes, self.outer, result.to(device, copy=True))
                        for f, launched, at, result, *_, nbytes in state["pending"]]

