"""How fast each JPEG decoder turns files into training crops: one CPU core, and one GPU.

scripts/bench/data.py measures whole training runs; this one takes the input pipeline apart, to say which
stage a decoder loses in. On one CPU core: the image folder's samples with simplejpeg and with
Pillow (decode + RandomResizedCrop + flip, as a loader process does). On the GPU: nvjpeg batches
(torchvision's decode_jpeg on the whole batch), first the decode alone, then with the per-image
crops, resizes and flips of datasets/nvjpeg.py.

    python -m scripts.bench.decode --images 2000 --out bench/results/DATE-DEVICE/decode.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harness.checkout.datasets import nvjpeg
from harness.checkout.datasets.imagefolder import ImageFolder, class_names
from harness.data.pipeline import Seeded
from scripts.bench.common import bench_record, write_json
from scripts.bench.make_data import make_jpeg_folder


def per_second(count: int, run) -> float:
    run()                                   # warm-up: imports, the decoder's first allocations
    start = time.perf_counter()
    run()
    return count / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("/tmp/harness-decode-data"))
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--cpu-samples", type=int, default=300, help="samples per CPU decoder (one core)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    make_jpeg_folder(args.data, images=args.images, classes=100)
    folder = args.data / "train"
    classes = class_names(folder)
    keys = [(i, 1000 + i) for i in range(args.cpu_samples)]
    rates = {}
    for decoder in ("simplejpeg", "pillow"):
        samples = Seeded(ImageFolder(folder, classes, True, 224, 256, decoder))
        rates[f"cpu_core_{decoder}"] = per_second(len(keys), lambda: [samples[k] for k in keys])
    if torch.cuda.is_available():
        device = torch.device("cuda")
        encoded = Seeded(ImageFolder(folder, classes, True, 224, 256, "nvjpeg"))
        batches = [nvjpeg.collate([encoded[(i, i)] for i in range(start, start + args.batch)])[0]
                   for start in range(0, args.images - args.batch + 1, args.batch)]
        count = len(batches) * args.batch
        rates["cpu_core_nvjpeg_reading"] = per_second(len(keys), lambda: [encoded[k] for k in keys])

        def decode_only() -> None:
            from torchvision.io import ImageReadMode, decode_jpeg
            for batch in batches:
                decode_jpeg(batch.data, mode=ImageReadMode.RGB, device=device)
            torch.cuda.synchronize()

        def decode_and_crop() -> None:
            for batch in batches:
                nvjpeg.decode_batch(batch, 224, device)
            torch.cuda.synchronize()
        rates["gpu_nvjpeg_decode"] = per_second(count, decode_only)
        rates["gpu_nvjpeg_decode_crop"] = per_second(count, decode_and_crop)
    result = bench_record(images_per_s={k: round(v, 1) for k, v in rates.items()},
                          gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
