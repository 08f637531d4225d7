"""CIFAR-10 from the official python-pickle batches."""

import pickle
from pathlib import Path

import numpy as np
import torch

from .files import find_file
from .split import DataInfo, Split

SOURCE = "https://www.cs.toronto.edu/~kriz/cifar.html (CIFAR-10 python version)"
SUBDIR = "cifar-10-batches-py"  # the folder the official archive unpacks to
SHAPE = (3, 32, 32)
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))


def load_cifar10(data_dir: str | None, seed: int) -> tuple[Split, Split]:
    """The standard 50k/10k split; `seed` is ignored. Accepts data_dir or data_dir/cifar-10-batches-py."""
    info = DataInfo("image", SHAPE, 10, _class_names(data_dir))
    train = [_read_batch(data_dir, name) for name in TRAIN_BATCHES]
    test_x, test_y = _read_batch(data_dir, "test_batch")
    return (
        Split(torch.cat([x for x, _ in train]), torch.cat([y for _, y in train]), info),
        Split(test_x, test_y, info),
    )


def _unpickle(path: Path) -> dict:
    """The official batches were pickled by Python 2, so keys come back as bytes; accept str keys too."""
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}


def _read_batch(data_dir: str | None, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    batch = _unpickle(find_file(data_dir, [name, f"{SUBDIR}/{name}"], "cifar10", SOURCE))
    data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, *SHAPE)
    x = torch.from_numpy(data.astype(np.float32) / 255.0)
    return x, torch.tensor(batch["labels"], dtype=torch.int64)


def _class_names(data_dir: str | None) -> tuple[str, ...]:
    try:
        meta = _unpickle(find_file(data_dir, ["batches.meta", f"{SUBDIR}/batches.meta"], "cifar10", SOURCE))
    except FileNotFoundError:
        return CLASS_NAMES
    return tuple(n.decode() if isinstance(n, bytes) else n for n in meta["label_names"])
