"""What a batch may be, and the few things the harness does to any of them.

- ``(x, y)``: a model's input and its targets, the classic pair (``model(x)``, the loss against ``y``);
- a dict of tensors: keyword arguments, ``model(**batch)``, as Hugging Face's Trainer passes
  ``input_ids``/``attention_mask``/``labels``;
- any other tuple or list of tensors: positional arguments, ``model(*batch)``.

A two-element tuple is always the pair. Non-tensor leaves (a list of paths, say) pass through
untouched. The helpers walk dicts, tuples and lists, so the pipeline, the step (its micro-batches
and a CUDA graph's static copy) and evaluation treat every kind alike.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

Batch = Any


def tree_map(fn: Callable[[torch.Tensor], Any], batch: Batch) -> Batch:
    """``batch`` with ``fn`` applied to every tensor in it."""
    if torch.is_tensor(batch):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(tree_map(fn, v) for v in batch)
    return batch


def tensors(batch: Batch) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(found.append, batch)
    return found


def is_pair(batch: Batch) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def samples(batch: Batch) -> int:
    """The batch's size: the first dimension of its first tensor."""
    return len(tensors(batch)[0])


def chunk(batch: Batch, parts: int) -> list[Batch]:
    """``batch`` cut into ``parts`` micro-batches along the first dimension of every tensor."""
    pieces = tree_map(lambda t: t.chunk(parts), batch)
    return [_pick(pieces, i) for i in range(parts)]


def _pick(pieces: Any, i: int) -> Batch:
    if isinstance(pieces, tuple) and pieces and torch.is_tensor(pieces[0]):
        return pieces[i]
    if isinstance(pieces, dict):
        return {k: _pick(v, i) for k, v in pieces.items()}
    if isinstance(pieces, (tuple, list)):
        return type(pieces)(_pick(v, i) for v in pieces)
    return pieces


def copy_into(static: Batch, batch: Batch) -> None:
    """Copy every tensor of ``batch`` into the same place of ``static`` (a CUDA graph's inputs)."""
    for target, source in zip(tensors(static), tensors(batch)):
        target.copy_(source, non_blocking=True)


def call_model(model: Callable[..., Any], batch: Batch) -> Any:
    """The model on a batch: ``model(x)`` for a pair, ``model(**batch)`` for a dict, else ``model(*batch)``."""
    if isinstance(batch, dict):
        return model(**batch)
    if is_pair(batch):
        return model(batch[0])
    return model(*batch)
