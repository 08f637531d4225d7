"""--profile DIR: a torch.profiler record of a few updates, and where their device time went.

Rank 0 records updates ``from + 1`` to ``from + count``: late enough that compilation, the CUDA
graph's capture and the allocator's first growth are behind, so the record shows the steady step.
The device is synchronised at both ends, so ``wall_ms`` is the updates' own time and the kernel time
inside it says how busy the GPU was; what is left (``idle_ms``) is time the host kept the device
waiting. Kernels are put in a few categories by name (``categorize``), the same way for this
harness and for the plain loops the benchmarks compare it with (scripts/bench/profile.py), so two
profiles can be read side by side.

On a GPU the summary also says where the memory is (``memory``): the allocator's figures after the
first update (start-up, compilation and a CUDA graph's warm-up and capture are behind it) and at the
window's end, the lifetime peaks, and the reserved memory by pool and stream (the default pool on the
step's stream, a side stream's blocks, a CUDA graph's private pool) with the largest blocks in use.
A lifetime peak above what the steady step holds was reached during start-up.

Files: ``trace.json`` (chrome://tracing, Perfetto), ``profile.json`` (the summary) and
``profile.txt`` (torch's table of the heaviest operators).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

# The first rule whose words a kernel's name contains names its category. Inductor names its kernels
# after the ops they fuse ("triton_poi_fused_convolution_..."), so its templates and fusions come first.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("triton_tem", "gemm", "cutlass", "nvjet", "xmma", "cublas", "matmul")),
    ("fused elementwise/reduction", ("triton_",)),
    # cuDNN's attention backward has helper kernels of its own (cudnn::fusion::convert_dq_to_16bits, ...)
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa", "cudnn::fusion")),
    ("convolution", ("conv", "implicit_gemm", "wgrad", "dgrad", "fprop")),
    ("normalization", ("bn_", "batch_norm", "batchnorm", "layer_norm", "layernorm")),
    ("optimizer", ("multi_tensor", "fused_adam", "fused_sgd", "fusedadam", "fusedsgd")),
    ("communication", ("nccl",)),
    ("copy", ("memcpy", "memset", "copy", "cat", "gather", "index")),
)


def categorize(kernel: str) -> str:
    name = kernel.lower()
    return next((category for category, words in CATEGORIES if any(w in name for w in words)), "other")


def summarize(profile: Any, updates: int, wall_s: float) -> dict:
    """Per update: the wall time, each category's kernel time, the kernel time in all and the idle
    time (wall minus the union of kernel intervals); and the ten heaviest kernels."""
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_category: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        us = event.time_range.elapsed_us()
        by_category[categorize(event.name)] = by_category.get(categorize(event.name), 0.0) + us
        by_name.setdefault(event.name, []).append(us)
    busy = _union_us([(e.time_range.start, e.time_range.end) for e in kernels])
    per = 1000.0 * updates
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:10]
    return {"updates": updates, "wall_ms": wall_s * 1000 / updates,
            "kernel_ms": {k: v / per for k, v in sorted(by_category.items(), key=lambda item: -item[1])},
            "busy_ms": busy / per, "idle_ms": max(0.0, wall_s * 1000 / updates - busy / per),
            "kernels_per_update": len(kernels) / updates,
            "top": [{"kernel": name[:160], "category": categorize(name), "ms": sum(times) / per,
                     "calls": len(times) / updates} for name, times in top]}


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


MB = 2**20


def memory_now(device: torch.device) -> dict:
    """The caching allocator's figures on ``device`` now, in MB: in use, reserved, and the lifetime peaks."""
    return {"allocated_mb": torch.cuda.memory_allocated(device) / MB,
            "reserved_mb": torch.cuda.memory_reserved(device) / MB,
            "max_allocated_mb": torch.cuda.max_memory_allocated(device) / MB,
            "max_reserved_mb": torch.cuda.max_memory_reserved(device) / MB}


def pools(snapshot: dict, largest: int = 8) -> dict:
    """Reserved and allocated memory of a ``torch.cuda.memory._snapshot()`` by pool and stream (the
    default pool is ``(0, 0)``; a CUDA graph's is private), and the largest blocks in use."""
    by_pool: dict[str, dict] = {}
    blocks: list[tuple[int, str]] = []
    for segment in snapshot.get("segments", []):
        pool = tuple(segment.get("segment_pool_id") or (0, 0))
        key = f"{'default' if pool == (0, 0) else 'private ' + str(list(pool))} pool, stream {segment.get('stream', 0)}"
        entry = by_pool.setdefault(key, {"reserved_mb": 0.0, "allocated_mb": 0.0, "segments": 0})
        entry["reserved_mb"] += segment.get("total_size", 0) / MB
        entry["allocated_mb"] += segment.get("allocated_size", 0) / MB
        entry["segments"] += 1
        blocks += [(b["size"], key) for b in segment.get("blocks", []) if b.get("state") == "active_allocated"]
    return {"by_pool": dict(sorted(by_pool.items(), key=lambda item: -item[1]["reserved_mb"])),
            "largest_blocks": [{"mb": size / MB, "pool": key} for size, key in sorted(blocks, reverse=True)[:largest]]}


def write(profile: Any, summary: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    profile.export_chrome_trace(str(folder / "trace.json"))
    (folder / "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
    sort = "self_device_time_total" if summary["kernel_ms"] else "self_cpu_time_total"
    (folder / "profile.txt").write_text(profile.key_averages().table(sort_by=sort, row_limit=40) + "\n")


class StepProfiler:
    """Records updates ``start + 1 .. start + count`` on this rank; ``after(step)`` is called after
    each update with the number of updates done. Nothing is recorded when ``folder`` is None."""

    def __init__(self, folder: str | None, start: int, count: int, device: torch.device):
        self.folder, self.start, self.count, self.device = folder, start, count, device
        self.profile: Any = None
        self.began = 0.0
        self.first_update: dict | None = None

    def after(self, step: int) -> None:
        if self.folder is None:
            return
        if self.first_update is None and self.device.type == "cuda":
            self._synchronize()
            self.first_update = {"update": step, **memory_now(self.device)}
        if step == self.start:
            self._synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profile = torch.profiler.profile(activities=activities)
            self.profile.__enter__()
            self.began = time.perf_counter()
        elif step == self.start + self.count and self.profile is not None:
            self._synchronize()
            wall = time.perf_counter() - self.began
            self.profile.__exit__(None, None, None)
            summary = summarize(self.profile, self.count, wall)
            if self.device.type == "cuda":
                summary["memory"] = {"first_update": self.first_update, "window_end": memory_now(self.device),
                                     **pools(torch.cuda.memory._snapshot(self.device))}
            write(self.profile, summary, Path(self.folder))
            self.profile, self.folder = None, None

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
