"""Keeping replicas in step: gradient averaging and parameter averaging (the seed's two modes).

Both act on FlatParameters' few contiguous buffers, so each synchronisation is one collective
per buffer, issued in the same order on every rank (out-of-order collectives deadlock NCCL).

* ``GradientAveraging`` (--mode grad --grad-sync flat): after backward, all-reduce the flat
  gradients with "avg"; every replica then takes the same optimizer step, so replicas stay identical.
* ``BucketedGradientAveraging`` (--mode grad, the default): the same result, faster. Buckets of
  the flat gradient are all-reduced asynchronously as soon as backward has filled them, so the
  communication overlaps the rest of backward.
* ``ParameterAveraging`` (--mode param --avg-every K): replicas step on their own gradients and
  every K updates (and at the end) average their flat parameters and floating-point buffers
  (BatchNorm statistics), and optionally the optimizer's state.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from .base import Communicator
from .flat import FlatParameters


class Synchroniser:
    def __init__(self, comm: Communicator, flat: FlatParameters):
        self.comm, self.flat = comm, flat
        self.syncing = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients (--grad-accum's first K-1 micro-batches,
        like DDP's ``no_sync``): the micro-batch that completes the update brings every bucket in."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def start(self) -> None:
        """Start every replica from rank 0's parameters and buffers."""
        for tensor in (*self.flat.params, *self.flat.buffers):
            self.comm.broadcast(tensor, root=0)

    def zero_grad(self) -> None:
        """Before an update's first backward."""
        self.flat.zero_grad()

    def before_forward(self, static: bool) -> None:
        """Before an update's first forward. ``static``: the step replays a recorded forward (a CUDA graph),
        which reads the parameters in the order the recorded one did (--zero's all-gathers overlap it)."""

    def before_backward(self) -> None:
        """After a micro-batch's forward, before its backward."""

    def after_backward(self) -> None:
        pass

    def update_grads(self) -> list[torch.Tensor]:
        """The gradients the optimizer reads (clipped, unscaled): the flat ones, autograd's own (a world of
        one keeps no flat ones), or this rank's shards."""
        return self.flat.grads if self.flat.flatten_grads else self.flat.complete_grads()

    def follower_grads(self) -> list[torch.Tensor]:
        """Gradients that are unscaled and clipped as ``update_grads()`` are, without counting in the
        norm: --zero's replica of another rank's shard (the overflow check sees them, and they change
        nothing there: that rank checks the same numbers)."""
        return []

    def follower_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers that step on ``follower_grads()`` inside ``after_update`` (--zero's replica's)."""
        return []

    # Where update_grads() is a shard, combine(value, op) makes a figure computed over it (a squared norm,
    # an overflow flag) the group's, in place; None: the figure is the group's already.
    combine: Callable[[torch.Tensor, str], None] | None = None

    def before_step(self) -> None:
        """After unscaling and clipping, just before the optimizer's step (--zero's replica agrees there)."""

    def after_update(self) -> None:
        """After the optimizer's step (sharded: the updated shards gathered back)."""

    def after_step(self, step: int) -> None:
        pass

    def ends_after(self, total: int) -> None:
        """The run ends after update ``total`` (param mode's outer optimizer leaves that update's sync to
        ``end_of_run``)."""

    def end_of_run(self, step: int) -> None:
        """After the run's last update (param mode's outer optimizer syncs every fragment, by averaging)."""

    def over(self, step: int, total: int) -> bool:
        """Whether this rank's run is over after update ``step``: at ``total`` (--mode async's worker: when
        the server grants it no more)."""
        return step >= total

    def position(self, step: int) -> int:
        """Where the run stands after this rank's update ``step``, in updates of a synchronous run: ``step``
        (--mode async's worker: from the samples all workers have trained on)."""
        return step

    def evaluation_due(self, scheduled: bool) -> bool:
        """Whether to validate now: when the loop's schedule says so (--validate-every, an epoch's end)."""
        return scheduled

    def evaluation_share(self, rank: int, world: int) -> tuple[int, int]:
        """Which share of the validation split this rank evaluates, as (rank, world): its own."""
        return rank, world

    def before_evaluation(self) -> None:
        """Before ``global_weights`` is evaluated: ``finish`` (the replicas made consistent)."""
        self.finish()

    def report_validation(self, record: dict, send: Callable[[dict], None] | None) -> None:
        """A validation record to metrics.jsonl: ``send`` is the parent's, on rank 0 only (None elsewhere)."""
        if send is not None:
            send(record)

    def checkpoint_due(self, scheduled: bool) -> bool:
        """Whether to save now: when the loop's schedule says so (--save-every-steps, --save-every)."""
        return scheduled

    def ready_to_save(self, unsaved: bool) -> bool:
        """Whether a save now writes something new (``unsaved``: this update is not saved yet); if so, the
        replicas are made consistent (``finish``) first."""
        if unsaved:
            self.finish()
        return unsaved

    @contextlib.contextmanager
    def global_weights(self) -> Iterator[None]:
        """The weights the group agrees on in the model, for evaluation and a checkpoint's model (the
        outer optimizer's anchor); here the model's own."""
        yield

    def state_dict(self) -> dict | None:
        """What a checkpoint needs of this rank beyond the model and rank 0's optimizer state (None: nothing)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Take this rank's part of a checkpoint back (what ``state_dict`` gave)."""

    def kept_through_heal(self) -> dict | None:
        """What this rank's synchroniser holds that a heal in place carries over to the next one (param mode's
        outer optimizer: the anchor, its momentum, the error-feedback residual); None: nothing."""
        return None

    def gradient_bytes(self) -> int:
        """What this rank holds for gradients (the flat buffers, or autograd's own; a sharded synchroniser
        adds its own)."""
        return self.flat.grad_nbytes()

    def finish(self) -> None:
        """Called before the replicas are compared, evaluated or saved."""

    def reset(self) -> None:
        """Forget a step that was begun but not finished (an abandoned graph capture)."""

    def close(self) -> None:
        """Detach from the model (its hooks), before a healed group makes a new synchroniser."""


