"""Where a forward first reads each bucket of the flat parameters, so that --zero's all-gather of the
updated parameters overlaps the next forward (FSDP2's forward prefetch, learned rather than declared).

Why learned: a bucket's parameters are not read only by the modules that own them. A tied embedding is
read by the first module and the last; a parent may read a child's weight before the child runs. FSDP2
asks the user to wrap modules so that this holds; any model here must train exactly as it would with
the all-gather done before the forward. So one forward is watched (``ReadOrder``): forward pre-hooks on
every module mark where each module starts, and a ``TorchDispatchMode`` sees every operation's tensors, so
a tensor lying in a flat parameter buffer (a parameter, a view, a transpose of it) reads the buckets its
bytes overlap. The ``Schedule`` it makes waits for each bucket at the start of the last module that began
before its first read: at that point or earlier, never later.

That holds where every forward reads the parameters in the order the watched one did: a CUDA graph's
replays, which repeat the captured forward. ``ShardedGradients`` uses a schedule only there
(``before_forward(static=True)``); an eager step, whose model may branch on its data, waits for every
gather before its forward. A bucket the watched forward did not read is waited for before the forward too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from .shards import ShardLayout


def bucket_spans(layout: ShardLayout) -> list[tuple[int, int, int, int]]:
    """(storage address, first byte, byte past the last, bucket index) of every bucket of ``layout``."""
    spans = []
    for index, bucket in enumerate(layout.buckets):
        params = bucket.segment.params
        size, base = params.element_size(), params.storage_offset() * params.element_size()
        spans.append((params.untyped_storage().data_ptr(), base + bucket.start * size, base + bucket.stop * size, index))
    return spans


def read_span(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, byte past the last) of the memory ``tensor`` can read; None where it has
    no storage to speak of (empty, or a tensor subclass without one)."""
    if tensor.numel() == 0:
        return None
    try:
        address = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    size = tensor.element_size()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    first = tensor.storage_offset() * size
    return address, first, first + extent * size


class Schedule:
    """``first``: the buckets to wait for before the forward; ``at``: per module, the buckets to wait for when
    it starts (its forward pre-hook)."""

    def __init__(self, first: list[int], at: dict[torch.nn.Module, list[int]]):
        self.first, self.at = first, at


class ReadOrder(TorchDispatchMode):
    """Watches one forward of ``model`` (``with``), noting module starts and bucket reads in order; then
    ``schedule()``. Costs one forward's worth of Python per operation: it watches one forward a run."""

    def __init__(self, model: torch.nn.Module, layout: ShardLayout):
        super().__init__()
        self.spans, self.count = bucket_spans(layout), len(layout.buckets)
        self.events: list[torch.nn.Module | int] = []
        self._hooks = [m.register_forward_pre_hook(self._started) for m in model.modules()]

    def _started(self, module: torch.nn.Module, args: tuple) -> None:
        self.events.append(module)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for leaf in tree_leaves((args, kwargs or {})):
            if isinstance(leaf, torch.Tensor) and (span := read_span(leaf)) is not None:
                address, first, last = span
                self.events.extend(index for at, start, stop, index in self.spans
                                   if at == address and start < last and first < stop)
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def schedule(self) -> Schedule:
        """Each bucket waited for at the start of the last module that had begun (its first start) before the
        bucket's first read; before the forward where none had, or where the forward did not read it."""
        began: set[torch.nn.Module] = set()
        seen: set[int] = set()
        current: torch.nn.Module | None = None
        first: list[int] = []
        at: dict[torch.nn.Module, list[int]] = {}
        for event in self.events:
            if isinstance(event, torch.nn.Module):
                if event not in began:
                    began.add(event)
                    current = event
            elif event not in seen:
                seen.add(event)
                (first if current is None else at.setdefault(current, [])).append(event)
        return Schedule(first + [i for i in range(self.count) if i not in seen], at)


class Prefetch:
    """The schedule of ``model``'s forward over ``layout``'s buckets, watched on the first static forward
    (``begin``/``end`` around it), and the hooks that wait by it after that: ``begin(wait)`` returns the
    buckets to wait for now, and the hooks call ``wait(buckets)`` as modules start, until ``end()``."""

    def __init__(self, model: torch.nn.Module, layout: ShardLayout):
        self.model, self.layout = model, layout
        self.schedule: Schedule | None = None
        self._watch: ReadOrder | None = None
        self._wait: Callable[[list[int]], None] | None = None
        self._hooks: list = []

    def begin(self, wait: Callable[[list[int]], None]) -> list[int]:
        if self.schedule is None:       # every bucket whole first: the waits' own copies are no reads of the forward
            wait(list(range(len(self.layout.buckets))))
            self._watch = ReadOrder(self.model, self.layout)
            self._watch.__enter__()
            return []
        self._wait = wait
        return self.schedule.first

    def end(self) -> None:
        """After the forward (before backward): a watch ends and makes the schedule; the hooks go quiet."""
        watch = self.stop()
        if watch is not None:
            self.schedule = watch.schedule()
            self._hooks = [module.register_forward_pre_hook(lambda m, args, due=due: self._started(due))
                           for module, due in self.schedule.at.items()]

    def stop(self) -> ReadOrder | None:
        """The hooks go quiet; a watch in progress ends unused (a step abandoned), or is returned to ``end``."""
        self._wait = None
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.__exit__(None, None, None)
        return watch

    def _started(self, due: list[int]) -> None:
        if self._wait is not None:
            self._wait(due)

    def close(self) -> None:
        self.stop()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
