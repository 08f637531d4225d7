"""Batches for the training loop: from memory, or streamed from disk without stalling the GPU.

Both kinds yield the same batches for a given (seed, epoch, position), so a run that stops
mid-epoch resumes exactly: the sampler's state is just (epoch, batches done), which the
checkpoint records.

* ``ResidentBatches``: an in-memory Split. Small ones live on the device and a batch is one
  gather there (the fastest path there is); large ones are gathered on the host.
* ``StreamedBatches``: a map-style Dataset read by a torch DataLoader. Decoding and augmentation
  run in ``--data-workers`` persistent worker processes, each batch lands in pinned memory, and
  the copy to the GPU of batch k+1 runs on a side stream while step k computes (``to_device``).
  Workers are forked from the training process: they never touch CUDA or the control plane, and
  fork makes their start-up, which the first step waits for, nearly free.
* ``EvaluationBatches``: a validation split's passes, through loader processes forked once, before the
  training loop's communicator (a fork after it can hang: its docstring says why).

Every sample is drawn under its own seed (``Seeded``), derived from (seed, epoch, index): random
crops and flips come out the same whichever loader process decodes the sample and whether or not
the run was resumed, for any Dataset that draws from ``random``, numpy or torch.
"""
from __future__ import annotations

import ctypes
import functools
import os
import random
import signal
import sys
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from harness.checkout.datasets import Split
from harness.checkout.datasets.sharding import epoch_seed, shard_indices
from harness.data.bad_samples import Collate, fetch, handed_out
from harness.data.batch import Batch, is_pair, tensors, tree_map

PR_SET_PDEATHSIG = 1        # linux/prctl.h: a signal this process gets when its parent dies

GOLDEN = 0x9E3779B97F4A7C15          # spreads consecutive indices over the seed space
MAX_DEFAULT_WORKERS = 16


