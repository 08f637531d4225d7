"""--zero 1 and 2: each rank keeps the optimizer state of 1/N of the flat parameters (ZeRO-1) and, with
2, only that share of the gradients (ZeRO-2): DeepSpeed's ZeRO stages, FSDP's SHARD_GRAD_OP, on flat buffers.

The layout (``ShardLayout``): the flat gradients are cut into buckets as gradient averaging cuts them
(each buffer in reverse registration order, ``bucket_mb`` each), and every bucket into N equal pieces,
the last one padded: rank r owns piece r of every bucket. Sharding bucket by bucket, rather than cutting
the whole buffer into N ranges, is what lets a bucket be reduce-scattered as soon as backward fills it
and gathered back on its own. The optimizer is built over ``layout.pieces``: parameters that alias this
rank's ranges of the flat parameter buffer, whose ``.grad`` are this rank's pieces of the gradient
(``layout.grads``), so a fused optimizer updates the flat parameters in place and keeps state for 1/N
of them. Every optimizer we offer is elementwise, so an update over pieces is the update over whole
parameters, element for element.

One update (``ShardedGradients``):
1. a bucket that backward has filled is reduce-scattered ("avg") into this rank's piece of it, in bucket
   order, overlapping the rest of backward (``LaunchOrder``'s hooks);
2. clipping and fp16's overflow check run on the pieces; ``combine`` all-reduces their one scalar each
   (the squared norm, the overflow flag), so every rank clips by the global norm and skips together;
3. the optimizer updates this rank's pieces of the parameters;
4. the next update's ``before_forward`` all-gathers every bucket's pieces back into the flat parameters, in
   place, on the side stream, and the forward waits for each bucket where it first reads it
   (harness/collectives/prefetch.py), so the all-gather overlaps the forward as FSDP2's prefetch does. Between
   updates the flat parameters hold the other ranks' pieces of the update before: ``finish`` (called before
   anything reads them: validation, a checkpoint, the end of the run) gathers them first.

Stage 1 keeps the full flat gradient buffer: autograd accumulates into it, --grad-accum's micro-batches
too, and only the last one is reduced (``no_sync``), in place: this rank's piece of the gradient is its
range of the flat buffer. Stage 2 has none: when a bucket is full its
gradients are copied into a staging buffer and released (``param.grad = None``) before the
reduce-scatter, and with --grad-accum every micro-batch is reduced and the pieces accumulate. What stays
of the gradients is this rank's pieces plus one bucket of staging: a bucket is copied in once the
previous bucket's reduce-scatter is done, which still overlaps that reduce-scatter with the backward of
the next bucket, as DDP's buckets do. (Stage 1 stages only buckets whose length N does not divide, to pad
them; the staging buffer is allocated at its first use.)

A bucket of one parameter that N divides (a parameter larger than ``bucket_mb`` is a bucket of its own:
a language model's embedding) is not staged in stage 2: autograd's gradient is already contiguous in the
flat buffer's order, so it is reduce-scattered where it is and let go once that is done, at the next
bucket's launch or the next backward's start (``before_backward``). The staging buffer is then the size
of the largest other bucket: on GPT-2, whose tied embedding (147 MiB) is the largest bucket by far, 120
MiB less held for the whole run, and one copy of the embedding's gradient less per micro-batch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .base import Communicator
from .flat import FlatParameters, Segment, views
from .prefetch import Prefetch
from .sync import GradientAveraging, LaunchOrder, bucket_groups

STAGING = 1         # staging buffers, each of the largest staged bucket: one bucket's collective in flight at a time
                    # (two were no faster: --zero 2 on GPT-2, 2 x H200, 171.9 against 172.0 ms; 2026-11-26-h200x2-zero-unstaged)


@dataclass
class ShardBucket:
    """Elements ``start:stop`` of a segment's buffers (``params``' gradients fill it), cut into ``size``
    pieces of ``piece`` elements, the last one padded."""
    segment: Segment
    params: list[torch.nn.Parameter]
    offsets: list[int]              # each parameter's offset in the segment
    start: int
    stop: int
    piece: int
    size: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def padded(self) -> bool:
        return self.piece * self.size != self.numel

    def owned(self, rank: int) -> tuple[int, int]:
        """The range of the segment that ``rank`` owns (empty where padding is all its piece has)."""
        first = min(self.start + rank * self.piece, self.stop)
        return first, min(first + self.piece, self.stop)


class ShardLayout:
    """Which elements of the flat buffers each of ``size`` ranks owns (see the module's docstring), and
    ``rank``'s optimizer parameters (``pieces``) and gradient pieces (``grads``, one per bucket,
    ``piece`` elements each, zeros where padding). ``replica``: ``rank`` is another rank's, and this is the
    layout of the copy a rank keeps of its predecessor's shard (``Replica``), with gradients and parameters
    of its own."""

    def __init__(self, flat: FlatParameters, size: int, rank: int, bucket_mb: float, replica: bool = False):
        self.size, self.rank, self.segments = size, rank, flat.segments
        self.buckets: list[ShardBucket] = []
        for segment in flat.segments:
            offset = dict(zip(map(id, segment.trainable), segment.offsets))
            for group in bucket_groups(segment.trainable[::-1], segment.params.element_size(), bucket_mb):
                offsets = [offset[id(p)] for p in group]
                start, stop = min(offsets), max(o + p.numel() for o, p in zip(offsets, group))
                self.buckets.append(ShardBucket(segment, group, offsets, start, stop, -(-(stop - start) // size), size))
        # Where the flat gradients exist (stage 1) this rank's piece of them is reduced in place; else
        # (stage 2, or a replica of another rank's shard) the pieces are consecutive views of one buffer per
        # segment (``grad_buffers``), which the replica's shift sends and receives whole.
        self.segment_buckets = [indices for segment in flat.segments
                                if (indices := [i for i, b in enumerate(self.buckets) if b.segment is segment])]
        own = replica or any(b.segment.grads is None for b in self.buckets)
        self.grad_buffers = [torch.zeros(sum(self.buckets[i].piece for i in indices),
                                         dtype=self.buckets[indices[0]].segment.params.dtype,
                                         device=self.buckets[indices[0]].segment.params.device)
                             for indices in self.segment_buckets] if own else []
        self.grads = [g for buffer, indices in zip(self.grad_buffers, self.segment_buckets)
                      for g in buffer.split([self.buckets[i].piece for i in indices])] if own else \
            [b.segment.grads[slice(*b.owned(rank))] for b in self.buckets]
        self.pieces: list[torch.nn.Parameter] = []
        self.piece_buckets: list[int] = []        # the bucket of each piece
        for index, bucket in enumerate(self.buckets):
            first, last = bucket.owned(rank)
            if last > first:
                owned = bucket.segment.params[first:last]       # an alias, not a copy, unless a replica's
                piece = torch.nn.Parameter(owned.clone() if replica else owned)
                piece.grad = self.grads[index][:last - first]
                self.pieces.append(piece)
                self.piece_buckets.append(index)
        if not self.pieces:
            raise ValueError(f"--zero over {size} workers: rank {rank} would own no parameters (the model has "
                             f"{sum(b.numel for b in self.buckets)} trainable elements); use fewer workers or --zero 0")

    def piece_of(self, bucket: int) -> torch.nn.Parameter | None:
        """This rank's piece of the parameters in bucket ``bucket`` (None where padding is all it has)."""
        return dict(zip(self.piece_buckets, self.pieces)).get(bucket)

    @torch.no_grad()
    def take_parameters(self) -> None:
        """A replica's pieces copied from the flat parameters, where they are the group's (the start, a heal)."""
        for index, piece in zip(self.piece_buckets, self.pieces):
            first, last = self.buckets[index].owned(self.rank)
            piece.copy_(self.buckets[index].segment.params[first:last])

    def packed_grads(self) -> list[torch.Tensor]:
        """Per segment, this rank's gradient pieces end to end, each padded to its bucket's ``piece``: the
        buffers they are views of, or (stage 1's pieces of the flat gradients) a copy."""
        if self.grad_buffers:
            return self.grad_buffers
        return [torch.cat([torch.nn.functional.pad(self.grads[i], (0, self.buckets[i].piece - self.grads[i].numel()))
                           for i in indices]) for indices in self.segment_buckets]

    def largest_bucket_mb(self) -> float:
        """The largest bucket, padded (a bucket holds at least one parameter, whatever bucket_mb says)."""
        return max(b.piece * b.size * b.segment.params.element_size() for b in self.buckets) / 2**20


