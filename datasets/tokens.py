"""Token files in nanoGPT's layout: ``train.bin`` and ``val.bin``, raw token ids (uint16 or uint32).

The file is memory-mapped (numpy over ``mmap``, which is what ``numpy.memmap`` is) and never read
whole: sample ``i`` is the window of ``block_size + 1`` tokens starting at ``i * block_size``
(inputs are its first ``block_size`` tokens, targets the last). The sampler shuffles the window
indices, which gives nanoGPT's random windows with an exact, resumable order. The map is opened
lazily in each process that reads (loader workers included) and is never pickled.

Mapped pages count as the process's resident memory, and a fault maps more than the window: the
kernel maps whole page-cache folios (up to 2 MB) and the pages around them. Read at random, a 5 GB
file then piles gigabytes of mapped pages onto each worker (measured: +2.4 GB after 60 GPT-2
steps). So after copying a window out, its aligned surroundings are unmapped again (MADV_DONTNEED:
the page cache keeps the data, only this process's mapping goes), and a worker's memory stays the
same whatever the file's size.

Checks that catch the usual mistakes before a run starts: a size that is not a multiple of the
dtype's, a file too short for one window, token ids at or above the vocabulary (a uint16 file read
as uint32 makes huge ids), a uint32 file read as uint16 (every other uint16 is then zero), and int64 ids
(``np.array(ids).tofile``'s default), which tokens does not read (3 of every 4 uint16 are zero).
"""
from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import torch

from .split import DataError, DataInfo, SampleError

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
PROBE_TOKENS = 1 << 20            # how much of a file the checks read
RELEASE_ALIGN = 2 << 20           # unmap around each window at this alignment (the largest folio)


class TokenWindows(torch.utils.data.Dataset):
    """Windows of ``block_size + 1`` tokens of one file; ``limit`` keeps that many, evenly spread."""

    def __init__(self, path: Path, block_size: int, dtype: str, vocab_size: int, limit: int | None = None):
        self.path, self.block_size, self.dtype = path, block_size, dtype
        size = path.stat().st_size
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        if size % itemsize:
            raise DataError(f"tokens: {path} has {size} bytes, not a multiple of {itemsize} ({dtype}); "
                            "is the dtype option right, or is the file truncated?")
        windows = (size // itemsize - 1) // block_size
        if windows < 1:
            raise DataError(f"tokens: {path} holds {size // itemsize} tokens, fewer than one window of "
                            f"block_size + 1 = {block_size + 1}; use a longer file or a smaller block_size")
        self.stride = max(1, windows // limit) if limit else 1
        self.windows = min(windows, limit) if limit else windows
        self.info = DataInfo("tokens", (block_size,), vocab_size)
        self.size = size
        self._map: mmap.mmap | None = None
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.windows

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None, "_tokens": None}

    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            with open(self.path, "rb") as file:
                self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self._map.madvise(mmap.MADV_RANDOM)
            self._tokens = np.frombuffer(self._map, dtype=DTYPES[self.dtype])
        return self._tokens

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.stride * self.block_size
        end = start + self.block_size + 1
        window = torch.from_numpy(self.tokens()[start:end].astype(np.int64))
        itemsize = self._tokens.itemsize
        low = start * itemsize // RELEASE_ALIGN * RELEASE_ALIGN
        high = min(self.size, -(-end * itemsize // RELEASE_ALIGN) * RELEASE_ALIGN)
        self._map.madvise(mmap.MADV_DONTNEED, low, high - low)
        top = int(window.max())
        if top >= self.info.num_classes:       # past the ids ``check`` read: a bad sample, skipped and logged
            at = start + int(window.argmax())
            beyond = f"{self.path} has token id {top} >= vocab_size {self.info.num_classes} at token {at}"
            raise SampleError(f"tokens: {beyond}; pass the right vocab_size", reason=beyond)
        return window[:-1], window[1:]

    def check(self, index: int = 0) -> None:
        """Read the first tokens (at most PROBE_TOKENS), refusing ids written wider than read and ids the model
        could not embed, then window ``index``."""
        probe = np.asarray(self.tokens()[:PROBE_TOKENS])
        wider = _written_wider(probe, self.dtype)
        if wider == "uint32":
            raise DataError(f"tokens: every other uint16 of {self.path} is zero: it looks like uint32 ids; "
                            "pass --dataset-options '{\"dtype\": \"uint32\"}'")
        if wider == "int64":
            raise DataError(f"tokens: {self.path} looks like int64 ids (read as {self.dtype}, only one value in "
                            f"{8 // probe.itemsize} is not zero), numpy's default integer, which tokens does not read; "
                            "write them as uint16 (ids below 65536) or uint32: "
                            "np.asarray(ids, dtype=np.uint16).tofile(path)")
        top = int(probe.max())
        if top >= self.info.num_classes:
            raise DataError(f"tokens: {self.path} has token id {top} >= vocab_size {self.info.num_classes}; "
                            f"pass the right vocab_size (and dtype: this file was read as {self.dtype})")
        self[index]


def _written_wider(probe: np.ndarray, dtype: str) -> str | None:
    """The wider integer the ids were written as, where ``probe`` (read as ``dtype``) has only zeros between
    every 2nd or 4th value: the high halves of little-endian uint32 or int64 ids."""
    for wider in ("int64", "uint32"):
        stride = np.dtype(wider).itemsize // np.dtype(DTYPES[dtype]).itemsize
        if stride > 1 and len(probe) >= 32 * stride and probe[0::stride].max() > 0 \
                and all(probe[k::stride].max() == 0 for k in range(1, stride)):
            return wider
    return None


def open_tokens(data_dir: str | None, seed: int = 0, val_fraction: float = 0.0, block_size: int = 256,
                dtype: str = "uint16", vocab_size: int = 50257, val_windows: int = 512) -> tuple[TokenWindows, TokenWindows]:
    """(train, val) from ``data_dir``/train.bin and val.bin; validation uses ``val_windows`` windows
    (``seed`` and ``val_fraction``, which carve an image folder's validation, are not used: val.bin is it)."""
    if data_dir is None:
        raise DataError("--dataset tokens needs --data-dir DIR holding DIR/train.bin and DIR/val.bin")
    if dtype not in DTYPES:
        raise DataError(f"tokens: dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if block_size < 1 or vocab_size < 2 or val_windows < 1:
        raise DataError(f"tokens: block_size={block_size}, vocab_size={vocab_size} and val_windows={val_windows} "
                        "must be at least 1, 2 and 1")
    splits = []
    for name, limit in (("train.bin", None), ("val.bin", val_windows)):
        path = Path(data_dir) / name
        if not path.is_file():
            raise FileNotFoundError(f"tokens: {path} does not exist; write the token ids there as raw {dtype} "
                                    "(nanoGPT's prepare.py layout: train.bin and val.bin)")
        splits.append(TokenWindows(path, block_size, dtype, vocab_size, limit))
    return splits[0], splits[1]