def default_data_workers(workers_on_host: int) -> int:
    """Loader processes per training worker: the host's cores shared out, one left for the step."""
    return max(0, min(MAX_DEFAULT_WORKERS, (os.cpu_count() or 1) // max(1, workers_on_host) - 1))


def is_streamed(split: Any) -> bool:
    return not isinstance(split, Split)


class ResidentBatches:
    """Batches of an in-memory Split, kept on the device when it takes at most an eighth of its memory."""

    def __init__(self, split: Any, rank: int, world: int, batch: int, seed: int, device: torch.device):
        limit = torch.cuda.get_device_properties(device).total_memory // 8 if device.type == "cuda" else 0
        on_device = device.type == "cpu" or split.x.nbytes + split.y.nbytes <= limit
        self.x, self.y = (split.x.to(device), split.y.to(device)) if on_device else (split.x, split.y)
        self.rank, self.world, self.batch, self.seed, self.device = rank, world, batch, seed, device
        self.steps_per_epoch = (len(split) // world) // batch

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = shard_indices(len(self.x), self.rank, self.world, epoch, self.seed).to(self.x.device)
        for i in range(start, self.steps_per_epoch):
            idx = order[i * self.batch:(i + 1) * self.batch]
            yield (self.x[idx].to(self.device, non_blocking=True), self.y[idx].to(self.device, non_blocking=True))

    def close(self) -> None:
        pass


class Seeded(torch.utils.data.Dataset):
    """Fetches ``(index, seed)`` keys: seeds ``random``, numpy and torch's CPU generator, then
    returns (``dataset[index]``, []), or where that sample fails to load, (the replacement drawn under
    the same seed, the failures met): harness/data/bad_samples.py. Only the CPU generator: seeding
    CUDA's in a forked loader would queue a lazy call, with a stack trace, per sample. In the training
    process itself (``--data-workers 0``) the generators are put back afterwards: dropout draws from them."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        if torch.utils.data.get_worker_info() is not None:
            return self._fetch(*key)
        saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            return self._fetch(*key)
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])

    def _fetch(self, index: int, seed: int) -> tuple[Any, list[dict]]:
        return fetch(self.dataset, index, functools.partial(_seed_all, seed))


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.default_generator.manual_seed(seed)


class ShardSampler(torch.utils.data.Sampler):
    """This rank's batches of (index, seed) keys for one epoch, from ``position`` = (epoch, start) on."""

    def __init__(self, n: int, rank: int, world: int, batch: int, seed: int):
        self.n, self.rank, self.world, self.batch, self.seed = n, rank, world, batch, seed
        self.steps_per_epoch = (n // world) // batch
        self.position = (0, 0)

    def __len__(self) -> int:
        return self.steps_per_epoch - self.position[1]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, start = self.position
        order = shard_indices(self.n, self.rank, self.world, epoch, self.seed)
        base = epoch_seed(self.seed, epoch)
        for i in range(start, self.steps_per_epoch):
            yield [(j, (base + j * GOLDEN) % 2**63) for j in order[i * self.batch:(i + 1) * self.batch].tolist()]


class StreamedBatches:
    """Batches of a map-style Dataset through a DataLoader, copied to the device ahead of use."""

    def __init__(self, dataset: Any, rank: int, world: int, batch: int, seed: int, device: torch.device,
                 workers: int):
        self.sampler = ShardSampler(len(dataset), rank, world, batch, seed)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.dataset, self.device = dataset, device
        self.loader = _loader(Seeded(dataset), device, workers, batch_sampler=self.sampler,
                              collate_fn=Collate(getattr(dataset, "collate", None)))
        self._iterator: Iterator | None = None
        self.failures: list[dict] = []          # bad samples of the batches handed out; the loop takes them

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        self.sampler.position = (epoch, start)
        self._iterator = iter(self.loader)      # persistent workers: reused, told the new positions
        return handed_out(self._iterator, lambda batches: to_device(batches, self.device, self.dataset),
                          self.failures)

    def close(self) -> None:
        _shut_down(self._iterator)


def evaluation_keys(n: int, rank: int, world: int) -> list[tuple[int, int]]:
    """``Seeded``'s keys of samples rank, rank + world, ... of n, in order, each seeded with its own index."""
    return [(i, i) for i in range(rank, n, world)]


def evaluation_batches(split: Any, rank: int, world: int, batch: int, device: torch.device,
                       workers: int = 0, failures: list[dict] | None = None) -> Iterator[Batch]:
    """Samples rank, rank + world, ... of ``split`` in order, in batches on ``device``: every sample
    is counted once whatever the world size. A sample that fails to load is replaced by the next that
    loads (harness/data/bad_samples.py) and added to ``failures``, where given."""
    if not is_streamed(split):
        mine = torch.arange(len(split))[rank::world]
        for start in range(0, len(mine), batch):
            idx = mine[start:start + batch]
            yield split.x[idx].to(device), split.y[idx].to(device)
        return
    # Seeded with fixed keys: a sample's randomness, if any, is the same at every evaluation, and an
    # evaluation in the training process leaves its generators as they were (resume stays exact).
    subset = torch.utils.data.Subset(Seeded(split), evaluation_keys(len(split), rank, world))
    loader = _loader(subset, device, workers, batch_size=batch, collate_fn=Collate(getattr(split, "collate", None)))
    yield from handed_out(iter(loader), lambda batches: to_device(batches, device, split),
                          failures if failures is not None else [])


class EvaluationSampler(torch.utils.data.Sampler):
    """``evaluation_batches``' keys for a persistent loader: batches of ``(index, index)`` for samples rank,
    rank + world, ... of n, in order. ``share`` = (rank, world) is set before each pass; None (while the
    loader processes start) is no sample at all."""

    def __init__(self, n: int, batch: int):
        self.n, self.batch = n, batch
        self.share: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if self.share is None:
            return
        keys = evaluation_keys(self.n, *self.share)
        for start in range(0, len(keys), self.batch):
            yield keys[start:start + self.batch]


class EvaluationBatches:
    """A validation split's ``evaluation_batches``, pass after pass (``__call__``), from loader processes
    forked once, when this is made, and kept for the run (a streamed split with ``workers``; otherwise
    each pass is ``evaluation_batches`` in this process).

    The training loop makes this before its communicator, because a fork once gloo runs can hang the
    run: a gloo thread that frees a finished collective's tensors takes the GIL from C++, and creating
    its thread state holds the interpreter's thread-state lock for an instant; a process forked then
    inherits the lock held and, on a CPython without the fix for gh-112275 (3.11.7 among them), waits
    for it forever before it runs a line. Its rank then waits for the first batch, and the others in the
    next collective."""

    def __init__(self, split: Any, batch: int, device: torch.device, workers: int):
        self.split, self.batch, self.device = split, batch, device
        self.sampler = EvaluationSampler(len(split), batch)
        self.loader = _loader(Seeded(split), device, workers, batch_sampler=self.sampler,
                              collate_fn=Collate(getattr(split, "collate", None))) \
            if is_streamed(split) and workers else None
        self._iterator = iter(self.loader) if self.loader is not None else None     # forks them, idle

    def __call__(self, rank: int, world: int, failures: list[dict]) -> Iterator[Batch]:
        """Share ``(rank, world)`` of the split; samples that fail to load are added to ``failures``."""
        if self.loader is None:
            return evaluation_batches(self.split, rank, world, self.batch, self.device, 0, failures)
        self.sampler.share = (rank, world)
        self._iterator = iter(self.loader)      # persistent workers: reused, told the new share
        return handed_out(self._iterator, lambda batches: to_device(batches, self.device, self.split), failures)

    def close(self) -> None:
        _shut_down(self._iterator)


def _shut_down(iterator: Any) -> None:
    """End a persistent loader's processes (an iterator of a loader without processes has nothing to end)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _loader(dataset: Any, device: torch.device, workers: int, **batching: Any) -> torch.utils.data.DataLoader:
    """A private generator: each new iterator draws a seed from it, which must not shift the
    training process's own generators (a validation pass would change the dropout that follows)."""
    return torch.utils.data.DataLoader(dataset, num_workers=workers, pin_memory=device.type == "cuda",
                                       persistent_workers=workers > 0 and "batch_sampler" in batching,
                                       prefetch_factor=4 if workers else None, generator=torch.Generator(),
                                       worker_init_fn=functools.partial(_end_with, os.getpid()), **batching)


def _end_with(trainer: int, worker_id: int) -> None:
    """A loader process ends with the training process ``trainer`` that started it: one killed
    outright (a dead rank, SIGKILL) would otherwise leave its loaders running until their watchdog
    looks, seconds later, and ``Train.py`` would end with processes of the run still alive."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != trainer:        # it died before prctl took effect
        os._exit(0)


def to_device(batches: Iterable[Any], device: torch.device, dataset: Any) -> Iterator[Batch]:
    """Batches on ``device``, as floats where they came as uint8 images. On a GPU the copy (and the
    conversion) of the next batch is issued on a side stream before the current one is handed out,
    so it overlaps the step; the step's stream waits only for its own batch's event. An (x, y) pair's x
    is scaled; any other batch (a dict, a tuple: harness/data/batch.py) has each of its tensors moved as
    it is."""
    scale = _normalizer(dataset.info, device)

    def move(batch: Any) -> Any:
        if not is_pair(batch):
            return tree_map(lambda t: t.to(device, non_blocking=True), batch)
        return scale(batch[0].to(device, non_blocking=True)), batch[1].to(device, non_blocking=True)

    if device.type != "cuda":
        yield from map(move, batches)
        return
    stream = torch.cuda.Stream(device)

    def issue(batch: Any) -> tuple[Any, torch.cuda.Event]:
        with torch.cuda.stream(stream):
            return move(batch), stream.record_event()

    ahead = None
    for batch in batches:
        ready, ahead = ahead, issue(batch)
        if ready is not None:
            yield _handed_over(*ready)
    if ahead is not None:
        yield _handed_over(*ahead)


def _handed_over(batch: Any, event: torch.cuda.Event) -> Batch:
    current = torch.cuda.current_stream()
    current.wait_event(event)
    for t in tensors(batch):
        t.record_stream(current)        # the side stream allocated them; the step's stream uses them
    return batch


def _normalizer(info: Any, device: torch.device):
    """uint8 images -> float: x / 255, then per-channel (x - mean) / std when the data defines them;
    images go channels_last on GPUs (the models there are channels_last). Other data passes as it is
    (uint8 token ids stay ids)."""
    if info.kind != "image":
        return lambda x: x
    mean = std = None
    if info.mean is not None:
        shape = (1, -1, 1, 1)
        mean = torch.tensor(info.mean, device=device).view(shape) * 255
        std = torch.tensor(info.std, device=device).view(shape) * 255

    def scale(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        if device.type == "cuda" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)       # arithmetic below keeps the layout
        x = x.float()
        return (x - mean) / std if mean is not None else x / 255
    return scale