class GradientAveraging(Synchroniser):
    def after_backward(self) -> None:
        for grad in self.flat.grads:
            self.comm.all_reduce(grad, op="avg")

    def finish(self) -> None:
        # Gradients keep parameters equal; BatchNorm statistics still drift apart per shard.
        for buffer in self.flat.buffers:
            self.comm.all_reduce(buffer, op="avg")


class LaunchOrder:
    """Which bucket's gradients are all in, and launching full buckets strictly in index order.

    A post-accumulate-grad hook counts down each bucket (``groups[i]``: its parameters); a full bucket
    is launched (``launch(i)``) once every bucket before it has been, because NCCL deadlocks when ranks
    issue collectives in different orders: a bucket that fills early waits for its predecessors.
    ``rest()`` launches what is left after backward (parameters that got no gradient this time).

    With one bucket there are no hooks: it fills with backward's last gradient, so there is nothing
    to overlap, and on such small (launch-bound) models the hooks' host cost is the whole price.
    Measured on an H200 with the MLP: Python hooks run on autograd's device thread, and launching the
    bucket from there added ~0.3 ms to a 1.3 ms step; one synchronous collective after backward ~0.02 ms.
    """

    def __init__(self, groups: list[list[torch.nn.Parameter]], launch: Callable[[int], None],
                 active: Callable[[], bool]):
        self.counts = [len(group) for group in groups]
        self._launch, self._active = launch, active
        self._owner = {param: index for index, group in enumerate(groups) for param in group}
        self.hooked = len(groups) > 1
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in self._owner] \
            if self.hooked else []
        self.reset()

    def reset(self) -> None:
        self._waiting = list(self.counts)
        self._next = 0

    def _on_gradient(self, param: torch.nn.Parameter) -> None:
        if not self._active():
            return
        self._waiting[self._owner[param]] -= 1
        while self._next < len(self.counts) and self._waiting[self._next] <= 0:
            self._next += 1
            self._launch(self._next - 1)

    def rest(self) -> None:
        while self._next < len(self.counts):
            self._next += 1
            self._launch(self._next - 1)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self.reset()


