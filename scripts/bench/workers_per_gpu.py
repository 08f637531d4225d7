"""Several workers per GPU: total training throughput for K = 1, 2, 4 workers on each GPU, with and
without MPS, for small models that leave a big GPU idle.

Each configuration forks G * K workers (contiguous blocks per GPU), each training the same model on
synthetic data in grad mode (bucketed all-reduce; workers sharing a GPU combine through CUDA IPC).
The step time is the median over timed windows after warm-up, the slowest rank's; total samples/s is
G * K * batch / step time; "gain" is that over K = 1 without MPS on the same GPUs. With MPS, a
private control daemon is started for the configuration (nothing else on the machine changes).

    python -m scripts.bench.workers_per_gpu --gpus 1 4 --models mlp cnn --out bench/results/DATE-DEVICE/workers-per-gpu
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from scripts.bench.common import autocast_for, bar_chart, bench_record, build, median_step, spec_for, write_json


def worker(ctx, spec: dict, warmup: int, windows: int, per_window: int) -> float:
    import torch
    from harness.collectives.flat import FlatParameters
    from harness.training.build import model_loss
    from harness.training.losses import default_loss
    from harness.training.step import TrainStep
    from harness.collectives.sync import BucketedGradientAveraging
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    comm = ctx.communicator()
    model, optimizer, x, y = build(spec)
    flat = FlatParameters(model)
    sync = BucketedGradientAveraging(comm, flat)
    sync.start()
    step = TrainStep(model, model_loss(model, default_loss), optimizer, flat, sync, autocast_for(spec))
    return median_step(lambda: step((x, y)), warmup, windows, per_window)


def measure(spec: dict, gpus: int, k: int, mps: bool, args: argparse.Namespace) -> float:
    """The slowest rank's median step time, in seconds."""
    from harness import Parent
    from harness.launch.mps import start_mps
    with contextlib.ExitStack() as stack:
        env = {}
        if mps:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="mps-", dir="/tmp"))
            env = stack.enter_context(start_mps(Path(directory))).env
        parent = stack.enter_context(Parent())        # closed (workers gone) before the daemon stops
        kids = parent.fork(gpus * k, gpus=list(range(gpus)), env=env)
        kids.exec(worker, spec, args.warmup, args.windows, args.steps)
        return max(kids.wait())


def rows(results: dict, specs: list[dict]) -> list[dict]:
    """Table rows from {(model, gpus, k, mps): seconds}."""
    out = []
    for (model, gpus, k, mps), seconds in sorted(results.items()):
        batch = next(s["batch"] for s in specs if s["name"] == model)
        base = results.get((model, gpus, 1, False))
        samples = gpus * k * batch / seconds
        out.append({"model": model, "gpus": gpus, "workers_per_gpu": k, "mps": mps, "step_ms": seconds * 1e3,
                    "samples_per_s": samples,
                    "gain": samples / (gpus * batch / base) if base else None})
    return out


def print_rows(table: list[dict]) -> None:
    print(f"{'model':6} {'GPUs':>4} {'K':>2} {'MPS':>4} {'step ms':>8} {'samples/s':>10} {'gain':>6}")
    for r in table:
        gain = f"{r['gain']:.2f}" if r["gain"] is not None else "-"
        print(f"{r['model']:6} {r['gpus']:>4} {r['workers_per_gpu']:>2} {'yes' if r['mps'] else 'no':>4} "
              f"{r['step_ms']:>8.3f} {r['samples_per_s']:>10.0f} {gain:>6}")


def plot(table: list[dict], path: Path) -> None:
    panels = []
    for model, gpus in sorted({(r["model"], r["gpus"]) for r in table}):
        mine = [r for r in table if (r["model"], r["gpus"]) == (model, gpus)]
        panels.append((f"{model}, {gpus} GPU{'s' if gpus > 1 else ''}",
                       [f"K={r['workers_per_gpu']}{' MPS' if r['mps'] else ''}" for r in mine],
                       [r["samples_per_s"] for r in mine], ["#2a7" if r["mps"] else "#999" for r in mine]))
    bar_chart(panels, "samples/s (all workers)", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 4], help="GPU counts to run on")
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--workers-per-gpu", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--mps", choices=("both", "on", "off"), default="both")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed window")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    specs = [spec_for(m) for m in args.models]
    settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.mps]
    results = {}
    for gpus in args.gpus:
        for spec in specs:
            for k in args.workers_per_gpu:
                for mps in settings:
                    results[(spec["name"], gpus, k, mps)] = measure(spec, gpus, k, mps, args)
                    print(f"{spec['name']} on {gpus} GPU(s), K={k}, MPS {'on' if mps else 'off'}: "
                          f"{results[(spec['name'], gpus, k, mps)] * 1e3:.3f} ms/step", flush=True)
    table = rows(results, specs)
    print_rows(table)
    if args.out:
        write_json(args.out.with_suffix(".json"), bench_record(
            warmup=args.warmup, windows=args.windows, steps_per_window=args.steps, rows=table))
        plot(table, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
