"""Dataset registry.

In memory (small, built whole in each worker): cifar10, digits, mnist, oddeven, synthetic; their
loaders return a (train, test) pair of Splits. Streamed from disk (each worker reads only the
samples of its shard): imagefolder and tokens, and ``package.module:factory`` for a Dataset class
of your own; these return map-style torch Datasets that carry a ``DataInfo`` as ``.info``.
``open_data`` gives a run its train / validation / test splits, ``check_data`` the cheap facts rank 0
checks before any worker trains, ``describe_test`` what validation and Test.py evaluate. The loaders are
imported (with torch) at their first call: the parent checks a dataset's name without torch.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from harness.plugins import imported_on_call
from harness.spelling import did_you_mean

if TYPE_CHECKING:
    from .split import DataInfo, Split

__all__ = ["DATASETS", "FOLDERLESS", "STREAMED", "Data", "DataError", "DataInfo", "Facts", "Split", "check_data",
           "dataset_names", "decode_oddeven", "describe_test", "holds_out", "load_dataset", "open_data"]

DATASETS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "cifar10": imported_on_call(f"{__name__}.cifar10", "load_cifar10"),
    "digits": imported_on_call(f"{__name__}.digits", "load_digits"),
    "mnist": imported_on_call(f"{__name__}.mnist", "load_mnist"),
    "oddeven": imported_on_call(f"{__name__}.oddeven", "load_oddeven"),
    "synthetic": imported_on_call(f"{__name__}.synthetic", "load_synthetic"),
}
STREAMED: dict[str, Callable[..., tuple[Any, Any]]] = {
    "imagefolder": imported_on_call(f"{__name__}.imagefolder", "open_imagefolder"),
    "tokens": imported_on_call(f"{__name__}.tokens", "open_tokens"),
}
FOLDERLESS = ("digits", "oddeven", "synthetic")     # bundled or generated: they read no --data-dir
_ELSEWHERE = {"DataError": "split", "DataInfo": "split", "Split": "split", "decode_oddeven": "oddeven"}


def __getattr__(name: str) -> Any:
    """The containers and helpers of the submodules, imported (with torch) at their first use."""
    if name not in _ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_ELSEWHERE[name]}"), name)


@dataclass
class Data:
    """A run's splits. Streamed datasets validate and test on their own val split."""

    train: Any                  # Split, or a map-style Dataset with .info
    val: Any | None
    test: Any | None

    @property
    def info(self) -> DataInfo:
        return self.train.info


class Facts(NamedTuple):
    """What ``check_data`` found: the checks go on from it without opening the data again."""

    info: DataInfo
    samples: int                # in the training split
    validated: bool             # whether the run has a validation split
    train: Any | None           # the training split it opened (None for synthetic data, described only)


def dataset_names() -> list[str]:
    return sorted([*DATASETS, *STREAMED])


def is_known(name: str) -> bool:
    return name in DATASETS or name in STREAMED or ":" in name


def unknown(name: str) -> str:
    """Why ``name`` names no dataset, with the closest that it may have meant."""
    return (f"unknown dataset '{name}'{did_you_mean(name, dataset_names())}; valid names: "
            f"{', '.join(dataset_names())}, or package.module:factory")


def holds_out(name: str, data_dir: str | None) -> bool:
    """Whether ``val_fraction`` decides the validation split: in-memory datasets and an image folder without
    val/ hold part of train out; tokens validate on val.bin, an image folder on its val/, a factory on its own
    'val' split."""
    if name == "imagefolder":
        return not (Path(data_dir or ".") / "val").is_dir()
    return name in DATASETS


def load_dataset(name: str, /, data_dir: str | None = None, seed: int = 0, **options) -> tuple[Split, Split]:
    """Load the in-memory dataset `name`; options go to its loader (e.g. synthetic's shape, size, tokens)."""
    if name not in DATASETS:
        raise ValueError(unknown(name))
    _refuse_unknown(name, DATASETS[name], options)
    return DATASETS[name](data_dir, seed, **options)


