"""How fast each JPEG decoder turns files into training crops on one CPU core.

scripts/bench/data.py measures whole training runs; this one measures a loader process's share: the image
folder's samples with simplejpeg and with Pillow (decode + RandomResizedCrop + flip, as a loader process
does), which says how many cores a GPU's appetite needs.

    python -m scripts.bench.decode --images 2000 --out bench/results/DATE-DEVICE/decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

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
    result = bench_record(images_per_s={k: round(v, 1) for k, v in rates.items()},
                          cpu_count=os.cpu_count())
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
