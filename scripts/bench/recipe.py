"""A modern recipe, this harness against torchrun + DDP, and what --compile and fused optimizers gain.

Issue 14's recipe: GPT-2 124M in bf16, torch.compile, --grad-accum 4, a cosine schedule with
warm-up, --clip-grad 1.0 and fused AdamW. Both sides run it in one group of worker processes (one
per GPU), each variant in turn from a freshly built model, on the same per-GPU micro-batch:

* ``ddp``: nanoGPT's loop. ``torch.compile(model)`` wrapped in DDP (gradient_as_bucket_view),
  ``require_backward_grad_sync`` off on the first K-1 micro-steps (no_sync), loss / K,
  ``clip_grad_norm_``, fused AdamW, the learning rate set every update.
* ``harness``: ``harness.training.step.TrainStep`` as Train.py builds it for the same flags: the compiled
  model over the flat buffers, bucketed gradient averaging with no_sync, clipping on the flat
  gradients, fused AdamW.
* ``harness-eager`` and ``ddp-eager``: the same without compile, for compile's gain.

``--models resnet50`` runs the same variants on ResNet-50 (SGD with momentum, fused), and the
``harness+graph`` variant (no compile, the whole update in a CUDA graph, constant rate) beside them.

``--optimizer-only`` times AdamW's update alone on GPT-2's parameters: torch's loop, foreach and
fused over the parameters, and foreach and fused over FlatParameters' single buffer (one tensor:
the "one kernel over the whole buffer" variant).

    python -m scripts.bench.recipe --gpus 2 --out bench/results/DATE-DEVICE/recipe
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

from scripts.bench.common import autocast_for, bench_record, build, join, median_step, spec_for, time_windows, write_json

VARIANTS = ("ddp", "harness", "ddp-eager", "harness-eager", "harness+graph")
TOTAL, WARMUP_LR = 10_000, 100          # the schedule's length and warm-up, in updates


def recipe_for(spec: dict) -> dict:
    if spec["info"][0] == "tokens":
        return {"optimizer": "adamw", "lr": 6e-4, "weight_decay": 0.1, "accum": 4, "clip": 1.0}
    return {"optimizer": "sgd", "lr": 0.1, "weight_decay": 5e-5, "accum": 4, "clip": 1.0}


def optimizer_for(recipe: dict, params, impl: str = "fused"):
    """The recipe's optimizer; ``impl``: fused, foreach or loop (one parameter at a time)."""
    import torch
    kernels = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if recipe["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=recipe["lr"], weight_decay=recipe["weight_decay"], betas=(0.9, 0.95),
                                 **kernels)
    return torch.optim.SGD(params, lr=recipe["lr"], momentum=0.9, weight_decay=recipe["weight_decay"], **kernels)


def make_variant(variant: str, spec: dict, comm):
    """One update of the recipe (a function of nothing: it counts its updates), and what must stay alive."""
    import torch
    from harness.checkout.models import loss_fn
    from harness.collectives.flat import FlatParameters
    from harness.training.schedule import learning_rate
    from harness.training.build import model_loss
    from harness.training.losses import default_loss
    from harness.training.step import make_step
    from harness.collectives.sync import BucketedGradientAveraging
    recipe = recipe_for(spec)
    accum, graph = recipe["accum"], variant == "harness+graph"
    model, _, x, y = build(spec)
    x, y = x.repeat(accum, *[1] * (x.dim() - 1)), y.repeat(accum, *[1] * (y.dim() - 1))   # one update's batch
    autocast = autocast_for(spec)
    updates = itertools.count()

    def set_rate(optimizer) -> None:
        lr = learning_rate(next(updates), recipe["lr"], "cosine", TOTAL, WARMUP_LR, recipe["lr"] / 10)
        for group in optimizer.param_groups:
            group["lr"] = lr
    if variant.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel
        compiled = torch.compile(model) if variant == "ddp" else model
        ddp = DistributedDataParallel(compiled, device_ids=[torch.cuda.current_device()],
                                      gradient_as_bucket_view=True)
        optimizer = optimizer_for(recipe, model.parameters())
        micro = list(zip(x.chunk(accum), y.chunk(accum)))

        def step() -> None:
            set_rate(optimizer)
            for i, (xm, ym) in enumerate(micro):
                ddp.require_backward_grad_sync = i == accum - 1
                with autocast():
                    loss = loss_fn(ddp(xm), ym) / accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step, (ddp, optimizer)
    flat = FlatParameters(model)
    optimizer = optimizer_for(recipe, model.parameters())
    compute = torch.compile(model_loss(model, default_loss)) if variant == "harness" else model_loss(model, default_loss)
    sync = BucketedGradientAveraging(comm, flat)
    train_step = make_step(model, compute, optimizer, flat, sync, autocast, cuda_graph=graph,
                           example=(x, y), clip=recipe["clip"], accum=accum)

    def step() -> None:
        if not graph:           # a graph replays the rate it captured
            set_rate(optimizer)
        train_step((x, y))
    return step, (model, train_step)


