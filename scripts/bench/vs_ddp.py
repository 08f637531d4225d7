"""This harness against PyTorch DDP on the same GPUs, model, per-GPU batch, dtype and optimizer.

For each model and GPU count, one group of worker processes (one per GPU) runs every variant in
turn, each from a freshly built model: 1 GPU alone (rank 0 only); N independent processes (no
communication: the ceiling); DDP (NCCL, gradient_as_bucket_view=True, static_graph=True); this
harness in grad mode (bucketed, overlapped), with and without --cuda-graph, and unbucketed (one
all-reduce after backward: --grad-sync flat); and in param mode with --avg-every 8. Step time is the median over timed windows after warm-up (CUDA-synchronised wall
clock around each window). Time to first step is measured from the command: `python` running the
harness against `torchrun` running DDP, each to the end of rank 0's first step.

    python -m scripts.bench.vs_ddp --gpus 2 4 --models mlp resnet50 gpt2-124m --out bench/results/DATE-DEVICE/vs-ddp
"""
from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

from scripts.bench.common import (FIRST_STEP, MODELS, ROOT, autocast_for, bar_chart, bench_record, build,
                                  first_step_stamp, join, median_step, module_command, spec_for, subprocess_env,
                                  write_json)

VARIANTS = ("single", "independent", "ddp", "harness", "harness-flat", "harness+graph", "harness-param8")


