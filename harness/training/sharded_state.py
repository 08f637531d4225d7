"""--zero's optimizer state in a checkpoint: written as --zero 0 would write it, read back into any shards.

A sharded optimizer's own ``state_dict()`` would name its pieces (harness/collectives/shards.py), which
exist only for one number of workers; a checkpoint that only that many workers can load is what users
of other sharded optimizers run into (DeepSpeed's "universal checkpoint" exists for it). So the saved
state is the one an unsharded optimizer over ``model.parameters()`` holds: ``gather_state`` all-gathers
each bucket's pieces of every elementwise state tensor (momentum, Adam's moments) and rank 0 cuts the
result into per-parameter tensors, in each parameter's own layout; ``load_state`` does the reverse from
any such state, on any number of workers, with any --zero. Test.py and --zero 0 read the same file.

Elementwise state is what has its parameter's shape; the rest (a step count, ccnesterov's lambda) is
the same for every piece and every parameter, since all of them are updated at every step.
"""
from __future__ import annotations

from typing import Any

import torch

from harness.collectives.flat import views
from harness.collectives.shards import ShardLayout
from harness.training.optim import load_optimizer_state


def gather_state(optimizer: torch.optim.Optimizer, layout: ShardLayout, comm: Any,
                 model: torch.nn.Module) -> dict | None:
    """The optimizer's state as an unsharded optimizer over ``model.parameters()`` holds it, on rank 0
    (None on the others). Every rank must call it: it all-gathers, bucket by bucket (one bucket of
    device memory at a time; rank 0 keeps the whole on the host)."""
    first = optimizer.state.get(layout.pieces[0], {})
    elementwise = [k for k, v in first.items() if torch.is_tensor(v) and v.shape == layout.pieces[0].shape]
    lead = layout.rank == 0
    whole = {(id(b.segment), key): torch.zeros(b.segment.trainable_numel, dtype=first[key].dtype)
             for b in layout.buckets for key in elementwise} if lead else {}
    mine = dict(zip(layout.piece_buckets, layout.pieces))
    for index, bucket in enumerate(layout.buckets):
        for key in elementwise:
            out = torch.zeros(bucket.piece * bucket.size, dtype=first[key].dtype, device=first[key].device)
            piece = mine.get(index)
            if piece is not None:
                out[layout.rank * bucket.piece:][:piece.numel()].copy_(optimizer.state[piece][key])
            comm.all_gather(out, out[layout.rank * bucket.piece:(layout.rank + 1) * bucket.piece].clone())
            if lead:
                whole[(id(bucket.segment), key)][bucket.start:bucket.stop].copy_(out[:bucket.numel])
    if not lead:
        return None
    shared = {k: v for k, v in first.items() if k not in elementwise}
    index_of = {id(p): i for i, p in enumerate(model.parameters())}
    state: dict[int, dict] = {}
    for segment in layout.segments:
        per_key = {key: views(whole[(id(segment), key)], segment.trainable) for key in elementwise}
        for k, param in enumerate(segment.trainable):
            state[index_of[id(param)]] = {**_copies(shared), **{key: per_key[key][k].clone() for key in elementwise}}
    group = {**optimizer.state_dict()["param_groups"][0], "params": list(range(len(index_of)))}
    return {"state": state if first else {}, "param_groups": [group]}


def load_state(optimizer: torch.optim.Optimizer, layout: ShardLayout, saved: dict, model: torch.nn.Module) -> None:
    """Give the sharded ``optimizer`` this rank's part of ``saved``, an unsharded optimizer's state over
    ``model.parameters()`` (what any run's checkpoint holds)."""
    params = list(model.parameters())
    state = {params[i]: value for i, value in saved["state"].items()}
    group = {k: v for k, v in saved["param_groups"][0].items() if k != "params"}
    pieces: dict[int, dict] = {}
    if state:
        probe = next(iter(state.items()))
        elementwise = [k for k, v in probe[1].items() if torch.is_tensor(v) and v.shape == probe[0].shape]
        shared = {k: v for k, v in probe[1].items() if k not in elementwise}
        for segment in layout.segments:
            whole = {key: _assemble(segment, state, key) for key in elementwise}
            for j, (index, piece) in enumerate(zip(layout.piece_buckets, layout.pieces)):
                bucket = layout.buckets[index]
                if bucket.segment is segment:
                    first, last = bucket.owned(layout.rank)
                    pieces[j] = {**_copies(shared), **{key: whole[key][first:last].clone() for key in elementwise}}
    load_optimizer_state(optimizer, {"state": pieces, "param_groups": [{**group, "params": list(range(len(layout.pieces)))}]})


def _assemble(segment: Any, state: dict, key: str) -> torch.Tensor:
    """One elementwise state tensor of every trainable parameter of ``segment``, laid out as its flat
    buffer (zeros for a parameter without state)."""
    like = next(v[key] for v in state.values() if key in v)
    whole = torch.zeros(segment.trainable_numel, dtype=like.dtype)
    for param, view in zip(segment.trainable, views(whole, segment.trainable)):
        if param in state and key in state[param]:
            view.copy_(state[param][key])
    return whole


def _copies(values: dict) -> dict:
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in values.items()}
