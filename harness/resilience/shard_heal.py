"""Healing in place with --zero: a dead rank's shard comes back from its replica on the next rank.

With --zero no rank holds the whole optimizer state, so the replicas' hand-over (heal.py: the donor
broadcasts everything) has nothing whole to give. Instead each rank keeps a replica of its
predecessor's shard, stepped beside its own (harness/collectives/shards.py, ``Replica``), and the
replacement for dead rank d is given
- its shard's optimizer state by rank d + 1, from that rank's replica,
- its replica (of rank d - 1's shard) by rank d - 1, from that rank's own optimizer,
- the parameters by their owners, bucket by bucket: each rank broadcasts its own pieces, and rank
  d + 1 broadcasts d's from its replica's own copy of them (its flat buffer's range of d's shard is what
  an interrupted all-gather left there), and every rank's replica then takes its copy from the result.
  That is also the all-gather the last update's pieces were waiting for (the next update's forward).

Where the interrupted update stood: a rank reports its place and whether its optimizers stepped on an
update the loop had not counted yet (``applied``). The update's last collectives before the step are
all-reduces every rank enters only once its replica holds its predecessor's gradients, so if any rank
stepped (applied, or counted an update another survivor has not), every rank got that far, the dead one
included: its shard's replica stepped too. A sharded optimizer cannot go back, so the group goes on from the
last update any survivor applied: where one stepped on an update another had not counted, the ranks ready
for it step now, and every rank, the replacement too, first finishes that update (counts it, then the stop
vote, validation, a save, an epoch's end: what follows an update); else it goes on from the survivors'
common place, redoing an update none stepped on. A survivor an update behind the others and not ready for
it cannot be taken forward, and the heal is refused with an error that says to resume from the last
checkpoint; so are two replaced ranks (the parent heals one at a time anyway).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.collectives.flat import FlatParameters
from harness.collectives.shards import Replica, ShardLayout

from .heal import Where, broadcast_optimizer


@dataclass
class Progress:
    """How far a rank got in the update a death interrupted (ShardedGradients' flags): ``ready``, it had all
    its optimizers need to step; ``applied``, they stepped, and only the loop's count was left."""
    ready: bool
    applied: bool


class ShardHealRefused(RuntimeError):
    """The survivors cannot rebuild the dead rank's shard exactly (see the module's docstring)."""


def hand_over_shards(ctx: Any, comm: Any, flat: FlatParameters, layout: ShardLayout, optimizer: torch.optim.Optimizer,
                     replica: Replica, where: Where | None, progress: Progress | None) -> tuple[Where, dict]:
    """Collective on every rank of the new generation; ``where`` and ``progress`` are None on the
    replacement. Returns (where the group goes on from, a summary for the log; its ``finishing``: the
    group first finishes the update at that place, ``agreed_place``)."""
    reports = ctx.exchange(ctx.unique_tag("shard-heal"), (where, progress))
    place, finishing, catching_up = agreed_place(reports)
    if ctx.rank in catching_up:         # ready for the update the others stepped on: step now
        optimizer.step()
        replica.optimizer.step()
    (d,) = [rank for rank, (report, _) in enumerate(reports) if report is None]
    survivors = [rank for rank in range(comm.size) if rank != d]
    after, before = (d + 1) % comm.size, (d - 1) % comm.size
    gather_owned(comm, layout, replica.layout, d)
    replica.layout.take_parameters()
    for tensor in flat.buffers:
        comm.broadcast(tensor, root=survivors[0])
    broadcast_optimizer(ctx, comm, replica.optimizer if ctx.rank == after else optimizer, after, {d})
    broadcast_optimizer(ctx, comm, optimizer if ctx.rank == before else replica.optimizer, before, {d})
    return place, {"donor": after, "steps": [None if p is None else p.step for p, _ in reports], "steps_lost": 0,
                   "finishing": finishing}


def agreed_place(reports: list[tuple[Where | None, Progress | None]]) -> tuple[Where, bool, set[int]]:
    """Where the group goes on from, given every rank's (place, progress) (None, None on the replacement);
    whether it first finishes the update there: counts it and does what follows an update (the stop
    vote, validation, a save, an epoch's end); and which ranks step on that update first. That is so where a
    survivor stepped on an update another had not counted (a death inside the last all-reduces before the
    step, which some ranks finished and others did not, with three ranks or more): the survivors that were
    ready for it and had not stepped step now, and a survivor that had counted it (and failed in what
    followed, or in the next update's all-gather) goes back to before its count, to do that again with the
    others, without stepping again. Raises ShardHealRefused unless exactly one rank is
    new and the survivors then stand at the same update (see the module's docstring)."""
    dead = [rank for rank, (place, _) in enumerate(reports) if place is None]
    if len(dead) != 1:
        raise ShardHealRefused(f"--zero heals one dead worker at a time, and ranks {dead} were replaced together; "
                               "resume from the last checkpoint (--resume)")
    survivors = {rank: report for rank, report in enumerate(reports) if rank not in dead}
    stepped = any(done.applied for _, done in survivors.values()) or \
        len({place.step for place, _ in survivors.values()}) > 1
    stepping = {rank: done.applied or (stepped and done.ready) for rank, (_, done) in survivors.items()}
    applied = {rank: place.step + stepping[rank] for rank, (place, _) in survivors.items()}
    last = max(applied.values())
    behind = [rank for rank, step in applied.items() if step < last]
    if behind:
        raise ShardHealRefused(f"ranks {behind} had not applied update {last} when the others had, and a sharded "
                               "optimizer cannot go back; resume from the last checkpoint (--resume)")
    finishing = [survivors[rank][0] for rank, step in stepping.items() if step]
    catching_up = {rank for rank, (_, done) in survivors.items() if stepping[rank] and not done.applied}
    return (finishing[0], True, catching_up) if finishing else (next(iter(survivors.values()))[0], False, set())


def gather_owned(comm: Any, layout: ShardLayout, replica: ShardLayout, dead: int) -> None:
    """Every piece of the flat parameters from its owner; the dead rank's from its successor's ``replica``."""
    successor = (dead + 1) % comm.size
    for index, bucket in enumerate(layout.buckets):
        for owner in range(comm.size):
            first, last = bucket.owned(owner)
            if last <= first:
                continue
            target = bucket.segment.params[first:last]
            if owner != dead:
                comm.broadcast(target, root=owner)
            elif comm.rank != successor:
                comm.broadcast(target, root=successor)
            else:
                kept = replica.piece_of(index).detach()
                comm.broadcast(kept, root=successor)
                target.copy_(kept)
