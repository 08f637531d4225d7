"""Dynamic loss scaling for ``--amp fp16``, on the flat gradient buffers.

float16 has 5 exponent bits: gradients below about 6e-8 flush to zero and above 65504 overflow. So
the loss is multiplied by a scale (2**16 to start) before backward, and the gradients are divided by
it once they are averaged, before clipping and the optimizer. Where the scale was too high some
gradient is inf or NaN: that update is skipped and the scale halved; after ``GROWTH_INTERVAL``
clean updates in a row it doubles, so it stays just below overflow (torch's GradScaler's policy and
defaults).

What it costs here: one kernel over FlatParameters' few buffers that unscales them and sets a
found-inf flag (``torch._amp_foreach_non_finite_check_and_unscale_``), and one that updates the scale
(``torch._amp_update_scale_``). The scale, its counters and the flag are device tensors, and a fused
optimizer skips its step where ``optimizer.found_inf`` is nonzero: no host synchronisation, so the
whole-step CUDA graph captures all of it. Non-fused optimizers would apply the step anyway, so
--amp fp16 refuses them (harness/training/checks.py).

A GPU worker that heals guards each update with a heal ``Ticket`` (harness/resilience/heal.py),
which uses the same flag: the optimizer then skips where either says so, and an attempt the ticket
voids (a peer died during it; the heal redoes it) leaves the scale as it was.

What a skipped update is not: divergence. The stop vote (harness/resilience/interrupt.py) looks at
the unscaled loss, which an overflow of the scaled gradients leaves finite, and the parameters stay
finite because the update is not applied. A loss that is itself inf or NaN still stops the run: no
scale makes a forward pass finite.

bf16 (--amp bf16) has float32's exponent range and needs none of this: it stays the choice on GPUs
that have it (A100, H100 and later); fp16 is for those that do not (V100, T4).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from harness.training.optim import zero_momentum

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000          # clean updates in a row before the scale doubles
GROWTH, BACKOFF = 2.0, 0.5


class LossScaler:
    """The scale and its counters, as device tensors. ``bind(optimizer)`` once the optimizer's skip
    flag is settled (after a heal Ticket, if any), ``scaled(loss)`` before backward, ``unscale_(grads)``
    after the gradients are averaged and before clipping, ``update()`` just before the optimizer's step.
    ``interval``: clean updates before it grows."""

    def __init__(self, device: torch.device, scale: float = INITIAL_SCALE, interval: int = GROWTH_INTERVAL):
        self.interval = interval
        self.scale = torch.full((), scale, dtype=torch.float32, device=device)
        self.clean = torch.zeros((), dtype=torch.int32, device=device)       # clean updates in a row
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)     # updates skipped, in all
        # 0-d float32, as fused optimizers want it: nonzero where this update's gradients overflowed.
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self._inverse = torch.ones((), dtype=torch.float32, device=device)
        self._void: torch.Tensor | None = None      # a heal Ticket's flag: this attempt does not count

    def bind(self, *optimizers: torch.optim.Optimizer) -> None:
        """Make ``optimizers`` (fused ones; the first, the rank's own, then --zero's replica) skip an
        overflowing update. A flag the first already has, a heal Ticket's, stays its flag and becomes the
        others': ``update`` raises it on overflow too."""
        flag = getattr(optimizers[0], "found_inf", None)
        self._void = flag if flag is not None and flag is not self.found_inf else None
        for optimizer in optimizers:
            optimizer.found_inf = self.found_inf if self._void is None else self._void
            zero_momentum(optimizer)        # a skipped first step must not leave its momentum uninitialised

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, grads: list[torch.Tensor], combine: Callable[[torch.Tensor, str], None] | None = None) -> None:
        """Divide the flat gradients by the scale and flag an overflow; ``update()`` then moves the scale
        (after a heal Ticket's punch, if any). Issues device work only. ``combine``: where ``grads`` are
        this rank's shards (--zero), the flag is made the group's (max), so that every rank skips alike."""
        self.found_inf.zero_()
        torch.reciprocal(self.scale, out=self._inverse)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self._inverse)
        if combine is not None:
            combine(self.found_inf, "max")

    def update(self) -> None:
        """Move the scale on this update's overflow flag, just before the optimizers step: an overflow
        halves it, a clean update counts towards growth; an attempt a heal Ticket voided leaves it as it was,
        and the optimizers skip where either flag says so."""
        if self._void is None:
            self._update()
            return
        kept = [t.clone() for t in self._state()]
        self._update()
        for t, before in zip(self._state(), kept):
            torch.where(self._void.bool(), before, t, out=t)
        torch.maximum(self._void, self.found_inf, out=self._void)

    def _update(self) -> None:
        self.skipped.add_(self.found_inf.to(torch.int64))
        torch._amp_update_scale_(self.scale, self.clean, self.found_inf, GROWTH, BACKOFF, self.interval)

    def _state(self) -> tuple[torch.Tensor, ...]:
        return self.scale, self.clean, self.skipped

    def report(self) -> dict[str, Any]:
        """What a "step" record carries (reading it waits for the device)."""
        return {"loss_scale": self.scale.item(), "skipped_updates": int(self.skipped.item())}

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers, as a checkpoint stores them (reading them waits for the device)."""
        return {"scale": self.scale.item(), "clean": int(self.clean.item()), "skipped": int(self.skipped.item())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """In place: a CUDA graph holds these tensors' addresses."""
        for t, key in zip(self._state(), ("scale", "clean", "skipped")):
            t.fill_(state[key])

    def share(self, comm: Any, root: int) -> None:
        """Every rank takes ``root``'s state (a heal's donor's): replicas must scale alike, since their
        scaled gradients are averaged."""
        carrier = torch.stack([t.double() for t in self._state()])
        comm.broadcast(carrier, root=root)
        for t, value in zip(self._state(), carrier):
            t.copy_(value)
