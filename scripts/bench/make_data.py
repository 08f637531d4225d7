"""Data for the input-pipeline benchmark (scripts/bench/data.py), made on the spot so that it needs
no download: a folder of JPEGs laid out as ImageNet is (what torchvision's ImageFolder reads), and
nanoGPT-style token files (train.bin and val.bin, raw little-endian uint16 token ids).

An input pipeline's cost is set by the bytes to read and decode and the pixels to augment, not by
what the pictures show, so the images only need ImageNet's shape and weight: 500 x 375 pixels (its
most common size) and about as many bytes as its training JPEGs (147.9 GB over 1.28 M files, about
115 KB each). Each image is a seeded mix of smooth colour gradients, rectangles and ellipses, and
per-pixel noise; the noise is what makes a JPEG heavy. At quality 90 the median file is 119 KB
(first 50 images: 102 to 131 KB; 117 KB over 50 000), and one image takes 7.6 ms of one CPU core:
50 000 took 14 s on 32 cores, 5 GB of tokens 25 s (2026-11-22). Everything is deterministic from
the image's index.

A finished folder holds a `.complete` file with the parameters it was made with; a second call with
the same parameters returns at once, so benchmark runs reuse the data.

    python -m scripts.bench.make_data jpeg /tmp/harness-bench-data/jpeg --images 50000
    python -m scripts.bench.make_data tokens /tmp/harness-bench-data/tokens --train-gb 5
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

MARKER = ".complete"
SPLITS = ("train", "val")
CHUNK = 256                    # images per task handed to a pool process
TOKEN_CHUNK_BYTES = 64 << 20   # token files are written 64 MiB at a time


def reuse(root: Path, params: dict) -> dict | None:
    """The stats of a finished earlier run with the same parameters, else None."""
    try:
        record = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return {**record["stats"], "reused": True} if record.get("params") == params else None


def finish(root: Path, params: dict, stats: dict) -> dict:
    (root / MARKER).write_text(json.dumps({"params": params, "stats": stats}, indent=2) + "\n")
    return {**stats, "reused": False}


def start_over(root: Path, names: tuple[str, ...]) -> None:
    """Remove the marker first (an interrupted run must not look finished), then the old data."""
    (root / MARKER).unlink(missing_ok=True)
    for name in names:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)


# -- JPEGs ---------------------------------------------------------------------------------------

def picture(seed: tuple[int, int], width: int, height: int):
    """One structured RGB image (a PIL Image) from a seed: gradients, shapes, noise."""
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)      # smooth gradients: a 4 x 3 grid of
    image = Image.fromarray(grid).resize((width, height), Image.Resampling.BICUBIC)   # colours, enlarged
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, x1 = sorted(rng.integers(0, width, 2))
        y0, y1 = sorted(rng.integers(0, height, 2))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((int(x0), int(y0), int(x1), int(y1)), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    amplitude = int(rng.integers(35, 70))     # uniform noise of standard deviation 20 to 40
    noisy = np.asarray(image, dtype=np.int16) + rng.integers(-amplitude, amplitude + 1, (height, width, 3),
                                                             dtype=np.int16)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def image_path(root: Path, split: str, index: int, classes: int) -> Path:
    """Image `index` of a split goes to class index % classes: classes hold equal shares."""
    label = f"n{index % classes:05d}"
    return root / split / label / f"{label}_{index // classes:06d}.jpg"


def write_images(task: tuple) -> list[int]:
    """Pool task: write images [start, stop) of one split; returns their sizes in bytes."""
    root, split, start, stop, classes, width, height, quality = task
    sizes = []
    for index in range(start, stop):
        path = image_path(root, split, index, classes)
        picture((SPLITS.index(split), index), width, height).save(path, "JPEG", quality=quality)
        sizes.append(path.stat().st_size)
    return sizes


def make_jpeg_folder(root: Path, images: int = 50_000, classes: int = 1000, val_per_class: int = 2,
                     width: int = 500, height: int = 375, quality: int = 90,
                     processes: int | None = None) -> dict:
    """root/train/<class>/*.jpg (`images` spread evenly over `classes`) and root/val/<class>/*.jpg
    (`val_per_class` each). Returns counts, total bytes, median file size and seconds taken."""
    root = Path(root)
    params = {"images": images, "classes": classes, "val_per_class": val_per_class, "width": width,
              "height": height, "quality": quality}
    if (found := reuse(root, params)) is not None:
        return found
    start = time.perf_counter()
    start_over(root, SPLITS)
    counts = {"train": images, "val": val_per_class * classes}
    for split in SPLITS:
        for label in range(classes):
            (root / split / f"n{label:05d}").mkdir(parents=True)
    tasks = [(root, split, first, min(first + CHUNK, counts[split]), classes, width, height, quality)
             for split in SPLITS for first in range(0, counts[split], CHUNK)]
    with multiprocessing.Pool(processes or os.cpu_count()) as pool:
        sizes = [size for chunk in pool.imap_unordered(write_images, tasks) for size in chunk]
    stats = {"train_images": counts["train"], "val_images": counts["val"], "classes": classes,
             "bytes": sum(sizes), "median_bytes": int(statistics.median(sizes)) if sizes else 0,
             "seconds": round(time.perf_counter() - start, 2)}
    return finish(root, params, stats)


# -- tokens --------------------------------------------------------------------------------------

def write_tokens(path: Path, count: int, dtype: np.dtype, vocab_size: int, stream: int) -> None:
    """`count` seeded random token ids below vocab_size, written chunk by chunk (little memory)."""
    per_chunk = TOKEN_CHUNK_BYTES // dtype.itemsize
    with path.open("wb") as file:
        for number, first in enumerate(range(0, count, per_chunk)):
            rng = np.random.default_rng((stream, number))
            rng.integers(0, vocab_size, min(per_chunk, count - first), dtype=dtype).tofile(file)


def make_token_files(root: Path, train_gb: float = 5.0, val_mb: float = 50, dtype: str = "uint16",
                     vocab_size: int = 50257) -> dict:
    """root/train.bin (train_gb x 1e9 bytes) and root/val.bin (val_mb x 1e6 bytes) of raw
    little-endian token ids below vocab_size, nanoGPT's layout. Returns sizes and seconds taken."""
    root = Path(root)
    kind = np.dtype(dtype).newbyteorder("<")
    if vocab_size - 1 > np.iinfo(kind).max:
        raise ValueError(f"vocab_size {vocab_size} does not fit in {dtype}")
    params = {"train_gb": train_gb, "val_mb": val_mb, "dtype": dtype, "vocab_size": vocab_size}
    if (found := reuse(root, params)) is not None:
        return found
    start = time.perf_counter()
    start_over(root, ("train.bin", "val.bin"))
    sizes = {"train.bin": int(train_gb * 1e9), "val.bin": int(val_mb * 1e6)}
    for stream, (name, size) in enumerate(sizes.items()):
        write_tokens(root / name, size // kind.itemsize, kind, vocab_size, stream)
    stats = {f"{name.split('.')[0]}_bytes": (root / name).stat().st_size for name in sizes}
    stats["seconds"] = round(time.perf_counter() - start, 2)
    return finish(root, params, stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    jpeg = sub.add_parser("jpeg", help="an ImageNet-like folder of JPEGs")
    jpeg.add_argument("root", type=Path)
    jpeg.add_argument("--images", type=int, default=50_000, help="training images (default 50000)")
    jpeg.add_argument("--classes", type=int, default=1000)
    jpeg.add_argument("--val-per-class", type=int, default=2)
    jpeg.add_argument("--width", type=int, default=500)
    jpeg.add_argument("--height", type=int, default=375)
    jpeg.add_argument("--quality", type=int, default=90)
    jpeg.add_argument("--processes", type=int, help="pool size (default: every CPU)")
    tokens = sub.add_parser("tokens", help="nanoGPT-style train.bin and val.bin")
    tokens.add_argument("root", type=Path)
    tokens.add_argument("--train-gb", type=float, default=5.0)
    tokens.add_argument("--val-mb", type=float, default=50)
    tokens.add_argument("--vocab-size", type=int, default=50257)
    args = vars(parser.parse_args())
    make = make_jpeg_folder if args.pop("kind") == "jpeg" else make_token_files
    print(json.dumps(make(**args)))


if __name__ == "__main__":
    main()
