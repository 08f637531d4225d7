"""An epoch's training loss and time, as its "epoch" record reports them, over the whole epoch.

A run stopped mid-epoch resumes in another process. So the sums are kept here, not in the loop's locals, and
a checkpoint written mid-epoch carries the group's sums so far (harness/resilience/heal.py's ``Where.so_far``):
the resumed lead adds them to its own, and the epoch's all-reduce then counts every update of the epoch once,
whichever process trained it. A heal starts the sums afresh (loop_heal.py): the group may go back to an
earlier update (a GPU worker's rewind, DiLoCo's anchor), which running sums would count twice, so an epoch
healed in its course reports the updates from the heal on.
"""
from __future__ import annotations

import time
from typing import Any

import torch

NOTHING_YET = (0.0, 0, 0.0)     # (loss sum, updates, seconds): an epoch's start


class EpochLoss:
    """This rank's loss sum and update count over the current epoch (on the device: no synchronisation an
    update), and the seconds the epoch has taken. ``carried``: what a checkpoint had counted of the epoch
    (the group's; given to one rank only, as the all-reduce sums every rank's)."""

    def __init__(self, device: torch.device, carried: tuple[float, int, float] = NOTHING_YET):
        self.loss = torch.tensor(float(carried[0]), dtype=torch.float64, device=device)
        self.updates = int(carried[1])
        self.before, self.started = carried[2], time.monotonic()

    def begin(self) -> None:
        """The epoch's clock from now (what was carried kept): a worker's start-up is not its epoch's time."""
        self.started = time.monotonic()

    def add(self, loss: torch.Tensor) -> None:
        self.loss += loss.double()
        self.updates += 1

    def group(self, comm: Any) -> tuple[float, int, float]:
        """(every rank's loss sum, every rank's updates, this rank's seconds) so far: one all-reduce, which every
        rank makes at the same point (an epoch's end, a save)."""
        totals = torch.stack([self.loss, torch.tensor(float(self.updates), dtype=torch.float64,
                                                      device=self.loss.device)])
        comm.all_reduce(totals)
        loss, updates = totals.tolist()
        return loss, int(updates), self.before + time.monotonic() - self.started
