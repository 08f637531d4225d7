"""A folder of images, ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``, read from disk.

The layout is torchvision's ImageFolder (and ImageNet's): one folder per class, classes sorted by
name. Without ``val/``, validation (and Test.py) use a part of ``train/`` held out by ``val_fraction``,
the same files for a given seed (``carve``). A file that does not decode raises ``SampleError``, which
the pipeline skips (harness/data/bad_samples.py). Nothing is loaded up front: the scan keeps only the
file names, packed into one byte string with offsets (a Python list of a million ``str`` costs ~100 MB
per process, and forked loader processes would copy it page by page as reference counts change), and
each sample is decoded when it is asked for, in the loader's worker processes.

JPEGs are decoded by libjpeg-turbo through simplejpeg where it is installed (its fast IDCT and
upsampling), else by Pillow; both scale by 1/2, 1/4 or 1/8 *while* decoding (simplejpeg's
``min_width``, Pillow's ``draft``), so a crop that ends up 224 pixels wide is decoded at the
smallest scale that still gives at least 224 pixels, instead of decoding the full image and
throwing most of it away. Other formats go through Pillow. Training samples get RandomResizedCrop (scale 0.08-1, aspect 3/4-4/3, torchvision's algorithm) and a
horizontal flip; evaluation samples a resize of the short side to ``resize`` and a centre crop of
``crop``. Samples leave as uint8 CHW tensors (a quarter of float32's bytes through shared memory,
pinned memory and PCIe); the device turns them into normalised floats (``DataInfo.mean/std``).
"""
from __future__ import annotations

import copy
import functools
import importlib.util
import io
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .split import DataError, DataInfo, SampleError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)      # ImageNet's, as torchvision's examples use
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
DECODERS = ("simplejpeg", "pillow")
CARVE_SALT = 0x5EED_0F_7A1        # the held-out part's own stream of the seed, apart from the epochs' orders


