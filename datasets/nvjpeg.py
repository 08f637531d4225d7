"""JPEG batches decoded on the GPU (nvJPEG through torchvision), for image folders.

On a host whose cores cannot keep its GPUs fed (ResNet-50 on an H200 eats ~4,200 images/s, and
libjpeg-turbo needs ~3 ms of one core for a 500 x 375 JPEG), the loader processes only read each
file and draw its crop box and flip from the sample's seed (``Encoded``); the training process hands
the whole batch to ``torchvision.io.decode_jpeg(..., device="cuda")``, which uses the GPU's JPEG
engines (nvJPEG's hardware backend on A100/H100/H200) where it can, and then crops, resizes and
flips each image on the GPU. This runs on the input pipeline's side stream, overlapping the step.

Without CUDA (Test.py's examples on the CPU, CPU workers) the same batches decode image by image
with Pillow, so results do not depend on where a checkpoint is evaluated. A file that does not
decode is found and named by decoding the batch's files one by one.
"""
from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .split import DataError


class Encoded(NamedTuple):
    """A batch as the loader hands it over: each file's bytes, its box (left, top, width, height) in
    the full image, and whether to flip it."""
    data: list[torch.Tensor]
    boxes: torch.Tensor
    flips: torch.Tensor
    paths: list[str]


def collate(samples: list[tuple[tuple[torch.Tensor, tuple, bool, str], int]]) -> tuple[Encoded, torch.Tensor]:
    encoded = Encoded([s[0][0] for s in samples], torch.tensor([s[0][1] for s in samples], dtype=torch.float64),
                      torch.tensor([s[0][2] for s in samples]), [s[0][3] for s in samples])
    return encoded, torch.tensor([label for _, label in samples])


def decode_batch(batch: Encoded, crop: int, device: torch.device) -> torch.Tensor:
    """uint8 images (B, 3, crop, crop) on ``device``: decoded, cropped to their boxes, resized, flipped."""
    try:
        images = _decode(batch.data, device)
    except (RuntimeError, OSError, SyntaxError, ValueError):   # torchvision's and Pillow's "cannot decode"
        _name_the_bad_file(batch)
        raise
    return crop_all(images, batch.boxes, batch.flips, crop)


def crop_all(images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, crop: int) -> torch.Tensor:
    """Every image's box resized to crop x crop (flipped where asked) in a few kernels for the whole
    batch, not a few per image: launching ~6 kernels per image cost ~135 us each on the training
    thread, a third of nvJPEG's throughput. Bilinear samples at twice the size, averaged 2 x 2 (an
    antialiased downscale, like Pillow's); sample points are kept on each image's own pixels, so
    the padding of a batch of unequal sizes never leaks in."""
    device = images[0].device
    sizes = torch.tensor([image.shape[1:] for image in images], dtype=torch.float32, device=device)  # (h, w)
    if all(image.shape == images[0].shape for image in images):
        batch = torch.stack(images)
    else:
        batch = torch.zeros((len(images), 3, *sizes.amax(0).long().tolist()), dtype=torch.uint8, device=device)
        for i, image in enumerate(images):
            batch[i, :, :image.shape[1], :image.shape[2]] = image
    # The grid is built where it is used: made on the host it is B x 2crop x 2crop x 2 numbers to copy
    # every batch (measured: 1,046 images/s on an H200, against 13,618 for the decode alone).
    steps = (torch.arange(2 * crop, dtype=torch.float32, device=device) + 0.5) / (2 * crop)   # sample centres
    left, top, width, height = boxes.to(device, torch.float32).T[:, :, None]
    across = torch.where(flips.to(device)[:, None], steps.flip(0), steps)
    x = torch.minimum((left + across * width).clamp(min=0.5), sizes[:, 1:2] - 0.5)
    y = torch.minimum((top + steps * height).clamp(min=0.5), sizes[:, 0:1] - 0.5)
    grid = torch.stack(torch.broadcast_tensors((2 * x / batch.shape[3] - 1)[:, None, :],
                                               (2 * y / batch.shape[2] - 1)[:, :, None]), -1)
    sampled = F.grid_sample(batch.float(), grid, mode="bilinear", align_corners=False)
    return F.avg_pool2d(sampled, 2).round_().clamp_(0, 255).to(torch.uint8)


def _decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEGs on the GPU in one call; anything else (a PNG in the folder), and everything without CUDA,
    through Pillow."""
    jpeg = [i for i, d in enumerate(data) if device.type == "cuda" and d[:2].tolist() == [0xFF, 0xD8]]
    images = [None if i in jpeg else _decode_on_cpu(d).to(device) for i, d in enumerate(data)]
    if jpeg:
        from torchvision.io import ImageReadMode, decode_jpeg
        for i, image in zip(jpeg, decode_jpeg([data[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)):
            image.record_stream(torch.cuda.current_stream(device))    # made on torchvision's stream, read on ours
            images[i] = image
    return images


def _decode_on_cpu(data: torch.Tensor) -> torch.Tensor:
    from PIL import Image
    with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
        return torch.from_numpy(np.ascontiguousarray(np.asarray(image.convert("RGB")).transpose(2, 0, 1)))


def _name_the_bad_file(batch: Encoded) -> None:
    for data, path in zip(batch.data, batch.paths):
        try:
            _decode_on_cpu(data)
        except (OSError, SyntaxError, ValueError) as error:
            raise DataError(f"image {path} cannot be decoded ({error}); replace or delete the file") from None
