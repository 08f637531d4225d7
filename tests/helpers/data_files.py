"""Small data files for the streamed-dataset tests: JPEG folders and token files, made on the spot."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def make_image_folder(root: Path, classes: int = 3, per_class: int = 8, val_per_class: int = 2,
                      size: tuple[int, int] = (40, 30)) -> Path:
    """root/train/c<k>/*.jpg and root/val/c<k>/*.jpg: each class a colour ramp in its own direction
    plus noise, so a small model can tell them apart."""
    from PIL import Image
    rng = np.random.default_rng(0)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"c{label}"
            folder.mkdir(parents=True, exist_ok=True)
            angle = np.pi * label / classes
            ramp = (np.cos(angle) * xx / width + np.sin(angle) * yy / height + 1) * 100
            for i in range(count):
                pixels = ramp[..., None] + rng.normal(0, 20, (height, width, 3)) + [60 * label, 0, 30]
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i:03d}.jpg", quality=85)
    return root


def make_token_files(root: Path, train_tokens: int = 20_000, val_tokens: int = 4_000, vocab: int = 64,
                     dtype: str = "uint16") -> Path:
    """root/train.bin and root/val.bin: a repeating pattern with noise (predictable enough to learn)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", train_tokens), ("val.bin", val_tokens)):
        tokens = (np.arange(n) * 7 + rng.integers(0, 2, n)) % vocab
        tokens.astype(dtype).tofile(root / name)
    return root
