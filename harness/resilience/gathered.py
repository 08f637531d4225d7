"""The parent writes an async run's checkpoints from the parts its workers send (``--mode async``).

In the other modes rank 0 writes each checkpoint, after an exchange that hands it every rank's part (its
generators, its own state). Async workers share no collective, so there each worker sends its part to the
parameter server (harness/collectives/server.py: ``part``) and goes on training; once every worker's part of
a checkpoint is in, the parent writes it here, in the background. No worker waits for another, so a worker that
dies while the others save is healed in place like any other (an exchange would have left them waiting for its
part), and no rank receives every other rank's state: the parts travel once, to the parent. A checkpoint whose
part a dead worker never sent is not written; the next one is.
"""
from __future__ import annotations

import collections
import os

from .checkpoint import layout
from .saver import BackgroundSaver

EXTRA = ("rng", "loss_scale", "checkpoint")     # what a part carries besides the rank's own state ("ranks")


class GatheredCheckpoints:
    """Args:
        path: the checkpoint's file (--save)."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self.saver = BackgroundSaver(copy=False)        # the parts came over the socket: nobody else holds them
        self.written: collections.deque[dict] = collections.deque()     # "saved" records, from the saver's thread

    def write(self, parts: list[dict]) -> None:
        """Every worker's part, in rank order; rank 0's carries ``checkpoint``: the model (the anchor), where it
        stands and the run's config."""
        head = parts[0]["checkpoint"]
        ranks = [{k: v for k, v in part.items() if k not in EXTRA} for part in parts]
        scales = [part["loss_scale"] for part in parts] if parts[0]["loss_scale"] is not None else None
        state = layout(head["model"], parts[0]["optimizer"], head["where"], [part["rng"] for part in parts], scales,
                       ranks, head["config"])
        record = {"event": "saved", "epoch": head["where"].epoch, "step": head["where"].step, "path": str(self.path)}
        self.saver.save(self.path, state, done=lambda: self.written.append(record))

    def records(self, everything: bool = False) -> list[dict]:
        """The "saved" records of the checkpoints on disk since the last call (``everything``: after the last write
        has ended; its error, if any, is raised)."""
        if everything:
            self.saver.wait()
        return [self.written.popleft() for _ in range(len(self.written))]
