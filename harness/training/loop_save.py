"""A rank's part in checkpoints, mixed into the loop's ``Worker`` (harness/training/loop.py): what it restores from
one, what it writes, and what it sends instead in async mode.

Every rank takes part in a save (generators, loss scales and sharded optimizer state are gathered); rank 0
writes the file in the background (harness/resilience/saver.py) from the model the group agrees on. An async
worker shares no collective, so it sends its part to the parent, which writes the file once every part is in
(harness/resilience/gathered.py). A survivor whose dead peer's host is gone writes the run alone
(``save_alone``), for the engine's restart to resume. The layout of the file: harness/resilience/checkpoint.py.
"""
from __future__ import annotations

from typing import Any

import torch

from harness.resilience.checkpoint import layout, rng_state, set_rng_state, to_host
from harness.resilience.heal import Where
from harness.training.optim import load_optimizer_state
from harness.training.sharded_state import gather_state, load_state


class Saving:
    """The checkpoint methods of ``loop.Worker``, which holds the attributes they use."""

    def saved_place(self, saved: dict) -> tuple[int, int, int]:
        """The (epoch, update, position in the epoch) this rank resumes from: the checkpoint's, or where the
        rank's own part says it was (--mode async: each worker runs its own number of updates)."""
        mine = self.saved_ranks[self.rank % len(self.saved_ranks)] if self.saved_ranks else {}
        return tuple(mine.get("place") or (saved["epoch"], saved["step"], saved.get("position", 0)))

    def restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        if self.shards is not None:
            load_state(self.optimizer, self.shards, saved["optimizer"], self.model)
            if self.replica is not None:
                load_state(self.replica.optimizer, self.replica.layout, saved["optimizer"], self.model)
        else:
            load_optimizer_state(self.optimizer, saved["optimizer"])
        if self.scaler is not None and saved.get("loss_scale"):     # older checkpoints: the initial scale
            self.scaler.load_state_dict(saved["loss_scale"][self.rank % len(saved["loss_scale"])])
        if self.state.position:        # mid-epoch: dropout and the like go on from where the generators were
            set_rng_state(saved["rng"][self.rank], self.device)
        if self.state.position >= self.batches.steps_per_epoch:
            raise ValueError(f"--resume {self.config.resume} stopped after batch {self.state.position} of an epoch, "
                             f"but an epoch has {self.batches.steps_per_epoch} batches now; resume with the data "
                             "it was trained on")

    def save(self) -> None:
        """Every rank takes part (the replicas are made consistent, each rank's generators gathered);
        rank 0 snapshots the state and writes it in the background, and reports when it is on disk."""
        s, config = self.state, self.config
        if not config.save or s.diverged or not self.sync.ready_to_save(s.saved_at != s.step):
            return
        ticket = self.train_step.ticket
        if ticket is not None and ticket.applied() != s.step:
            raise RuntimeError(f"update {s.step} did not complete on every rank")     # a peer died: heal
        if not self.finite():
            self.diverge(f"the parameters are not finite at update {s.step}")
            return
        if self.asynchronous:       # to the parent, which writes it (harness/resilience/gathered.py): no exchange
            self.sync.save_part(self.part())
            s.saved_at = s.step
            return
        generators = self.ctx.exchange(self.ctx.unique_tag("rng"), rng_state(self.device))
        so_far = self.epoch_loss.group(self.comm)      # the epoch's loss so far, for a resume mid-epoch
        # every rank's (param mode's replicas scale apart; grad mode's alike)
        scales = self.ctx.exchange(self.ctx.unique_tag("loss-scale"), self.scaler.state_dict()) if self.scaler else None
        local = self.sync.state_dict()      # every rank's own state (param mode's outer optimizer), or None
        # to the lead alone, which writes them: an all-gather would copy every part to every rank
        ranks = None if local is None else self.ctx.gather(self.ctx.unique_tag("ranks"), self.own_part(local))
        # as an unsharded optimizer's, whatever --zero: any number of workers resumes it; in param mode the
        # lead's own part holds it already, and the file keeps it once (the same tensors, saved once)
        optimizer = gather_state(self.optimizer, self.shards, self.comm, self.model) if self.shards is not None \
            else ranks[0]["optimizer"] if ranks else self.optimizer.state_dict() if self.lead else None
        with self.sync.global_weights():    # the model the group agrees on (the snapshot is taken inside)
            if self.lead:
                self.write(s.where(so_far), optimizer, generators, scales, ranks,
                           given=("optimizer", "ranks") if ranks else ())
        s.saved_at = s.step

    def own_part(self, local: dict) -> dict:
        """This rank's own part of a checkpoint (``ranks``): its synchroniser's ``local`` state, its optimizer's and
        its place."""
        return {**local, "optimizer": to_host(self.optimizer.state_dict()), "place": self.place()}

    def part(self) -> dict:
        """--mode async: all that this worker adds to a checkpoint, for the parent to write: its own part, its
        generators and loss scale, and on rank 0 the model (the anchor), where it stands and the config."""
        part = {**self.own_part(self.sync.state_dict()), "rng": rng_state(self.device),
                "loss_scale": self.scaler.state_dict() if self.scaler is not None else None}
        if self.lead:
            with self.sync.global_weights():
                part["checkpoint"] = {"model": to_host(self.model.state_dict()),
                                      "where": self.state.where(self.epoch_loss.group(self.comm)),
                                      "config": self.config.to_dict()}
        return part

    def write(self, place: Where, optimizer: dict | None, generators: list, scales: list | None, ranks: list | None,
              given: tuple[str, ...] = (), **record: Any) -> None:
        """The checkpoint of the model as it is now, at ``place``, written to --save in the background; the "saved"
        record (with ``record``'s fields) goes to the parent once it is on disk. ``given``: the entries that are
        host copies made for this save (every rank's own part), written without another copy."""
        saved = {"event": "saved", "epoch": place.epoch, "step": place.step, "path": self.config.save, **record}
        self.saver.save(self.config.save, layout(self.model.state_dict(), optimizer, place, generators, scales, ranks,
                                                 self.config.to_dict()), done=lambda: self.ctx.send(saved), given=given)

    def finite(self, alone: bool = False) -> bool:
        """Whether every rank's parameters are finite (one all-reduce of a flag; ``alone``: this rank's only):
        the stop vote sees a diverged loss a few updates late, and a checkpoint must not be written in between."""
        bad = torch.zeros(1, dtype=torch.int32, device=self.device)
        for flat in self.flat.params:
            bad |= ~torch.isfinite(flat).all()
        if not alone:
            self.comm.all_reduce(bad, "max")
        return not bad.item()

    def save_alone(self, where: Where) -> None:
        """A dead rank's host is lost, so no replacement can start: write the run's state as this survivor holds
        it, after update ``where.step``, with no collective (grad mode without --zero: every replica holds it),
        for the engine's restart to resume. Each rank's generators are this rank's (a model that draws random
        numbers resumes with other draws than the uninterrupted run's). Sends "saved", or "not_saved" and why."""
        config = self.config
        why = "--save is empty" if not config.save else \
            f"--mode {config.mode}: each worker holds parameters of its own" if config.mode != "grad" else \
            "--zero: the dead rank's shards are not all here" if config.zero else \
            "the parameters are not finite" if not self.finite(alone=True) else None
        if why:
            self.ctx.send({"event": "not_saved", "step": where.step, "why": why})
            return
        self.write(where, self.optimizer.state_dict(), [rng_state(self.device)] * self.world,
                   [self.scaler.state_dict()] * self.world if self.scaler else None, None, salvaged=True)
        self.saver.wait()
