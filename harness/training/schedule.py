"""Learning-rate schedules: the learning rate as a function of the update, as in nanoGPT.

A function of the step and nothing else, so a resumed run continues the schedule exactly. Every
schedule but ``constant`` decays from ``lr`` to ``min_lr`` over the updates after the warm-up:

- ``constant``: ``lr`` throughout;
- ``cosine``: half a cosine from ``lr`` down to ``min_lr`` (nanoGPT's);
- ``linear``: a straight line from ``lr`` down to ``min_lr``;
- ``step``: ``lr``, then a tenth of it after a third of the decay, a hundredth after two thirds
  (the PyTorch ImageNet example's 30/60/90 epochs), never below ``min_lr``.

Warm-up (any schedule): the first ``warmup`` updates rise linearly to ``lr``, update s (0-based)
at ``lr * (s + 1) / (warmup + 1)``, nanoGPT's formula.
"""
from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear", "step")


def learning_rate(step: int, lr: float, schedule: str = "constant", total: int = 1, warmup: int = 0,
                  min_lr: float = 0.0) -> float:
    """The learning rate of update ``step`` (0-based) of ``total``."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    if schedule == "linear":
        return min_lr + (1.0 - progress) * (lr - min_lr)
    if schedule == "step":
        return max(min_lr, lr * 0.1 ** min(2, int(progress * 3)))
    raise ValueError(f"unknown --lr-schedule '{schedule}'; valid: {', '.join(SCHEDULES)}")


def is_constant(schedule: str, warmup: int) -> bool:
    """True when the learning rate never changes (a CUDA graph may then bake it in)."""
    return schedule == "constant" and warmup == 0
