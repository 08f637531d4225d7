"""MNIST from the official IDX files (optionally gzipped) in data_dir."""

import gzip

import numpy as np
import torch

from .files import find_file
from .split import DataInfo, Split

SOURCE = "http://yann.lecun.com/exdb/mnist/"
INFO = DataInfo("image", (1, 28, 28), 10, tuple(str(d) for d in range(10)))
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def load_mnist(data_dir: str | None, seed: int) -> tuple[Split, Split]:
    """The standard 60k/10k split; `seed` is ignored."""
    return _load_split(data_dir, "train"), _load_split(data_dir, "t10k")


def _load_split(data_dir: str | None, prefix: str) -> Split:
    images = _read_idx(data_dir, f"{prefix}-images-idx3-ubyte", IMAGES_MAGIC)
    labels = _read_idx(data_dir, f"{prefix}-labels-idx1-ubyte", LABELS_MAGIC)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, *INFO.input_shape)
    return Split(x, torch.from_numpy(labels.astype(np.int64)), INFO)


def _read_idx(data_dir: str | None, name: str, magic: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes: big-endian magic, one int32 per dimension, then the data."""
    path = find_file(data_dir, [name, f"{name}.gz"], "mnist", SOURCE)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"'{path}' has IDX magic {found}, expected {magic}; is it the right (uncorrupted) file?")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">i4", count=ndim, offset=4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)
