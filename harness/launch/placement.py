"""Which child gets which GPU, decided without touching CUDA in the parent.

The parent only supervises: it must not create a CUDA context, so GPUs are counted through
NVML (the driver's management library, loaded with ctypes) and CUDA_VISIBLE_DEVICES. Each child
is then started with CUDA_VISIBLE_DEVICES naming one GPU, so it sees that GPU as cuda:0.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Mapping, Sequence, Union

GpuSpec = Union[None, str, Sequence[int]]


def _visible_devices() -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES up to the first invalid one (as CUDA reads it), or None."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        entries.append(item)
    return entries


@functools.cache
def _nvml_count() -> int:
    """The machine's GPUs, asked once: NVML's init can take a good part of a second, and a fork asks
    for every child (placement, then each child's environment) besides Train.py's own checks."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def visible_gpus() -> list[str]:
    """Identifiers (as CUDA_VISIBLE_DEVICES takes them) of the GPUs this process may use."""
    visible = _visible_devices()
    if visible is not None:
        return visible
    return [str(i) for i in range(_nvml_count())]


def resolve_gpus(gpus: GpuSpec) -> list[int]:
    """Turn None, "all", "0,1" or [0, 1] into a list of visible GPU indices; ValueError if absent."""
    if gpus is None:
        return []
    available = visible_gpus()
    if isinstance(gpus, str) and gpus.strip().lower() == "all":
        if not available:
            raise ValueError("--gpus all but no GPU was found; leave --gpus out to run on CPU workers "
                             "(--cpu-workers N; from Python: gpus=None)")
        return list(range(len(available)))
    indices = gpu_indices(gpus)
    for index in indices:
        if not isinstance(index, int) or not 0 <= index < len(available):
            raise ValueError(f"GPU {index!r} requested but {len(available)} GPU(s) found"
                             f"{' (indices 0..' + str(len(available) - 1) + ')' if available else ''}")
    return indices


def gpu_indices(gpus: str | Sequence[int]) -> list[int]:
    """"0,1" or [0, 1] as a list of indices, each once; not yet checked against any machine's GPUs."""
    if isinstance(gpus, str):
        try:
            gpus = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            raise ValueError(f"gpus={gpus!r}: expected 'all' or comma-separated GPU indices like '0,1'") from None
    indices = list(gpus)
    if not indices:
        raise ValueError("gpus is empty; pass None for CPU workers or at least one GPU index")
    if len(set(indices)) != len(indices):
        raise ValueError(f"gpus={indices} names a GPU twice; list each GPU once")
    return indices


def host_gpus(gpus: GpuSpec, most: int) -> list[int]:
    """The GPU indices children on other hosts use, which this machine cannot see: "all" is 0..most-1
    (a GPU for each child of the host with the most), "0,1" those indices on every host."""
    if gpus is None:
        return []
    if isinstance(gpus, str) and gpus.strip().lower() == "all":
        return list(range(most))
    indices = gpu_indices(gpus)
    if min(indices) < 0:
        raise ValueError(f"gpus={gpus!r}: GPU indices start at 0")
    return indices


def assign(n: int, gpus: Sequence[int]) -> list[int | None]:
    """Spread n children over gpus in contiguous blocks: 4 children on [0, 1] -> [0, 0, 1, 1]."""
    if not gpus:
        return [None] * n
    return [gpus[rank * len(gpus) // n] for rank in range(n)] if n >= len(gpus) else list(gpus[:n])


def assign_on_hosts(places: Sequence[tuple[int, int]], gpus: GpuSpec) -> list[int | None]:
    """GPUs of children on other hosts (``host_gpus``); ``places``: (index among the host's children,
    their number) per child. Each host's children are spread over its GPUs as ``assign`` does here,
    so with "all" each child has a GPU of its own."""
    indices = host_gpus(gpus, max((count for _, count in places), default=0))
    return [assign(count, indices)[index] for index, count in places]


# A GPU child's caching allocator grows its segments in place (expandable segments) unless the
# environment configures the allocator itself. A CUDA graph's private pool and the segments that the
# graph's warm-up leaves on its side stream (where the optimizer state is created) then hold no slack
# that nothing else can use: 1.1 GB less for ResNet-50 and 1.4 GB less for Hugging Face's GPT-2 124M on
# one H100, at the same step time
# (bench/results/2026-11-25-h100-single-profiles).
ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
ALLOCATOR_SETTINGS = "expandable_segments:True"


def allocator_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings a GPU child gets: none where ``env`` names its own."""
    if any(name in env for name in ALLOCATOR_VARIABLES):
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR_SETTINGS}


def on_this_node(env: Mapping[str, str]) -> dict[str, str]:
    """A remote child's environment with its GPU indices (0, 1, ...: the parent cannot see the node's GPUs)
    turned into this node's names for them, as its CUDA_VISIBLE_DEVICES lists them (Slurm's --gres, a
    container's devices); unchanged for a CPU child, and where the node sees its GPUs as 0, 1, ...
    A node agent applies it to the children it starts (harness/launch/agents.py)."""
    visible = visible_gpus()

    def named(value: str) -> str:
        return ",".join(visible[int(index)] for index in value.split(",")) if value else value
    if not env.get("CUDA_VISIBLE_DEVICES"):
        return dict(env)
    return {**env, "CUDA_VISIBLE_DEVICES": named(env["CUDA_VISIBLE_DEVICES"]), "HARNESS_GPU": named(env["HARNESS_GPU"])}


def child_environment(gpu: int | None, threads: int) -> dict[str, str]:
    """Environment entries that pin one child: its GPU (or none) and its CPU thread count."""
    env = {"CUDA_VISIBLE_DEVICES": visible_gpus()[gpu] if gpu is not None else ""}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
