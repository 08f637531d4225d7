"""The input pipeline most people copy: PyTorch's ImageNet example (pytorch/examples, imagenet/main.py)
under torchrun and DDP. It is the baseline that scripts/bench/data.py measures the harness's own
imagefolder pipeline against, so it keeps the example's data path as it is: torchvision's ImageFolder
with RandomResizedCrop(224), a horizontal flip, ToTensor and Normalize, a DistributedSampler, and a
DataLoader with `--workers` processes per rank and pinned memory. The network is the harness's
ResNet-50, in channels_last and bf16 autocast, so both sides train the same model the same way.

Rank 0 prints one JSON line at the end: the wall-clock time (time.time()) at which its first step
had finished on the GPU, and global images per second over the steps after `--warmup`.

    torchrun --standalone --nproc_per_node 4 -m scripts.bench.ddp_imagefolder --data /tmp/harness-bench-data/jpeg --workers 14

(from the checkout root). torchvision, which the harness does not need, is imported only to train.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from harness.checkout.datasets import DataInfo
from harness.checkout.models import build_model


def make_loader(root: Path, batch_size: int, workers: int) -> tuple[DataLoader, DistributedSampler]:
    """The ImageNet example's training loader, for this rank's share of root/train."""
    from torchvision import datasets, transforms
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.ImageFolder(str(root / "train"), transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=True, sampler=sampler,
                        persistent_workers=workers > 0)
    return loader, sampler


def batches(loader: DataLoader, sampler: DistributedSampler) -> Iterator:
    """Batches without end, epoch after epoch (each epoch reshuffled, as the example does)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train(args: argparse.Namespace, local_rank: int) -> dict:
    """Run args.steps steps; returns rank 0's figures (every rank computes them)."""
    loader, sampler = make_loader(args.data, args.batch_size, args.workers)
    model = build_model("resnet50", DataInfo("image", (3, 224, 224), len(loader.dataset.classes)))
    model = model.cuda().to(memory_format=torch.channels_last)
    model = DistributedDataParallel(model, device_ids=[local_rank], gradient_as_bucket_view=True)
    criterion = torch.nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if args.amp == "bf16" else contextlib.nullcontext
    images = 0
    for step, (inputs, target) in enumerate(batches(loader, sampler), start=1):
        inputs = inputs.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        target = target.cuda(non_blocking=True)
        with autocast():
            loss = criterion(model(inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step > args.warmup:
            images += inputs.size(0)
        if step == 1:
            torch.cuda.synchronize()
            first_step_time = time.time()
        if step == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        if step == args.steps:
            break
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    world = dist.get_world_size()     # DistributedSampler gives every rank as many images as rank 0
    return {"first_step_time": first_step_time, "samples_per_s": images * world / seconds, "steps": args.steps,
            "world": world}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder holding train/<class>/*.jpg")
    parser.add_argument("--batch-size", type=int, default=128, help="per GPU")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader processes per GPU")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of the samples/s figure")
    parser.add_argument("--amp", choices=("bf16", "none"), default="bf16")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.steps:
        parser.error("need 1 <= --warmup < --steps")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.backends.cudnn.benchmark = True            # as the example (and the harness) do
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True   # the harness's default
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    result = train(args, local_rank)
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
