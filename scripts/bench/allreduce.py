"""All-reduce bandwidth and latency: this harness's NCCL path (cupy.cuda.nccl on torch tensors)
against torch.distributed's NCCL backend, on the same GPUs in the same run, one process per GPU.

Bus bandwidth follows nccl-tests: busbw = 2(n-1)/n * bytes / time. Each size is timed with CUDA
events around ITERS back-to-back in-place float32 sums on the current stream, after warm-up; the
two paths alternate and each reports the median over REPEATS windows.

    python -m scripts.bench.allreduce --gpus all --out bench/results/DATE-DEVICE/allreduce
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from scripts.bench.common import bench_record, join, write_json

SIZES = [4 << 10 << 2 * i for i in range(10)]          # 4 KiB, 16 KiB, ... 1 GiB


def measure(ctx, sizes, repeats):
    import torch
    import torch.distributed as dist
    comm = join(ctx)
    paths = {"harness": lambda t: comm.all_reduce(t), "torch.distributed": lambda t: dist.all_reduce(t)}
    results = {name: {} for name in paths}
    for nbytes in sizes:
        t = torch.randn(nbytes // 4, device="cuda")
        iters = max(5, min(1000, (256 << 20) // nbytes))
        windows = {name: [] for name in paths}
        for _ in range(repeats):
            for name, run in paths.items():
                for _ in range(3):
                    run(t)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(iters):
                    run(t)
                end.record()
                end.synchronize()
                windows[name].append(start.elapsed_time(end) / iters * 1e-3)
        for name in paths:
            seconds = statistics.median(windows[name])
            results[name][nbytes] = {"time_us": seconds * 1e6,
                                     "busbw_GBps": 2 * (ctx.world_size - 1) / ctx.world_size * nbytes / seconds / 1e9}
    dist.destroy_process_group()
    return results


def plot(results, n, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, series in results.items():
        sizes = sorted(series)
        ax.plot(sizes, [series[s]["busbw_GBps"] for s in sizes], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce, float32 sum, {n} GPUs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="all")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-mib", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.png")
    args = parser.parse_args()
    from harness import Parent
    from harness.launch.placement import resolve_gpus
    gpus = resolve_gpus(args.gpus)
    sizes = [s for s in SIZES if s <= args.max_mib << 20]
    with Parent() as parent:
        kids = parent.fork(len(gpus), gpus=gpus)
        kids.exec(measure, sizes, args.repeats)
        results = kids.wait()[0]
    print(f"{'size':>10} | {'harness us':>11} {'busbw GB/s':>11} | {'torch us':>11} {'busbw GB/s':>11} | ratio")
    for nbytes in sizes:
        h, t = results["harness"][nbytes], results["torch.distributed"][nbytes]
        print(f"{nbytes:>10} | {h['time_us']:>11.1f} {h['busbw_GBps']:>11.2f} | {t['time_us']:>11.1f} "
              f"{t['busbw_GBps']:>11.2f} | {t['time_us'] / h['time_us']:.3f}")   # busbw ratio; 1 GPU has no busbw
    if args.out:
        write_json(args.out.with_suffix(".json"), bench_record(gpus=len(gpus), repeats=args.repeats, results=results))
        plot(results, len(gpus), args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
