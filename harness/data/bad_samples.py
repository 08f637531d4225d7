"""Samples that fail to load or decode (a corrupt JPEG, a truncated file): skipped, replaced, named, counted.

A scraped data set always holds a few such files, and one of them must not end a run that has trained
for hours. So:

* ``fetch`` (in the loader processes): a sample whose ``dataset[i]`` raises one of ``LOAD_ERRORS`` is
  replaced by the first of i + 1, i + 2, ... (mod n) that loads, drawn under the same seed. The
  replacement is a function of the index and the files alone, never of timing or of which loader
  process met the file, so the batches, and a resume, stay exact.
* A loader process can tell the training process nothing except through the batches it returns, so
  the failures travel with them: ``Collate`` returns (batch, failures), and ``handed_out`` adds each
  batch's failures to a list as that batch leaves the pipeline (not when it is read ahead), so what
  the loop takes is what it trained on.
* ``Tally`` (in the training loop): every ``EXCHANGE_EVERY`` updates the ranks gather what they met
  through the parent (``ctx.exchange``). That is a round trip on the host, which the GPU, some updates
  behind, does not wait for; a count all-reduced every update would put a collective on every step for
  an event that rarely happens. Every rank then knows the run's count and decides the same stop at the
  same update, and rank 0 logs each failure as a ``bad_sample`` record (other ranks cannot: the
  parent reads rank 0). Past ``--max-bad-samples`` distinct samples (a file met every epoch counts
  once) the run stops, saves, and ends with the list (``TooManyBadSamples``).
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Iterator

import torch

from harness.checkout.datasets.split import DataError

# What decoders and file reads raise: OSError (missing files, Pillow's "cannot identify"), ValueError
# (simplejpeg, numpy, DataError), SyntaxError (Pillow's broken headers), EOFError (truncated files),
# RuntimeError (torchvision's decoders). Anything else (TypeError, KeyError, ...) is a bug: it propagates.
LOAD_ERRORS = (OSError, ValueError, SyntaxError, EOFError, RuntimeError)
EXCHANGE_EVERY = 16         # updates between gatherings of the ranks' bad samples
SHOWN = 10                  # bad samples an error names; the log has them all


class TooManyBadSamples(DataError):
    """More bad samples than --max-bad-samples: raised once the run has stopped and saved."""


def fetch(dataset: Any, index: int, prepare: Callable[[], None] = lambda: None,
          tries: int | None = None) -> tuple[Any, list[dict]]:
    """(``dataset[index]``, []), or where that fails to load, the first of index + 1, index + 2, ...
    (mod n) that loads and the failures before it (``describe``); ``prepare()`` (seeding) runs before
    each try, so a replacement draws what it would have drawn in the failed sample's place. Past
    ``tries`` failures (default: every sample) raises a one-line DataError naming them."""
    failures: list[dict] = []
    n = len(dataset)
    for step in range(min(tries or n, n)):
        prepare()
        try:
            return dataset[(index + step) % n], failures
        except LOAD_ERRORS as error:
            failures.append(describe(dataset, (index + step) % n, error))
    many = f"{len(failures)} samples in a row, from index {index} on, do not" if len(failures) > 1 else \
        f"sample {index} does not"
    raise DataError(f"{many} load: {listing(failures)}")


def describe(dataset: Any, index: int, error: BaseException) -> dict:
    """A failure as the log records it: the file (``dataset.path(index)`` where the dataset has one), else
    the index, and the error."""
    path = dataset.path(index) if callable(getattr(dataset, "path", None)) else None
    place = {"path": str(path)} if path is not None else {"index": index}
    return {**place, "error": getattr(error, "reason", None) or f"{type(error).__name__}: {error}"}


def listing(failures: list[dict]) -> str:
    """Failures as one line, "where: error; ...", the first SHOWN of them."""
    shown = "; ".join(f"{where(f)}: {f['error']}" for f in failures[:SHOWN])
    return shown + (f"; and {len(failures) - SHOWN} more" if len(failures) > SHOWN else "")


def where(failure: dict) -> str:
    """The failed sample's file, else its split and index."""
    if "path" in failure:
        return failure["path"]
    return " ".join(filter(None, (failure.get("split"), f"sample {failure['index']}")))


def _key(failure: dict) -> tuple:
    return failure.get("split"), failure.get("path"), failure.get("index")