@dataclass
class _Pending:
    """A collective in flight and what follows it once it is done; ``holds``: a tensor it reads that nothing
    else keeps alive (a gradient reduced where autograd left it), let go once it is done."""
    work: object
    then: Callable[[], None] = lambda: None
    holds: torch.Tensor | None = None
    done: bool = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            if self.work is not None:
                self.work.wait()
            self.then()
            self.work = self.then = self.holds = None


@dataclass
class _Slot:
    """One staging buffer per kind of segment (device, dtype), as large as that kind's largest padded
    bucket (``sizes``), made at its first use, with the collective that uses it now; a slot is reused
    once that collective is done."""
    sizes: dict
    buffers: dict = field(default_factory=dict)
    pending: _Pending | None = None

    def take(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self.buffers:
            self.buffers[key] = torch.zeros(self.sizes[key], dtype=like.dtype, device=like.device)
        return self.buffers[key][:numel]


@dataclass
class Replica:
    """The copy a rank keeps of its predecessor's shard, so that the group heals in place when a rank
    dies (harness/resilience/shard_heal.py): rank - 1's layout with gradient and parameter pieces of its
    own, and an optimizer over it. Every update, once the reduce-scatters are done, each rank passes its
    gradient pieces to the next (``Communicator.shift``: 1/N of the gradients), and the replica's optimizer
    steps on them beside the rank's own: the same numbers through the same arithmetic, so the two copies
    stay equal bit for bit. It costs a second 1/N of optimizer state, of gradients and of parameters, and
    the shift. Why its parameters are not the flat buffer's range of that shard: the all-gather writes
    that range, and on GPU workers a peer's death aborts it, leaving there whatever NCCL had in its buffers
    (measured: values near 1e22 after a heal on 2 x H200), while the copy that heals the shard must be intact."""
    layout: ShardLayout
    optimizer: torch.optim.Optimizer


class ShardedGradients(GradientAveraging):
    """The synchroniser of --zero ``stage`` (1 or 2) over ``layout`` (see the module's docstring), keeping
    ``replica`` (healing in place) up to date as well. For a heal, how far the update in progress got:
    ``ready``, this rank has all its optimizers need (reduced, replicated, unscaled and clipped
    gradients); ``applied``, they stepped on them; both end when the loop counts it (``after_step``).
    ``model``: the model whose static forward (a CUDA graph's) the all-gathers overlap; None (--compile, whose
    graph the waiting hooks would break) gathers before the forward."""

    def __init__(self, comm: Communicator, flat: FlatParameters, layout: ShardLayout, stage: int,
                 replica: Replica | None = None, model: torch.nn.Module | None = None):
        super().__init__(comm, flat)
        if stage not in (1, 2):
            raise ValueError(f"stage={stage}: ZeRO stages are 1 and 2")
        if layout.size != comm.size:
            raise ValueError(f"a layout for {layout.size} ranks with a communicator of {comm.size}")
        self.layout, self.stage, self.replica = layout, stage, replica
        self.ready = self.applied = False
        self._agreed = torch.zeros(1, device=layout.segments[0].params.device)
        largest: dict = {}
        for bucket in layout.buckets:
            if self._unstaged(bucket):
                continue
            key = (bucket.segment.params.device, bucket.segment.params.dtype)
            largest[key] = max(largest.get(key, 0), bucket.piece * bucket.size)
        self.slots = [_Slot(largest) for _ in range(STAGING)]
        self.order = LaunchOrder([b.params for b in layout.buckets], self._reduce, lambda: self.syncing)
        self.prefetch = Prefetch(model, layout) if model is not None else None
        self._gathers: dict[int, _Pending] = {}     # the all-gathers in flight, by bucket
        self._stale = False     # the flat parameters miss the other ranks' pieces of the last update
        self.reset()

    def start(self) -> None:
        super().start()
        if self.replica is not None:
            self.replica.layout.take_parameters()

    def reset(self) -> None:
        self._gathers = {}
        if self.prefetch is not None:
            self.prefetch.stop()
        self.order.reset()
        for slot in self.slots:
            slot.pending = None
        self._launched = 0
        self._micro = 0         # micro-batches of this update already reduced (stage 2)
        self._open: list[_Pending] = []
        self._direct: _Pending | None = None    # the reduce-scatter of a gradient where it is (stage 2)

    def zero_grad(self) -> None:
        if self.stage == 1:
            self.flat.zero_grad()
        self.reset()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Stage 1: the micro-batch accumulates into the flat gradients. Stage 2 has nowhere to keep a
        whole gradient: the micro-batch is reduced as any other, and its pieces accumulate."""
        if self.stage == 1:
            with super().no_sync():
                yield
            return
        yield
        self.order.rest()
        self.order.reset()
        self._micro += 1

    def _slot(self) -> _Slot:
        """The next staging slot, once the collective that used it last is done."""
        slot = self.slots[self._launched % len(self.slots)]
        self._launched += 1
        if slot.pending is not None:
            slot.pending.finish()
        return slot

    def _keep(self, pending: _Pending, slot: _Slot | None) -> None:
        self._open.append(pending)
        if slot is not None:
            slot.pending = pending

    def _reduce(self, index: int) -> None:
        """Reduce-scatter bucket ``index``'s gradient into this rank's piece of it. In place (the output is
        this rank's chunk of the input), except stage 2's first micro-batch, which goes straight into the
        piece; then a staged chunk is copied to the piece (stage 1, padded) or added to it (stage 2)."""
        bucket, piece, rank = self.layout.buckets[index], self.layout.grads[index], self.layout.rank
        self._let_go()
        unstaged = self._unstaged(bucket)
        slot = self._slot() if (self.stage == 2 or bucket.padded) and not unstaged else None
        if unstaged:
            source = self._released(bucket.params[0])
        else:
            source = self._stage(bucket, slot) if self.stage == 2 else self._padded(bucket, slot)
        mine = source[rank * bucket.piece:(rank + 1) * bucket.piece]
        if self.stage == 2 and not self._micro:
            mine, then = piece, lambda: None
        elif self.stage == 2:
            then = lambda: piece.add_(mine)
        else:       # stage 1: ``mine`` is the piece itself, or its padded copy in the slot
            then = (lambda: piece.copy_(mine[:piece.numel()])) if slot is not None else (lambda: None)
        pending = _Pending(self.comm.reduce_scatter(mine, source, op="avg", async_op=self.order.hooked), then,
                           holds=source if unstaged else None)
        self._keep(pending, slot)
        if unstaged:
            self._direct = pending

    def before_forward(self, static: bool) -> None:
        """All-gather every bucket's pieces of the last update (see the module's docstring), the same order on
        every rank. The padded buckets go first, through the staging slot one at a time, and are copied in
        before the forward: gathered in place they would overwrite the next bucket with their padding, and
        a buffer each, alive until the forward reads them, would hold another copy of them through the
        forward's largest activations. The others follow, last bucket first (the forward's first parameters are
        the buckets' last). ``static``: a CUDA graph's forward, which waits for each where the schedule says (and
        which gathers whatever the host knows: it is recorded once); else all are waited for now, and only if
        the last update left the parameters stale."""
        if static or self._stale:
            buckets = self.layout.buckets
            for index in sorted(reversed(range(len(buckets))), key=lambda i: not buckets[i].padded):
                self._gathers[index] = self._gather(buckets[index])
        self._stale = False
        self._wait([index for index in list(self._gathers) if self.layout.buckets[index].padded])
        self._wait(self.prefetch.begin(self._wait) if static and self.prefetch is not None else list(self._gathers))

    def _gather(self, bucket: ShardBucket) -> _Pending:
        """All-gather ``bucket``'s pieces into the flat parameters: in place, or (padded) into the staging slot,
        from which its wait copies them in (``_slot`` first waits for the slot's last collective)."""
        full = bucket.segment.params[bucket.start:bucket.stop]
        slot = self._slot() if bucket.padded else None
        out = full if slot is None else slot.take(full, bucket.piece * bucket.size)
        mine = out[self.layout.rank * bucket.piece:(self.layout.rank + 1) * bucket.piece]
        if slot is not None:
            first, last = bucket.owned(self.layout.rank)
            mine[:last - first].copy_(bucket.segment.params[first:last])
        work = self.comm.all_gather(out, mine, async_op=True)
        pending = _Pending(work, (lambda: full.copy_(out[:full.numel()])) if slot is not None else (lambda: None))
        if slot is not None:
            slot.pending = pending
        return pending

    def _wait(self, buckets: list[int]) -> None:
        """The current stream waits for these buckets' all-gathers (those still in flight)."""
        for index in buckets:
            pending = self._gathers.pop(index, None)
            if pending is not None:
                pending.finish()

    def before_backward(self) -> None:
        """Every all-gather is waited for by the first backward (a parameter the forward did not read, or a
        watched forward's end, ``Prefetch.end``). Also: the gradient reduce-scattered where autograd left it is
        let go (``_let_go``) at the start of each
        backward, not only at the next bucket: the next backward's first operation (a language model's head)
        makes the next gradient of the same tied embedding, at the moment of backward's largest activations.
        Letting it go at the end of each backward instead (FSDP2's choice: the compute stream waits there for
        the reduce-scatter) left GPT-2's peak on 2 x H200 where it was and cost 0.4% of a step."""
        if self.prefetch is not None:
            self.prefetch.end()
        self._wait(list(self._gathers))
        self._let_go()

    def _let_go(self) -> None:
        """The gradient reduce-scattered where autograd left it released, once that is done: before backward
        makes the next one (``before_backward``, and at each bucket's launch), so no more than one is held."""
        if self._direct is not None:
            self._direct.finish()
            self._direct = None

    def _unstaged(self, bucket: ShardBucket) -> bool:
        """Stage 2 reduce-scatters this bucket straight from its one parameter's gradient (see the module's
        docstring)."""
        return self.stage == 2 and len(bucket.params) == 1 and not bucket.padded

    @staticmethod
    def _released(param: torch.nn.Parameter) -> torch.Tensor:
        """``param``'s gradient as the flat buffer lays it out (1-D, in its memory order), taken off the
        parameter: autograd's own tensor where its strides are the parameter's, else a copy; zeros where
        backward gave it none."""
        grad, param.grad = param.grad, None
        if grad is None:
            grad = torch.zeros_like(param)
        elif grad.stride() != param.stride():
            grad = torch.empty_like(param).copy_(grad)
        return grad.as_strided((grad.numel(),), (1,), grad.storage_offset())

    def _padded(self, bucket: ShardBucket, slot: _Slot | None) -> torch.Tensor:
        """Stage 1: the bucket's view of the flat gradients, or a padded copy of it."""
        view = bucket.segment.grads[bucket.start:bucket.stop]
        if slot is None:
            return view
        staged = slot.take(view, bucket.piece * bucket.size)
        staged[:bucket.numel].copy_(view)
        staged[bucket.numel:].zero_()
        return staged

    def _stage(self, bucket: ShardBucket, slot: _Slot) -> torch.Tensor:
        """Stage 2: the bucket's gradients copied into a staging buffer, laid out as the flat buffers
        are, and released; a parameter that got no gradient this time contributes zeros."""
        staged = slot.take(bucket.segment.params, bucket.piece * bucket.size)
        for param, offset in zip(bucket.params, bucket.offsets):
            (view,) = views(staged[offset - bucket.start:], [param])
            if param.grad is None:
                view.zero_()
            else:
                view.copy_(param.grad)
                param.grad = None
        staged[bucket.numel:].zero_()
        return staged

    def after_backward(self) -> None:
        self.order.rest()
        for pending in self._open:
            pending.finish()
        self.reset()
        if self.replica is not None:
            self._replicate()

    def _replicate(self) -> None:
        """This rank's gradient pieces to the next rank, into its replica of this shard: one shift per
        segment (one send/recv an update, whatever the number of buckets)."""
        for received, mine in zip(self.replica.layout.grad_buffers, self.layout.packed_grads()):
            self.comm.shift(received, mine)

    def before_step(self) -> None:
        """With a replica, a one-element all-reduce as the update's last collective before the optimizers
        step: no rank steps before every rank is ``ready``, so a heal that finds a rank stepped can step
        the ranks that were ready and had not, and count on the dead rank's replica having been ready too."""
        if self.replica is not None:
            self.ready = True
            self.comm.all_reduce(self._agreed)

    def update_grads(self) -> list[torch.Tensor]:
        return [g for g in self.layout.grads if g.numel()]

    def follower_grads(self) -> list[torch.Tensor]:
        return [g for g in self.replica.layout.grads if g.numel()] if self.replica is not None else []

    def follower_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.replica.optimizer] if self.replica is not None else []

    def combine(self, value: torch.Tensor, op: str) -> None:
        self.comm.all_reduce(value, op=op)

    def after_update(self) -> None:
        """The replica's optimizer steps on its shard; the all-gather waits for the next update (or ``finish``)."""
        self.applied = True
        if self.replica is not None:
            self.replica.optimizer.step()
        self.reset()

    def after_step(self, step: int) -> None:
        """The loop counted the update (``step`` updates done): none is in progress, and the flat parameters
        miss its other pieces (the host counts every update, a graph's replays too)."""
        self.ready = self.applied = False
        self._stale = True

    def finish(self) -> None:
        """The flat parameters made whole (the last update's all-gather), before anything reads them; a watch
        of a forward that raised (``Prefetch``) ends."""
        if self.prefetch is not None:
            self.prefetch.stop()
        self.before_forward(static=False)
        super().finish()

    def gradient_bytes(self) -> int:
        staging = sum(t.nbytes for slot in self.slots for t in slot.buffers.values())
        pieces = sum(g.nbytes for g in self.layout.grads) if self.stage == 2 else 0    # stage 1's are the flat ones
        replica = sum(g.nbytes for g in self.replica.layout.grads) if self.replica is not None else 0
        return sum(g.nbytes for g in self.flat.grads) + pieces + staging + replica

    def close(self) -> None:
        self.order.close()
        self.reset()
        if self.prefetch is not None:
            self.prefetch.close()
