"""What a torchrun user writes instead of Train.py, written the best way we know: one process per GPU
under torchrun, the same model, data, recipe and dtype as Train.py's rows of the multi-GPU benchmarks
(scripts/bench/multi.py and scripts/bench/zero.py --peers).

Wrappers (``--wrap``):
- ``ddp-compile``: DDP with ``gradient_as_bucket_view`` and ``static_graph`` (where no micro-batch skips
  the sync: DDP's static graph expects every backward to), then torch.compile of the DDP module, the
  order PyTorch's DDP notes ask for (Dynamo then splits the graph at DDP's buckets); fused optimizer.
  nanoGPT's forward computes its own loss, so the loss is compiled with the model;
- ``ddp-compile-inner``: the same, compiled in nanoGPT's order (compile the model, then wrap it);
- ``ddp``: the same DDP, eager;
- ``torch-zero``: eager DDP with torch's ZeroRedundancyOptimizer over the fused optimizer (ZeRO-1);
- ``fsdp2``: ``fully_shard`` on each transformer block and on the root, ``reshard_after_forward=False``
  (ZeRO-2's SHARD_GRAD_OP), gradient sync only on the last micro-batch and the parameters kept gathered
  between micro-batches (``set_reshard_after_backward(False)`` until then: one all-gather an update, not one
  a micro-batch), the fused optimizer on DTensors;
- ``torch-zero-compile``: the same, then torch.compile of the DDP module, loss included;
- ``fsdp2-compile``: FSDP2 over transformer blocks each replaced by its torch.compile module (torchtitan's
  order, so FSDP2's hooks stay outside the compiled code; the root, with the head and the loss, stays
  eager). torch.compile of the whole sharded model, and blocks compiled in place (``Module.compile``, whose
  compiled call takes FSDP2's hooks in), both ran at 230 ms an update against DDP compiled's 134 (2 x H200).

Models (``--model``): ``resnet50`` (batch 128 per GPU, channels_last, bf16 autocast, fused SGD with
momentum, one resident synthetic batch, as Train.py's ``--dataset synthetic``) and ``gpt-nanogpt``
(nanoGPT's model.py and recipe: batch 16 x accumulation 4 x 1024 tokens per GPU, bf16, AdamW
(0.9, 0.95) with weight decay 0.1 on matrices, clip 1.0; random windows of the token file, the next
batch copied while the GPU works).

Rank 0 prints ``FIRST_STEP <time.time()>`` when its first update is done, then one JSON line:
``step_ms`` (median of timed windows), ``peak_mb`` (torch.cuda.max_memory_reserved) and
``peak_allocated_mb``, and ``param_mb``, ``grad_mb``, ``optimizer_mb`` (what this rank holds), each
the largest over the ranks.

    torchrun --standalone --nproc-per-node 2 -m scripts.bench.peers --model gpt-nanogpt --wrap fsdp2 --tokens DIR
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

from scripts.bench.common import FIRST_STEP

WRAPS = ("ddp-compile", "ddp-compile-inner", "ddp", "torch-zero", "torch-zero-compile", "fsdp2", "fsdp2-compile")


def resnet50(rank: int) -> tuple:
    """(model, (optimizer class, options, param groups of a parameter list), next batch, micro-batches,
    loss(module, x, y))."""
    import torch
    from harness.checkout.datasets import DataInfo
    from harness.checkout.models import build_model
    torch.manual_seed(0)
    model = build_model("resnet50", DataInfo("image", (3, 224, 224), 1000)).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(128, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (128,), device="cuda")

    optimizer = (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, lambda params: [{"params": params}])
    return model, optimizer, lambda: (x, y), 1, lambda module, x, y: torch.nn.functional.cross_entropy(module(x), y)


def gpt_nanogpt(rank: int, tokens: Path) -> tuple:
    import torch
    from scripts.bench.nanogpt_model import gpt2_124m, token_batches
    torch.manual_seed(0)
    model = gpt2_124m().cuda()
    batch = token_batches(tokens, seed=rank)

    def groups(params: list) -> list[dict]:        # nanoGPT's configure_optimizers: no decay on vectors
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = (torch.optim.AdamW, {"lr": 6e-4, "betas": (0.9, 0.95)}, groups)

    return model, optimizer, batch, 4, lambda module, x, y: module(x, y)[1]     # nanoGPT's forward: its own loss


def wrap(kind: str, model, optimizer: tuple, accum: int) -> tuple:
    """(the module to call, the optimizer, a context for micro-batches that skip gradient sync)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    cls, options, groups = optimizer
    compiled = kind in ("ddp-compile", "torch-zero-compile", "fsdp2-compile")
    if kind.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        blocks = model.transformer.h if hasattr(model, "transformer") else None
        for index, block in enumerate(blocks if blocks is not None else model.children()):
            if compiled:        # torchtitan's order: each block compiled, the compiled module sharded
                block = blocks[index] = torch.compile(block)
            fully_shard(block, reshard_after_forward=False)
        fully_shard(model, reshard_after_forward=False)

        @contextlib.contextmanager
        def no_sync():      # FSDP2's accumulation: no reduce-scatter, and no all-gather again next micro-batch
            model.set_requires_gradient_sync(False)
            model.set_reshard_after_backward(False)
            yield
            model.set_requires_gradient_sync(True)
            model.set_reshard_after_backward(True)
        optimizer = cls(groups(list(model.parameters())), **options, fused=True)
        return model, optimizer, no_sync
    # static_graph only without accumulation: DDP's static graph expects every backward to sync
    ddp = DistributedDataParallel(torch.compile(model) if kind == "ddp-compile-inner" else model,
                                  device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True,
                                  static_graph=accum == 1)
    module = torch.compile(ddp) if compiled else ddp
    if kind.startswith("torch-zero"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return module, ZeroRedundancyOptimizer(groups(list(model.parameters())), optimizer_class=cls, **options,
                                               fused=True), ddp.no_sync
    return module, cls(groups(list(model.parameters())), **options, fused=True), ddp.no_sync


def held_mb(model, optimizer) -> dict:
    """What this rank holds: parameters, gradients and optimizer state (local shards for FSDP2)."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t
    params = list(model.parameters())
    state = optimizer.optim.state if hasattr(optimizer, "optim") else optimizer.state
    opt = sum(local(v).nbytes for s in state.values() for v in s.values() if torch.is_tensor(v))
    return {"param_mb": sum(local(p).nbytes for p in params) / 2**20,
            "grad_mb": sum(local(p.grad).nbytes for p in params if p.grad is not None) / 2**20,
            "optimizer_mb": opt / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("resnet50", "gpt-nanogpt"), required=True)
    p.add_argument("--wrap", choices=WRAPS, required=True)
    p.add_argument("--steps", type=int, default=30, help="timed updates (after 10 of warm-up)")
    p.add_argument("--tokens", type=Path, help="a folder with nanoGPT's train.bin (gpt-nanogpt)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per update (default: the model's recipe, 4 for "
                                                  "gpt-nanogpt)")
    args = p.parse_args()
    import torch
    import torch.distributed as dist
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model, optimizer_spec, batch, accum, loss_fn = resnet50(rank) if args.model == "resnet50" else \
        gpt_nanogpt(rank, args.tokens)
    accum = args.grad_accum or accum
    module, optimizer, no_sync = wrap(args.wrap, model, optimizer_spec, accum)
    following = [batch()]

    held: dict = {}

    def step(measure: bool = False) -> None:
        for index in range(accum):
            x, y = following.pop()
            with no_sync() if index < accum - 1 else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(module, x, y) / accum
                following.append(batch())
                loss.backward()
        if args.model == "gpt-nanogpt":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if measure:         # before zero_grad lets the gradients go
            held.update(held_mb(model, optimizer))
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    if rank == 0:
        print(FIRST_STEP, time.time(), flush=True)
    for index in range(9):
        step(measure=index == 8)
    windows = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(max(1, args.steps // 3)):
            step()
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - start) / max(1, args.steps // 3))
    figures = torch.tensor([torch.cuda.max_memory_reserved() / 2**20, torch.cuda.max_memory_allocated() / 2**20,
                            held["param_mb"], held["grad_mb"], held["optimizer_mb"]], device="cuda")
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if rank == 0:
        names = ("peak_mb", "peak_allocated_mb", "param_mb", "grad_mb", "optimizer_mb")
        print(json.dumps({"step_ms": statistics.median(windows) * 1000,
                          **dict(zip(names, figures.tolist()))}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