class ImageFolder(torch.utils.data.Dataset):
    """One split of an image folder. ``train=True``: random crops and flips; else resize + centre crop.
    ``labels``: each sample's class; ``_files``: each sample's place in the scan (a ``part`` keeps some)."""

    def __init__(self, folder: Path, classes: tuple[str, ...], train: bool, crop: int, resize: int, decoder: str):
        self.folder, self.classes, self.train, self.crop, self.resize = folder, classes, train, crop, resize
        self.decoder = decoder
        self._names, self._offsets, self.labels = _scan(folder, classes)
        self._files = np.arange(len(self.labels))
        self.info = DataInfo("image", (3, crop, crop), len(classes), classes, MEAN, STD)

    def __len__(self) -> int:
        return len(self.labels)

    def part(self, keep: np.ndarray, train: bool) -> ImageFolder:
        """The samples ``keep`` (indices into this split) as a split of their own, sharing the scan, with
        training's transforms or evaluation's."""
        part = copy.copy(self)
        part.train, part.labels, part._files = train, self.labels[keep], self._files[keep]
        return part

    def path(self, index: int) -> Path:
        file = self._files[index]
        start, end = self._offsets[file], self._offsets[file + 1]
        return self.folder / os.fsdecode(self._names[start:end].tobytes())

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path = self.path(index)
        try:
            pixels = self._decode(path)
        except (OSError, SyntaxError, ValueError) as error:   # the decoders' ways of saying "not an image"
            from PIL import UnidentifiedImageError            # its text shows a buffer's address: say it plainly
            why = "not an image format Pillow knows" if isinstance(error, UnidentifiedImageError) else error
            raise SampleError(f"image {path} cannot be decoded ({why}); replace or delete the file",
                              f"cannot be decoded ({why})") from None
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))), int(self.labels[index])

    def _decode(self, path: Path) -> np.ndarray:
        from PIL import Image
        data = path.read_bytes()
        if self.decoder == "simplejpeg" and data[:2] == b"\xff\xd8":
            import simplejpeg
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            left, top, w, h = self._box(width, height)
            pixels = simplejpeg.decode_jpeg(data, "RGB", fastdct=True, fastupsample=True,
                                            min_width=math.ceil(width * self.crop / w),
                                            min_height=math.ceil(height * self.crop / h))
            image = Image.fromarray(pixels)
        else:
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            left, top, w, h = self._box(width, height)
            image.draft("RGB", (math.ceil(width * self.crop / w), math.ceil(height * self.crop / h)))
            image = image.convert("RGB")
        sx, sy = image.size[0] / width, image.size[1] / height        # the scale the decoder chose
        pixels = np.asarray(image.resize((self.crop, self.crop), Image.BILINEAR,
                                         box=(left * sx, top * sy, (left + w) * sx, (top + h) * sy)))
        if self.train and random.random() < 0.5:
            pixels = pixels[:, ::-1]            # a view: the copy into CHW order does the flip
        return pixels

    def _box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The region of the image that becomes the sample: (left, top, width, height)."""
        if self.train:
            return random_resized_crop(width, height)
        side = min(width, height) * self.crop / self.resize
        return (width - side) / 2, (height - side) / 2, side, side


def random_resized_crop(width: int, height: int) -> tuple[float, float, float, float]:
    """torchvision's RandomResizedCrop box (left, top, width, height), drawn from ``random``."""
    area = width * height
    for _ in range(10):
        target = area * random.uniform(*SCALE)
        aspect = math.exp(random.uniform(math.log(RATIO[0]), math.log(RATIO[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, width - w), random.randint(0, height - h), w, h
    aspect = width / height                 # fallback: the whole image, clamped to the aspect range
    if aspect < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif aspect > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def default_decoder() -> str:
    """The fastest measured (bench/results/2026-11-22-h200x4-data): simplejpeg in the loader processes."""
    return "simplejpeg" if importlib.util.find_spec("simplejpeg") else "pillow"


def class_names(folder: Path) -> tuple[str, ...]:
    """The sorted class folders of a split; one-line errors for a missing or empty split."""
    if not folder.is_dir():
        raise FileNotFoundError(f"imagefolder: {folder} does not exist; expected {folder}/<class>/<image>.jpg "
                                "(one folder per class)")
    classes = tuple(sorted(entry.name for entry in os.scandir(folder) if entry.is_dir()))
    if not classes:
        raise DataError(f"imagefolder: {folder} has no class folders; put each class's images in "
                        f"{folder}/<class>/")
    return classes


def _scan(folder: Path, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every image's name relative to ``folder`` as one byte array with offsets, and its label (read-only).
    Remembered by the process while no class folder changes (a file added or removed changes its folder's
    mtime; a folder made anew, its inode): rank 0 lists a split to check the inputs and again to train, and an
    ImageNet-size listing takes seconds that every worker waits for."""
    folder = folder.resolve()
    return _listing(folder, classes, tuple(_stamp(folder / name) for name in classes))


def _stamp(directory: Path) -> tuple[int, int, int] | None:
    try:
        seen = os.stat(directory)
    except FileNotFoundError:
        return None
    return seen.st_dev, seen.st_ino, seen.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _listing(folder: Path, classes: tuple[str, ...], stamps: tuple[tuple[int, int, int] | None, ...]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    names: list[bytes] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        directory = folder / name
        if not directory.is_dir():
            continue                    # a validation split may lack some of the training classes
        files = sorted(entry.name for entry in os.scandir(directory)
                       if entry.is_file() and entry.name.lower().endswith(EXTENSIONS))
        if not files:
            raise DataError(f"imagefolder: class folder {directory} has no images ({', '.join(EXTENSIONS)}); "
                            "add images or remove the folder")
        names += [os.fsencode(f"{name}/{file}") for file in files]
        labels += [label] * len(files)
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum([len(n) for n in names], out=offsets[1:])
    listing = np.frombuffer(b"".join(names), dtype=np.uint8), offsets, np.asarray(labels, dtype=np.int32)
    for array in listing:
        array.flags.writeable = False
    return listing


def open_imagefolder(data_dir: str | None, seed: int = 0, val_fraction: float = 0.0, crop: int = 224,
                     resize: int = 256, decoder: str | None = None) -> tuple[ImageFolder, ImageFolder | None]:
    """(train, val) splits of ``data_dir``; val's classes must be among train's. Without val/, val is the
    ``val_fraction`` of train/ that ``carve`` holds out for ``seed`` (None for 0). ``decoder``:
    "simplejpeg" (the default where it is installed) or "pillow", in the loader processes; other formats
    always use Pillow."""
    if decoder is None:
        decoder = default_decoder()
    if decoder == "nvjpeg":
        raise DataError("imagefolder: decoder 'nvjpeg' is no longer offered (decoding on the GPU trained slower than "
                        "simplejpeg in the loader processes: docs/data.md); pass --dataset-options "
                        "'{\"decoder\": \"simplejpeg\"}' or leave the decoder out")
    if decoder not in DECODERS:
        raise DataError(f"imagefolder: decoder {decoder!r} is not one of {', '.join(DECODERS)}")
    if decoder == "simplejpeg" and not importlib.util.find_spec("simplejpeg"):
        raise DataError("imagefolder: decoder 'simplejpeg' is not installed; pip install simplejpeg, "
                        "or pass --dataset-options '{\"decoder\": \"pillow\"}'")
    if data_dir is None:
        raise DataError("--dataset imagefolder needs --data-dir DIR holding DIR/train/<class>/*.jpg (and DIR/val/, "
                        "else --val-fraction of train/ is held out for validation)")
    if not 0 < crop <= resize:
        raise DataError(f"imagefolder: crop={crop} and resize={resize} must satisfy 0 < crop <= resize")
    root = Path(data_dir)
    classes = class_names(root / "train")
    train = ImageFolder(root / "train", classes, True, crop, resize, decoder)
    if not (root / "val").is_dir():
        return carve(train, val_fraction, seed)
    extra = sorted(set(class_names(root / "val")) - set(classes))
    if extra:
        raise DataError(f"imagefolder: {root / 'val'} has classes not in train/ ({', '.join(extra[:5])}); "
                        "val/ must use train/'s class folder names")
    return train, ImageFolder(root / "val", classes, False, crop, resize, decoder)


def carve(train: ImageFolder, fraction: float, seed: int) -> tuple[ImageFolder, ImageFolder | None]:
    """(the rest of ``train``, ``fraction`` of it for validation): a random pick, the same for the same
    seed (Test.py and --resume find the same part), each part in file order."""
    held = int(len(train) * fraction)
    if held == 0:
        return train, None
    order = np.random.default_rng([seed, CARVE_SALT]).permutation(len(train))
    return train.part(np.sort(order[held:]), True), train.part(np.sort(order[:held]), False)


def validation_source(data_dir: str | None, val_fraction: float) -> str:
    """What validation and Test.py evaluate, in words."""
    root = Path(data_dir or ".")
    if (root / "val").is_dir():
        return f"{root / 'val'}/"
    return f"the validation part carved from {root / 'train'}/ ({val_fraction * 100:g}%)"
