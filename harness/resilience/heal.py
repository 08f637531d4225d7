"""Healing in place: a replacement rank joins the survivors, who hand it the run's state.

In data-parallel training every replica holds the whole model, so when one worker dies the
others still have everything it had. The parent starts a replacement for the dead rank
(``Children.replace``, harness/parent.py); each rank then goes through the same steps:

1. ``rejoin``: the broken generation's communicator is released. For gloo that matters beyond
   tidiness: a peer blocked on a socket of ours is only freed (with an error, which brings it
   here too) once our process group is gone, and ``abort()`` does not close those sockets.
   Then a communicator over the new generation is opened, the replacement taking part.
2. ``hand_over``: every rank says where it stands (``Where``: epoch, updates done, position in
   the epoch) through ``ctx.exchange``. The *donor* is the survivor with the fewest updates
   done. Ranks are never more than one update apart (an update's all-reduce needs every rank),
   and a rank whose all-reduce failed has not stepped its optimizer, so the donor holds the state
   from before the interrupted update. It broadcasts its parameters, buffers and optimizer state
   to every rank, and every rank goes on from the donor's place: the interrupted update is
   redone, nothing else is lost.
3. Grad mode: the replicas were identical, so the healed run is the uninterrupted one (bit for
   bit on CPU workers), for models whose replicas keep no per-rank state: BatchNorm statistics
   are per rank between averagings, and the replacement starts from the donor's. Param mode:
   replicas differ between averagings, so every rank continues from the survivors' average.
   Randomness inside the model (dropout) is reseeded on every rank from (seed, rank, epoch, update)
   after a heal, so a model that draws random numbers does not repeat the lost rank's draws.

Only what the communicator carries is used: nothing goes through the parent but the small
``Where`` records and the optimizer state's layout.

GPU workers need one thing more (``Ticket``). NCCL collectives are asynchronous: when a peer
dies, the kernels queued behind an aborted all-reduce still run, the optimizer's step among them,
on a gradient averaged only in part, and the CPU may be several updates ahead of the GPU by then.
So each update's collectives end with a one-element all-reduce, the ticket, to which every rank
adds the number of this attempt (a counter on the GPU that every update, applied or not, moves on).
Only a sum of world size × attempt says that every rank reached it, and only then does the update
apply: a fused optimizer skips its step where ``found_inf`` (the flag AMP's grad scaler uses) is
nonzero. Why not simply add 1 and compare with the world size: a stopped collective's output is
undefined, and in practice it is a stale value that looks right, an earlier sum (measured on
2 × H200: the aborted tickets of steps 20-22 read 2, 2, 2 where every rank adds 1, and 38, 40, 42
where it adds the step; bench/results/2026-11-23-h200x2-heal-revoke/revoke-probe/). No earlier sum
equals this attempt's. The ticket also counts the updates applied, on the GPU: that, not the
CPU's counter, is where a rank stands when the group heals.
"""
from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from harness.collectives.flat import FlatParameters

RECOVERY_GRACE = 5.0    # seconds a rank whose collective failed waits to hear that a peer died


@dataclass
class Where:
    """Where a rank's training stands: epochs completed, updates done, batches done in this epoch,
    its early-stopping record, and (in a checkpoint) the group's loss sum, updates and seconds of this
    epoch so far (harness/training/epoch_loss.py)."""
    epoch: int
    step: int
    position: int
    best_error: float
    stale: int
    so_far: tuple[float, int, float] = (0.0, 0, 0.0)


class Ticket:
    """The guard of a GPU worker's updates (see the module's docstring). ``punch()`` goes after the
    update's last collective before the optimizers step (a CUDA graph captures it): the gradients'
    and, on shards (--zero), the all-reduces of the clipping norm and the overflow flag, whose
    results the step reads too. ``optimizers`` (the rank's, then --zero's replica of its predecessor's
    shard) must be fused ones, which honour ``found_inf``. ``step``: updates done so far."""

    def __init__(self, comm: Any, optimizers: Sequence[torch.optim.Optimizer], step: int):
        self._comm = comm
        device = optimizers[0].param_groups[0]["params"][0].device
        self._attempt = torch.zeros(1, dtype=torch.int64, device=device)      # the same on every rank
        self._ticket = torch.zeros(1, dtype=torch.int64, device=device)
        # 0-d, as GradScaler's: Adam's fused step subtracts it from each (0-d) step count.
        self._skip = torch.zeros((), dtype=torch.float32, device=device)
        self.count = torch.full((1,), step, dtype=torch.int64, device=device)   # updates applied
        for optimizer in optimizers:
            optimizer.found_inf = self._skip

    def punch(self) -> None:
        self._attempt.add_(1)
        self._ticket.copy_(self._attempt)
        self._comm.all_reduce(self._ticket)
        complete = self._ticket == self._attempt * self._comm.size
        self._skip.copy_(~complete[0])
        self.count.add_(complete)

    def applied(self) -> int:
        """Updates applied; waits for the GPU."""
        return int(self.count.item())


