"""A rank's part in healing in place, mixed into the loop's ``Worker`` (harness/training/loop.py).

A collective that fails raises in the loop; ``recover`` rejoins the group's next generation and ``heal`` takes
the donor's state and place (harness/resilience/heal.py: the protocol; shard_heal.py: --zero's shards from
their replicas). A dead async worker's replacement rejoins the parameter server instead (``rejoin_server``):
async workers share no collective, so the survivors are never aborted and hand over nothing.
"""
from __future__ import annotations

import math
import time

from harness.collectives.shards import Replica, ShardLayout
from harness.control import timeline
from harness.control.errors import PeerFailed
from harness.resilience.heal import Salvage, Ticket, Where, hand_over, hand_over_anchor, rejoin, rewind
from harness.resilience.shard_heal import Progress, hand_over_shards
from harness.training.build import make_optimizer
from harness.training.epoch_loss import EpochLoss


class Healing:
    """The heal methods of ``loop.Worker``, which holds the attributes they use."""

    def make_replica(self) -> Replica:
        """The layout of the previous rank's shard and an optimizer over it (ShardedGradients keeps it
        up to date)."""
        layout = ShardLayout(self.flat, self.world, (self.rank - 1) % self.world, self.config.bucket_mb, replica=True)
        return Replica(layout, make_optimizer(self.config, layout.pieces, self.device))

    def recover(self, error: RuntimeError) -> None:
        """A collective failed: if a peer died, rejoin the group's next generation and heal from where the
        GPU really stands (a ticket's count, which may be behind the CPU's); else re-raise ``error``."""
        phases = {"failed": time.time()}
        ticket = self.train_step.ticket
        # --zero: how far the interrupted update got. The host's flags say so on CPU workers; on GPU ones the
        # host runs ahead of the device, and the ticket's count is where the optimizers stand.
        progress = None if self.replica is None else Progress(False, False) if ticket else \
            Progress(self.sync.ready, self.sync.applied)
        held = self.sync.kept_through_heal()
        self.sync.close()
        try:
            self.comm = rejoin(self.ctx, self.comm, error, forget=self.train_step.release)
        except Salvage as salvage:
            if salvage.saver == self.rank:
                self.save_alone(self.applied_place(ticket))
            raise PeerFailed(f"{error}; {salvage}") from None
        timeline.mark(phases, "rejoined")
        self.train_step, self.vote = None, None
        if self.comm is None:
            raise error
        where = self.applied_place(ticket)
        self.heal(where, phases, queued=self.state.step - where.step, progress=progress, held=held)

    def applied_place(self, ticket: Ticket | None) -> Where:
        """Where this rank stands: its count of updates, or on a GPU worker that heals, the ticket's count of those
        the device applied (it may be behind the host's)."""
        where = self.state.where()
        return rewind(where, ticket.applied(), self.batches.steps_per_epoch) if ticket is not None else where

    def rejoin_server(self) -> None:
        """--mode async, a dead worker's replacement: join the running server (harness/collectives/server.py), which
        answers with the anchor and the place of the dead worker's last applied push, and go on from there, with an
        inner optimizer afresh (the dead one's state is gone; the survivors train on and hand over nothing)."""
        self.attach(start=True)
        epoch, step, position = self.sync.predecessor
        self.state.go_to(Where(epoch, step, position, math.inf, 0), self.batches.steps_per_epoch)
        self.epoch_loss = EpochLoss(self.device)
        self.stream = None
        self.reseed(self.state.epoch, self.state.step)

    def heal(self, where: Where | None, phases: dict, queued: int | None = None,
             progress: Progress | None = None, held: dict | None = None) -> None:
        """This rank's part once the group has a replacement for a dead rank (harness/resilience/heal.py):
        take the donor's state and place, and go on from there. ``where`` is None on the replacement itself.
        ``phases``: when this rank reached each phase of the heal; ``queued``: updates it had issued past
        the last one applied; ``progress``: how far the interrupted update got (--zero); ``held``: what the
        synchroniser kept through the heal (the outer optimizer's state). The lead reports every rank's."""
        began = time.monotonic()
        if self.replica is not None:        # --zero: the dead rank's shard from its replica
            place, summary = hand_over_shards(self.ctx, self.comm, self.flat, self.shards, self.optimizer, self.replica,
                                              where, progress)
            self.finishing = summary["finishing"]
        elif self.config.outer:             # DiLoCo: back to the anchor of the last sync
            place, summary, held = hand_over_anchor(self.ctx, self.comm, self.flat, self.optimizer, where, held,
                                                    nesterov=self.config.outer_optimizer == "nesterov")
        else:
            place, summary = hand_over(self.ctx, self.comm, self.flat, self.optimizer, where,
                                       average=self.config.mode == "param")
        timeline.mark(phases, "handed_over")
        if self.scaler is not None:
            self.scaler.share(self.comm, summary["donor"])
        self.state.go_to(place, self.batches.steps_per_epoch)
        self.epoch_loss = EpochLoss(self.device)        # from the place healed to (epoch_loss.py says why)
        self.attach(start=False)
        if held is not None:
            self.sync.load_state_dict({"params": self.flat.params, **held, "pending": []})
        timeline.mark(phases, "attached")
        self.stream = None
        self.reseed(self.state.epoch, self.state.step)
        every = self.ctx.exchange("heal-phases", (phases, queued))
        if self.lead:
            self.ctx.send({"event": "healed", "step": self.state.step, "epoch": self.state.epoch,
                           "generation": self.ctx.generation, "hand_over_s": time.monotonic() - began,
                           "mode": self.config.mode, "phases": [p for p, _ in every],
                           "queued": [q for _, q in every], **summary})