class RunCount:
    """The run's distinct bad samples from the records every worker reports (--mode async's server counts
    them, harness/collectives/server.py: each worker's ``Tally`` counts alone, so ranks past the limit
    together, none alone, are stopped there). ``past(record)``: whether the run is now past ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.seen = limit, set()

    def past(self, record: dict) -> bool:
        if record.get("event") == "bad_sample":
            self.seen.add(_key(record))
        return len(self.seen) > self.limit


class Collate:
    """The loader's collate over ``fetch``'s (sample, failures) pairs: the dataset's own collate (torch's
    default where it has none) over the samples, and their failures beside the batch."""

    def __init__(self, collate: Callable[[list], Any] | None = None):
        self.collate = collate or torch.utils.data.default_collate

    def __call__(self, fetched: list[tuple[Any, list[dict]]]) -> tuple[Any, list[dict]]:
        return self.collate([sample for sample, _ in fetched]), [f for _, failures in fetched for f in failures]


def handed_out(loaded: Iterable[tuple[Any, list[dict]]], move: Callable[[Iterator], Iterator[Any]],
               failures: list[dict]) -> Iterator[Any]:
    """``move``'s batches (``to_device``, which reads one ahead on GPUs) of the loader's (batch, failures)
    pairs; each batch's failures join ``failures`` as that batch is handed out."""
    arrived: collections.deque = collections.deque()

    def batches() -> Iterator[Any]:
        for batch, met in loaded:
            arrived.append(met)
            yield batch

    for batch in move(batches()):
        failures.extend(arrived.popleft())
        yield batch


class Tally:
    """The run's bad samples on one rank: ``add`` what this rank met, ``after_update`` each update (it
    gathers every rank's every EXCHANGE_EVERY updates), ``gather`` at the run's end, ``check`` once
    the stop is saved. ``limit``: the distinct bad samples a run may skip. ``alone``: this rank counts
    only its own and gathers with nobody while the run goes on (--mode async, whose workers must never wait for
    each other), logging its own through ``report`` (a record for metrics.jsonl: async's workers reach it
    through the server, which counts the run's with ``RunCount`` and stops the run past the limit); at the run's
    end, where every worker stands at the server's final release, the ranks gather their counts, so the verdict
    and rank 0's error name every rank's."""

    def __init__(self, ctx: Any, limit: int, alone: bool = False, report: Callable[[dict], None] | None = None):
        self.ctx, self.limit, self.alone = ctx, limit, alone
        self.report = report or ctx.send
        self.mine: list[dict] = []                   # met on this rank since the last gathering
        self.distinct: dict[tuple, dict] = {}        # every rank's, each sample once

    def add(self, split: str, update: int, failures: list[dict]) -> None:
        """``failures`` met in ``split`` by ``update`` (the update whose batch held them, or after which
        validation ran)."""
        self.mine += [{"split": split, "update": update, **failure} for failure in failures]

    def after_update(self, step: int, batches: Any) -> str | None:
        """Take the training batches' failures (``batches.failures``, where it has them); at every
        EXCHANGE_EVERY-th update, ``gather``."""
        handed = getattr(batches, "failures", None)
        if handed:
            self.add("train", step, handed)
            handed.clear()
        return self.gather(step) if step % EXCHANGE_EVERY == 0 else None

    def gather(self, step: int, final: bool = False) -> str | None:
        """Every rank's failures since the last gathering (every rank calls this at the same update,
        ``step``; alone, this rank's own, and every rank's count too where ``final``); each failure is logged
        once, by rank 0 (alone: by the rank that met it). Returns why the run must stop, or None."""
        mine, self.mine = self.mine, []
        if self.ctx.world_size == 1 or self.alone:
            every = {self.ctx.rank: mine}
        else:
            every = dict(enumerate(self.ctx.exchange(self.ctx.unique_tag("bad-samples"), mine)))
        for rank, failures in every.items():
            for failure in failures:
                self.distinct.setdefault(_key(failure), failure)
                if self.ctx.rank == 0 or self.alone:
                    self.report({"event": "bad_sample", "step": step, "rank": rank, **failure})
                    self.ctx.print(f"skipped a bad sample (update {failure['update']}): {where(failure)}: "
                                   f"{failure['error']}")
        if final and self.alone and self.ctx.world_size > 1:
            for seen in self.ctx.exchange(self.ctx.unique_tag("bad-samples"), list(self.distinct.values())):
                for failure in seen:
                    self.distinct.setdefault(_key(failure), failure)
        if len(self.distinct) > self.limit:
            return f"{len(self.distinct)} bad samples, more than --max-bad-samples {self.limit}"
        return None

    def check(self, save: str | None) -> None:
        """Past the limit, the error that ends the run, with the list: called once the stop is saved, and
        raised by rank 0 alone, which wrote the checkpoint (the parent stops the group at the first error,
        and a peer's could come while rank 0 still writes)."""
        if len(self.distinct) <= self.limit or self.ctx.rank != 0:
            return
        resume = f", and continue with --resume {save}" if save else ""
        raise TooManyBadSamples(f"{len(self.distinct)} bad samples, more than --max-bad-samples {self.limit}: "
                                f"{listing(list(self.distinct.values()))}; fix or delete them, or raise "
                                f"--max-bad-samples{resume} (metrics.jsonl names every one)")