def bench_worker(ctx, specs: list[dict], variants: list[str], warmup: int, windows: int, per_window: int) -> dict:
    import torch
    import torch.distributed as dist
    comm = join(ctx)
    results: dict = {}
    for spec in specs:
        for variant in variants:
            if variant == "harness+graph" and spec["info"][0] == "tokens":
                continue        # the GPT recipe's schedule changes the rate every update: no graph
            comm.barrier()
            began = time.perf_counter()
            step, keep = make_variant(variant, spec, comm)
            step()                          # compiles, where it compiles
            torch.cuda.synchronize()
            results[f"{spec['name']}/{variant}/first_update_s"] = time.perf_counter() - began
            results[f"{spec['name']}/{variant}"] = median_step(step, warmup, windows, per_window)
            del step, keep
            torch.compiler.reset()
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return results


def optimizer_worker(ctx, spec: dict, steps: int) -> list[dict]:
    """Seconds per AdamW update on the model's parameters, per implementation and layout."""
    import torch
    from harness.collectives.flat import FlatParameters
    torch.cuda.set_device(0)
    recipe = recipe_for(spec)
    rows = []
    for layout in ("parameters", "flat buffer"):
        for impl in ("loop", "foreach", "fused"):
            model, _, _, _ = build(spec)
            flat = FlatParameters(model)
            if layout == "parameters":
                params = list(model.parameters())
            else:
                params = [torch.nn.Parameter(buffer) for buffer in flat.params]
                for param, grad in zip(params, flat.grads):
                    param.grad = grad
            for param in model.parameters():
                param.grad.normal_()
            optimizer = optimizer_for(recipe, params, impl)
            walls, hosts = time_windows(optimizer.step, 5, 5, steps)
            rows.append({"model": spec["name"], "layout": layout, "impl": impl, "tensors": len(params),
                         "update_ms": statistics.median(walls) * 1e3, "host_ms": statistics.median(hosts) * 1e3})
            del optimizer, model, flat, params
            torch.cuda.empty_cache()
    return rows


def table(results: dict, specs: list[dict], n: int) -> list[dict]:
    rows = []
    for spec in specs:
        name, recipe = spec["name"], recipe_for(spec)
        per_update = spec["batch"] * recipe["accum"] * n * (spec["info"][1][0] if spec["info"][0] == "tokens" else 1)
        unit = "tokens_per_s" if spec["info"][0] == "tokens" else "samples_per_s"
        for variant in VARIANTS:
            key = f"{name}/{variant}"
            if key not in results:
                continue
            baseline = results[f"{name}/{'ddp-eager' if variant.endswith(('eager', 'graph')) else 'ddp'}"]
            rows.append({"model": name, "gpus": n, "variant": variant, "accum": recipe["accum"],
                         "micro_batch": spec["batch"], "update_ms": results[key] * 1e3,
                         unit: per_update / results[key], "vs_ddp_same_compile": baseline / results[key],
                         "compile_gain": (results[f"{name}/{variant.split('-')[0]}-eager"] / results[key]
                                          if variant in ("ddp", "harness") else None),
                         "first_update_s": results[f"{key}/first_update_s"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["gpt2-124m", "resnet50"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="updates per timed window")
    parser.add_argument("--optimizer-only", action="store_true", help="time AdamW's update alone (one GPU)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from harness import Parent
    specs = [spec_for(m) for m in args.models]
    with Parent() as parent:
        if args.optimizer_only:
            kids = parent.fork(1, gpus=[0])
            kids.exec(optimizer_worker, specs[0], 20)
            rows = kids.wait()[0]
            for r in rows:
                print(f"{r['model']:10} {r['layout']:12} {r['impl']:8} {r['tensors']:>5} tensors "
                      f"{r['update_ms']:8.3f} ms/update (host {r['host_ms']:.3f})")
        else:
            kids = parent.fork(args.gpus, gpus=list(range(args.gpus)))
            kids.exec(bench_worker, specs, list(args.variants), args.warmup, args.windows, args.steps)
            results = kids.wait()
            merged = {k: max(r[k] for r in results) for k in results[0]}
            rows = table(merged, specs, args.gpus)
            for r in rows:
                rate = r.get("tokens_per_s") or r.get("samples_per_s")
                gain = f"{r['compile_gain']:.3f}" if r["compile_gain"] else "-"
                print(f"{r['model']:10} {r['gpus']} GPUs {r['variant']:14} {r['update_ms']:9.2f} ms/update "
                      f"{rate:12.0f}/s  vs DDP {r['vs_ddp_same_compile']:.3f}  compile gain {gain}  "
                      f"first update {r['first_update_s']:.1f} s")
    if args.out:
        write_json(args.out.with_suffix(".json"), bench_record(rows=rows))


if __name__ == "__main__":
    main()