def _refuse_unknown(name: str, loader: Callable[..., Any], options: dict[str, Any]) -> None:
    """--dataset-options a built-in dataset does not take, refused naming the ones it does (a typo was the loader's
    own TypeError, which named a function of ours rather than the flag)."""
    from .split import DataError
    real = getattr(importlib.import_module(loader.__module__), loader.__name__)     # behind imported_on_call
    params = inspect.signature(real).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    taken = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL and n not in ("data_dir", "seed",
                                                                                          "val_fraction")]
    unknown = [key for key in options if key not in taken]
    if unknown:
        raise DataError(f"--dataset-options: --dataset {name} has no option {unknown[0]!r}"
                        + did_you_mean(unknown[0], taken)
                        + (f"; its options: {', '.join(taken)}" if taken else "; it takes none"))


def open_data(name: str, /, data_dir: str | None = None, seed: int = 0, val_fraction: float = 0.0,
              **options) -> Data:
    """The run's splits: in-memory ones hold out the last ``val_fraction`` of train for validation."""
    from .split import Split
    if name in DATASETS:
        train, test = load_dataset(name, data_dir, seed, **options)
        cut = len(train) - int(len(train) * val_fraction)
        if cut == len(train):
            return Data(train, None, test)
        return Data(Split(train.x[:cut], train.y[:cut], train.info),
                    Split(train.x[cut:], train.y[cut:], train.info), test)
    if name in STREAMED:
        _refuse_unknown(name, STREAMED[name], options)
        train, val = STREAMED[name](data_dir, seed=seed, val_fraction=val_fraction, **options)
    elif ":" in name:
        from .custom import open_custom
        train, val = open_custom(name, data_dir, seed, **options)
    else:
        raise ValueError(unknown(name))
    return Data(train, val, val)


def check_data(name: str, /, data_dir: str | None = None, seed: int = 0, val_fraction: float = 0.0,
               max_bad_samples: int = 0, **options) -> Facts:
    """The data's facts without loading a streamed dataset: it is scanned and the first sample of each split
    that loads is decoded (up to ``max_bad_samples`` before it are skipped, named on stderr, as training skips
    them); synthetic data is described, not generated. Raises one-line errors."""
    from .split import DataError
    if name == "synthetic":
        from .synthetic import describe_synthetic
        _refuse_unknown(name, describe_synthetic, options)
        info, size = describe_synthetic(**options)
        return Facts(info, size - int(size * val_fraction), val_fraction > 0, None)
    data = open_data(name, data_dir, seed, val_fraction, **options)
    if name in DATASETS:
        return Facts(data.info, len(data.train), data.val is not None, data.train)
    from harness.data.bad_samples import fetch, listing      # harness.data imports this package
    for split in (data.train, data.val):
        if split is not None:
            if len(split) == 0:
                raise DataError(f"dataset {name}: a split of {data_dir or 'the factory'} has no samples")
            try:
                _, skipped = fetch(split, 0, tries=max_bad_samples + 1)
            except DataError as error:
                raise DataError(f"dataset {name}: {error} (--max-bad-samples {max_bad_samples})") from None
            if skipped:
                print(f"dataset {name}: skipping bad samples (--max-bad-samples {max_bad_samples}): "
                      f"{listing(skipped)}", file=sys.stderr)
            if hasattr(split, "check"):
                split.check(len(skipped))       # a dataset's own check, of the sample that loaded
    return Facts(data.info, len(data.train), data.val is not None, data.train)


def describe_test(name: str, data_dir: str | None = None, val_fraction: float = 0.0) -> str:
    """What validation and Test.py evaluate, in words, without opening the data."""
    if name == "imagefolder":
        from .imagefolder import validation_source
        return validation_source(data_dir, val_fraction)
    if name == "tokens":
        return f"{data_dir}/val.bin"
    return "the factory's 'val' split" if ":" in name else "the test split"