def make_variant(variant: str, spec: dict, comm):
    """A step function for one variant, plus its model (kept alive while timing)."""
    from harness.collectives.flat import FlatParameters
    from harness.training.build import model_loss
    from harness.training.losses import default_loss
    from harness.training.step import TrainStep, make_step
    from harness.collectives.sync import BucketedGradientAveraging, GradientAveraging, ParameterAveraging, Synchroniser
    from harness.checkout.models import loss_fn
    model, optimizer, x, y = build(spec)
    autocast = autocast_for(spec)
    if variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, device_ids=[0], gradient_as_bucket_view=True, static_graph=True)

        def step():
            with autocast():
                loss = loss_fn(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return step, ddp
    flat = FlatParameters(model)
    if variant in ("single", "independent"):
        sync = Synchroniser(comm, flat)
    elif variant == "harness-param8":
        sync = ParameterAveraging(comm, flat, every=8)
    elif variant == "harness-flat":
        sync = GradientAveraging(comm, flat)
    else:
        sync = BucketedGradientAveraging(comm, flat)
    if variant == "harness+graph":
        train_step = make_step(model, model_loss(model, default_loss), optimizer, flat, sync, autocast, cuda_graph=True,
                               example=(x, y))
    else:
        train_step = TrainStep(model, model_loss(model, default_loss), optimizer, flat, sync, autocast)
    counter = [0]

    def step():
        train_step((x, y))
        counter[0] += 1
        sync.after_step(counter[0])
    return step, (model, train_step)


def profile_steps(step, steps: int = 5) -> dict:
    """Where a step's time goes: host (CPU) time against device (GPU kernel) time per step, and the
    operators with the most host time. A step is launch-bound when the first exceeds the second."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    return {"cpu_ms_per_step": sum(e.self_cpu_time_total for e in events) / steps / 1e3,
            "gpu_ms_per_step": sum(e.self_device_time_total for e in events) / steps / 1e3,
            "table": events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48),
            "gpu_table": events.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=48)}


def bench_worker(ctx, specs: list[dict], variants: list[str], warmup: int, windows: int, per_window: int,
                 profile: bool = False) -> dict:
    import torch
    import torch.distributed as dist
    comm = join(ctx)
    results: dict = {}
    for spec in specs:
        for variant in variants:
            comm.barrier()
            if variant == "single" and ctx.rank != 0:
                comm.barrier()
                continue
            step, keep = make_variant(variant, spec, comm)
            seconds = median_step(step, warmup, windows, per_window)
            results[f"{spec['name']}/{variant}"] = seconds
            if profile:            # on every rank: a rank profiling alone would be a lone collective caller
                found = profile_steps(step)
                if ctx.rank == 0:
                    results[f"{spec['name']}/{variant}/profile"] = found
            del step, keep
            torch.cuda.empty_cache()
            if variant == "single":
                comm.barrier()
    dist.destroy_process_group()
    return results


# -- time to first step ------------------------------------------------------------------------

def first_step(spec: dict, comm=None) -> None:
    """Build, wrap and run one step; rank 0 prints when it is done (wall clock)."""
    import torch
    from harness.collectives.flat import FlatParameters
    from harness.training.build import model_loss
    from harness.training.losses import default_loss
    from harness.training.step import TrainStep
    from harness.collectives.sync import BucketedGradientAveraging
    from harness.checkout.models import loss_fn
    model, optimizer, x, y = build(spec)
    autocast = autocast_for(spec)
    if comm is None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
        model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                        gradient_as_bucket_view=True, static_graph=True)
        with autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        if dist.get_rank() == 0:
            print(f"{FIRST_STEP} {time.time()}", flush=True)
        dist.destroy_process_group()
        return
    flat = FlatParameters(model)
    TrainStep(model, model_loss(model, default_loss), optimizer, flat, BucketedGradientAveraging(comm, flat),
              autocast)((x, y))
    torch.cuda.synchronize()


def harness_first_step(ctx, spec: dict) -> float:
    first_step(spec, ctx.communicator())
    return time.time()


def run_first_step(kind: str, spec: dict, n: int) -> None:
    """Entry point of the timed command (--first-step-run)."""
    if kind == "ddp":
        import torch
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        first_step(spec)
        return
    from harness import Parent
    with Parent() as parent:
        kids = parent.fork(n, gpus=list(range(n)))
        kids.exec(harness_first_step, spec)
        print(f"{FIRST_STEP} {kids.wait()[0]}", flush=True)


def time_to_first_step(kind: str, spec_name: str, n: int) -> float:
    me = ["-m", __spec__.name, "--first-step-run", kind, "--models", spec_name, "--gpus", str(n)]
    command = (module_command("torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *me)
               if kind == "ddp" else module_command(*me[1:]))
    start = time.time()
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=subprocess_env())
    if out.returncode != 0:
        raise RuntimeError(f"{kind} first-step run failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return first_step_stamp(out.stdout, f"the {kind} first-step run") - start


# -- report --------------------------------------------------------------------------------------

def table(results: dict, specs: list[dict], n: int) -> list[dict]:
    rows = []
    for spec in specs:
        name = spec["name"]
        ddp = results[f"{name}/ddp"]
        ceiling = results[f"{name}/independent"]
        for variant in VARIANTS:
            if f"{name}/{variant}" not in results:
                continue
            seconds = results[f"{name}/{variant}"]
            gpus = 1 if variant == "single" else n
            rows.append({"model": name, "gpus": n, "variant": variant, "step_ms": seconds * 1e3,
                         "samples_per_s": spec["batch"] * gpus / seconds,
                         "scaling_efficiency": results[f"{name}/single"] / seconds if variant != "single" else 1.0,
                         "of_ceiling": ceiling / seconds, "vs_ddp": ddp / seconds})
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'model':10} {'GPUs':>4} {'variant':15} {'step ms':>8} {'samples/s':>10} {'scaling':>8} "
          f"{'of ceiling':>10} {'vs DDP':>7}")
    for r in rows:
        print(f"{r['model']:10} {r['gpus']:>4} {r['variant']:15} {r['step_ms']:>8.3f} {r['samples_per_s']:>10.0f} "
              f"{r['scaling_efficiency']:>8.1%} {r['of_ceiling']:>10.1%} {r['vs_ddp']:>7.2f}")


def plot(rows: list[dict], path: Path) -> None:
    panels = []
    for model, gpus in sorted({(r["model"], r["gpus"]) for r in rows}, key=lambda g: (g[1], g[0])):
        mine = [r for r in rows if (r["model"], r["gpus"]) == (model, gpus) and r["variant"] != "single"]
        panels.append((f"{model}, {gpus} GPUs", [r["variant"] for r in mine], [r["vs_ddp"] for r in mine],
                       ["#999" if r["variant"] in ("independent", "ddp") else "#2a7" for r in mine]))
    bar_chart(panels, "throughput / DDP", path, baseline=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--profile", action="store_true", help="also profile 5 steps of each variant (rank 0's profile is printed)")
    parser.add_argument("--first-step-model", default="resnet50", help="model for the time-to-first-step race ('' to skip)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--first-step-run", choices=("harness", "ddp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    missing = [v for v in ("single", "independent", "ddp") if v not in args.variants]
    if missing:
        parser.error(f"--variants lacks {', '.join(missing)}: the table's ratios are taken against them")
    specs = [spec_for(m) for m in args.models]
    if args.first_step_run:
        run_first_step(args.first_step_run, specs[0], args.gpus[0])
        return
    from harness import Parent
    rows, first = [], {}
    for n in args.gpus:
        with Parent() as parent:
            kids = parent.fork(n, gpus=list(range(n)))
            kids.exec(bench_worker, specs, list(args.variants), args.warmup, args.windows, args.steps, args.profile)
            results = kids.wait()
        profiles = {k: v for k, v in results[0].items() if k.endswith("/profile")}
        merged = {key: max(r[key] for r in results if key in r) for key in results[0] if key not in profiles}
        for key, found in profiles.items():
            print(f"--- profile {key} on {n} GPUs: host {found['cpu_ms_per_step']:.3f} ms/step, "
                  f"GPU kernels {found['gpu_ms_per_step']:.3f} ms/step\n{found['table']}\n{found['gpu_table']}")
        rows += table(merged, specs, n)
        print_rows([r for r in rows if r["gpus"] == n])
        if args.first_step_model:
            first[n] = {kind: time_to_first_step(kind, args.first_step_model, n) for kind in ("harness", "ddp")}
            print(f"time to first step, {args.first_step_model} on {n} GPUs: harness {first[n]['harness']:.2f} s, "
                  f"torchrun + DDP {first[n]['ddp']:.2f} s")
    if args.out:
        write_json(args.out.with_suffix(".json"), bench_record(
            warmup=args.warmup, windows=args.windows, steps_per_window=args.steps, rows=rows,
            time_to_first_step_s=first))
        plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
