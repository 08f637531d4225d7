"""The containers every dataset loader returns, kept apart so loaders can import them."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class DataError(ValueError):
    """A data file or folder that cannot be used; the message names it and what to do."""


class SampleError(DataError):
    """One sample that cannot be loaded (a corrupt or truncated file): the message names it and the fix,
    ``reason`` says only what is wrong, for the log's record, which names the file apart."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know to fit the data without seeing it."""

    kind: str  # "image" (x: float32 N,C,H,W), "vector" (x: float32 N,D), "tokens" (x, y: int64 N,T), or
    # "dict" / "tuple" for samples of keyword / positional inputs (num_classes 0 where it means nothing)
    input_shape: tuple[int, ...]
    num_classes: int  # vocabulary size for tokens
    class_names: tuple[str, ...] = ()
    # Images that travel as uint8 (streamed datasets) become floats on the device: x / 255, then
    # (x - mean) / std per channel when these are given.
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


def other_classes(trained: Sequence[str], found: Sequence[str]) -> str:
    """How the data's class names (``found``) differ from those a model was trained on, in a phrase; "" where they
    do not, or where either names none."""
    trained, found = [str(name) for name in trained], [str(name) for name in found]     # as the config keeps them
    if not trained or not found or trained == found:
        return ""
    if len(trained) != len(found):
        return f"{len(found)} classes are not the {len(trained)} it was trained on (a class folder added or removed?)"
    i = next(i for i, (a, b) in enumerate(zip(trained, found)) if a != b)
    return (f"class {i} is {found[i]!r}, where it was trained on {trained[i]!r} (class folders renamed? their names, "
            "sorted, give the labels)")


@dataclass
class Split:
    """One whole split held in memory: the datasets here are small enough to index directly."""

    x: torch.Tensor
    y: torch.Tensor
    info: DataInfo

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} samples but y has {len(self.y)}; they must match")

    def __len__(self) -> int:
        return len(self.x)