def rewind(where: Where, applied: int, steps_per_epoch: int) -> Where:
    """``where`` moved back to the update ``applied``: the CPU had gone ahead of what the GPU applied."""
    lost = where.step - applied
    epochs, position = divmod(where.position - lost, steps_per_epoch)
    return Where(where.epoch + epochs, applied, position, where.best_error, where.stale)


def rejoin(ctx: Any, comm: Any, error: BaseException, forget: Callable[[], None] = lambda: None,
           grace: float = RECOVERY_GRACE) -> Any | None:
    """After ``error`` (a failed collective, say) was raised on this rank: if the parent reports a dead
    peer, wait for its replacement and return a communicator over the new generation (``ctx.generation``
    says which). None when no peer died within ``grace`` s: the error was this rank's own, and the caller
    re-raises it; raises ``Salvage`` when no replacement can start. The caller first drops what it holds of
    ``comm``'s pending work (its synchroniser);
    ``forget`` lets go of the rest (a CUDA graph that captured ``comm``), once the device has run what was
    queued (a graph's memory must outlive its queued replays) and before ``comm`` is destroyed."""
    # The error's frames hold the failed work handles, which hold the process group's sockets open.
    traceback.clear_frames(error.__traceback__)
    if comm.device_type == "cuda":
        # What was queued behind the aborted collectives (they return at once now) ends here.
        torch.cuda.synchronize()
    forget()
    gc.collect()
    ctx.release(comm)
    notice = ctx.await_heal(grace)
    if notice is None:
        return None
    if "salvage" in notice:
        raise Salvage(notice["salvage"])
    return ctx.communicator()


class Salvage(Exception):
    """No heal is coming: the dead rank's host is lost (harness/control/replace.py: salvage). ``saver``: the rank
    that is to write what it holds before the run ends."""

    def __init__(self, saver: int):
        super().__init__(f"no replacement can start; rank {saver} saves what it holds")
        self.saver = saver


def hand_over(ctx: Any, comm: Any, flat: FlatParameters, optimizer: torch.optim.Optimizer,
              where: Where | None, average: bool) -> tuple[Where, dict]:
    """Collective on every rank of the new generation; ``where`` is None on the replacement.
    Copies the donor's state to every rank (``average``: parameters and buffers are the survivors'
    mean instead) and returns (the donor's Where, a summary for the log: donor, steps_lost)."""
    places, survivors, donor = _places(ctx, where)
    tensors = (*flat.params, *flat.buffers)
    if average:
        for tensor in tensors:
            if where is None:
                tensor.zero_()
            comm.all_reduce(tensor, op="sum")
            tensor.div_(len(survivors))
    else:
        for tensor in tensors:
            comm.broadcast(tensor, root=donor)
    broadcast_optimizer(ctx, comm, optimizer, donor)
    return places[donor], _summary(places, survivors, donor)


def hand_over_anchor(ctx: Any, comm: Any, flat: FlatParameters, optimizer: torch.optim.Optimizer,
                     where: Where | None, held: dict | None, nesterov: bool) -> tuple[Where, dict, dict]:
    """Param mode's outer optimizer (DiLoCo, harness/collectives/outer.py): the group goes back to its last sync.
    Collective on every rank of the new generation; ``held``: this survivor's outer state (``anchor``,
    ``momentum``, ``residual``), None on the replacement; ``nesterov``: whether there is a momentum.

    The donor (fewest updates) broadcasts its anchor, outer momentum and buffers to every rank (a survivor a sync
    ahead of it goes back too), every rank's parameters become the anchor, and the replacement takes the donor's
    inner optimizer state; survivors keep their own inner state and error-feedback residual (the replacement's
    starts at zero). Lost: what each worker trained since its last sync (at most K - 1 updates; per fragment,
    since that fragment's), never what a sync applied; the run goes on from the donor's place.
    Returns (the donor's Where, a summary for the log, the outer state to continue from)."""
    places, survivors, donor = _places(ctx, where)
    if held is None:
        held = {"anchor": [torch.empty_like(t) for t in flat.params],
                "momentum": [torch.zeros_like(t) for t in flat.params] if nesterov else None,
                "residual": [torch.zeros_like(t, dtype=torch.float32) for t in flat.params]}
    for tensor in (*held["anchor"], *(held["momentum"] or []), *flat.buffers):
        comm.broadcast(tensor, root=donor)
    for param, anchor in zip(flat.params, held["anchor"]):
        param.copy_(anchor)
    replaced = {rank for rank, place in enumerate(places) if place is None}
    broadcast_optimizer(ctx, comm, optimizer, donor, receivers=replaced)
    return places[donor], {**_summary(places, survivors, donor), "back_to_anchor": True}, held