def bucket_groups(segment_params: list[torch.nn.Parameter], itemsize: int,
                  bucket_mb: float) -> list[list[torch.nn.Parameter]]:
    """Consecutive runs of ``segment_params`` (one flat buffer's, in the order backward fills them) of
    at least ``bucket_mb`` MiB each, the last one what remains; a parameter of ``bucket_mb`` or more is a
    bucket of its own (--zero 2 reduces such a bucket where autograd left its gradient: harness/collectives/shards.py)."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb={bucket_mb}: must be positive")
    groups: list[list[torch.nn.Parameter]] = [[]]
    elements = 0
    for param in segment_params:
        if groups[-1] and param.numel() * itemsize >= bucket_mb * 2**20:
            groups.append([])
            elements = 0
        groups[-1].append(param)
        elements += param.numel()
        if elements * itemsize >= bucket_mb * 2**20:
            groups.append([])
            elements = 0
    return [group for group in groups if group]


class _Bucket:
    """A contiguous slice of one flat gradient buffer and the parameters whose gradients fill it."""

    def __init__(self, flat_grad: torch.Tensor, params: list[torch.nn.Parameter], reduce_dtype: torch.dtype | None):
        offsets = [p.grad.storage_offset() - flat_grad.storage_offset() for p in params]
        start = min(offsets)
        stop = max(o + p.numel() for o, p in zip(offsets, params))
        self.view = flat_grad[start:stop]
        self.shadow = None if reduce_dtype in (None, flat_grad.dtype) else torch.empty_like(self.view, dtype=reduce_dtype)


class BucketedGradientAveraging(GradientAveraging):
    """Overlap the gradient all-reduce with backward, like DDP's reducer, on flat buffers.

    Buckets are cut from each flat gradient buffer in reverse registration order (about the order
    backward produces gradients), ``bucket_mb`` each, and launched as they fill, in index order
    (``LaunchOrder``), asynchronously (NCCL: on a side stream that first waits for backward's
    stream). ``after_backward`` launches what is left (parameters that got no gradient this step keep
    their zeroed gradient) and makes the optimizer wait for every bucket.

    ``reduce_dtype=torch.bfloat16`` halves the bytes on the wire: each bucket is cast into a bf16
    shadow before the all-reduce and copied back after it.
    """

    def __init__(self, comm: Communicator, flat: FlatParameters, bucket_mb: float = 25.0,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__(comm, flat)
        self.buckets: list[_Bucket] = []
        groups: list[list[torch.nn.Parameter]] = []
        for _, flat_grad, params in flat.grad_segments():
            for group in bucket_groups(params, flat_grad.element_size(), bucket_mb):
                groups.append(group)
                self.buckets.append(_Bucket(flat_grad, group, reduce_dtype))
        self.order = LaunchOrder(groups, self._launch, lambda: self.syncing)
        self._works: list = []

    def reset(self) -> None:
        self.order.reset()
        self._works = []

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        if bucket.shadow is not None:
            bucket.shadow.copy_(bucket.view)
        work = self.comm.all_reduce(bucket.view if bucket.shadow is None else bucket.shadow, op="avg",
                                    async_op=self.order.hooked)
        self._works.append((bucket, work))

    def after_backward(self) -> None:
        self.order.rest()
        for bucket, work in self._works:
            if work is not None:
                work.wait()
            if bucket.shadow is not None:
                bucket.view.copy_(bucket.shadow)
        self.reset()

    def close(self) -> None:
        self.order.close()
        self.reset()


class ParameterAveraging(Synchroniser):
    def __init__(self, comm: Communicator, flat: FlatParameters, every: int,
                 optimizer: torch.optim.Optimizer | None = None):
        super().__init__(comm, flat)
        if every < 1:
            raise ValueError(f"avg_every={every}: must be at least 1")
        self.every, self.optimizer = every, optimizer

    def after_step(self, step: int) -> None:
        if step % self.every == 0:
            self.average()

    def finish(self) -> None:
        self.average()

    def average(self) -> None:
        for tensor in (*self.flat.params, *self.flat.buffers, *self._optimizer_state()):
            self.comm.all_reduce(tensor, op="avg")

    def _optimizer_state(self) -> list[torch.Tensor]:
        """Momentum / Adam moments, in parameter order (the same on every rank)."""
        if self.optimizer is None:
            return []
        tensors = []
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                for key, value in sorted(self.optimizer.state.get(param, {}).items()):
                    if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0 \
                            and value.device == param.device:
                        tensors.append(value)
        return tensors