def _places(ctx: Any, where: Where | None) -> tuple[list[Where | None], list[int], int]:
    """Every rank's Where (None: a replacement), the survivors, and the donor: the survivor with the fewest updates."""
    places = ctx.exchange(ctx.unique_tag("heal"), where)
    survivors = [rank for rank, place in enumerate(places) if place is not None]
    if not survivors:
        raise RuntimeError("no survivor to heal from: every rank was replaced")
    return places, survivors, min(survivors, key=lambda rank: (places[rank].step, rank))


def _summary(places: list[Where | None], survivors: list[int], donor: int) -> dict:
    return {"donor": donor, "steps": [None if place is None else place.step for place in places],
            "steps_lost": max(places[r].step for r in survivors) - places[donor].step}


def broadcast_optimizer(ctx: Any, comm: Any, optimizer: torch.optim.Optimizer, donor: int,
                        receivers: set[int] | None = None) -> None:
    """The donor's optimizer state into the ``receivers``' (None: every other rank's): its layout (which
    tensors, shapes, dtypes, and the plain values) through the parent, the tensors over the communicator.
    Every rank calls it; ``optimizer`` is the one the donor gives and a receiver loads (unused elsewhere)."""
    takes = ctx.rank != donor and (receivers is None or ctx.rank in receivers)
    tensors: list[torch.Tensor] = []
    layout = _layout(optimizer.state_dict(), tensors) if ctx.rank == donor else None
    layout = ctx.exchange(ctx.unique_tag("optimizer-layout"), layout)[donor]
    slots: list[_Slot] = []
    _collect(layout, slots)
    if ctx.rank != donor:
        tensors = [torch.empty(slot.shape, dtype=slot.dtype) for slot in slots]
    device = torch.device("cuda", torch.cuda.current_device()) if comm.device_type == "cuda" else torch.device("cpu")
    received = []
    for slot, tensor in zip(slots, tensors):
        carrier = tensor.to(device).contiguous()
        comm.broadcast(carrier, root=donor)
        if not takes:
            continue
        # In the donor's strides: a fused optimizer wants its state laid out as the parameters are
        # (channels_last, say). On this rank's GPU: the donor's "cuda:0" need not be this rank's.
        here = torch.device("cpu") if torch.device(slot.device).type == "cpu" else device
        received.append(torch.empty_strided(slot.shape, slot.stride, dtype=slot.dtype, device=here).copy_(carrier))
    if takes:
        optimizer.load_state_dict(_fill(layout, received))


@dataclass(frozen=True)
class _Slot:
    index: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str


def _layout(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with each tensor replaced by a _Slot (its place in ``tensors``)."""
    if torch.is_tensor(value):
        tensors.append(value)
        return _Slot(len(tensors) - 1, tuple(value.shape), value.stride(), value.dtype, str(value.device))
    if isinstance(value, dict):
        return {key: _layout(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_layout(item, tensors) for item in value]
    return value


def _collect(layout: Any, slots: list[_Slot]) -> None:
    if isinstance(layout, _Slot):
        slots.append(layout)
    elif isinstance(layout, dict):
        for item in layout.values():
            _collect(item, slots)
    elif isinstance(layout, list):
        for item in layout:
            _collect(item, slots)


def _fill(layout: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(layout, _Slot):
        return tensors[layout.index]
    if isinstance(layout, dict):
        return {key: _fill(item, tensors) for key, item in layout.items()}
    if isinstance(layout, list):
        return [_fill(item, tensors) for item in layout]
    return layout
