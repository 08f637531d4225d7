"""What the benchmarks share, so that side-by-side variants are built, timed and recorded one way.

- The models every comparison runs (``MODELS``, ``spec_for``, ``build``, ``autocast_for``) and a
  benchmark worker's start (``join``): DDP and this harness then train the same replica on the same
  synthetic batch, and only the wrapper differs.
- Timing: ``time_windows`` (CUDA-synchronised windows after warm-up) and ``median_step``.
- Records: ``bench_record`` (the fields plus the command that made them, the date and the device)
  written by ``write_json`` or ``append_jsonl``, so that every file in bench/results/ says how to
  make it again.
- Subprocesses: ``module_command`` and ``subprocess_env`` rerun a benchmark module (under torchrun,
  say) from the checkout root; ``train_command``, ``run_train`` and ``updates_per_s`` run Train.py
  as a user would and read its metrics; ``first_step_stamp`` reads the time a timed command printed.
- ``bar_chart``: one panel of bars per comparison.

Imports of torch and the harness stay inside functions: a benchmark's ``--help`` works without them.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, ContextManager

ROOT = Path(__file__).resolve().parents[2]

MODELS = {   # name: (registry model, model options, DataInfo args, per-GPU batch, bf16, channels_last)
    "mlp": ("mlp", {"hidden": [512, 512]}, ("image", (1, 28, 28), 10), 128, False, False),
    "resnet50": ("resnet50", {}, ("image", (3, 224, 224), 1000), 128, True, True),
    "gpt2-124m": ("gpt", {"size": "124m"}, ("tokens", (1024,), 50257), 16, True, False),
}
FIRST_STEP = "FIRST_STEP"      # what a timed command prints, with time.time(), when rank 0's first step is done


# -- the models ------------------------------------------------------------------------------------

def spec_for(name: str) -> dict:
    """A benchmark model: one of MODELS, or any registry model on small synthetic images."""
    if name in MODELS:
        model, options, info, batch, bf16, channels_last = MODELS[name]
    else:
        model, options, info, batch, bf16, channels_last = name, {}, ("image", (3, 32, 32), 10), 128, False, False
    return {"name": name, "model": model, "options": options, "info": info, "batch": batch, "bf16": bf16,
            "channels_last": channels_last}


def build(spec: dict, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """The model on the current GPU, SGD with momentum, and one synthetic batch (x, y) on the GPU."""
    import torch
    from harness.checkout.datasets import DataInfo
    from harness.checkout.models import build_model
    torch.manual_seed(seed)
    kind, shape, classes = spec["info"]
    info = DataInfo(kind, tuple(shape), classes)
    model = build_model(spec["model"], info, **spec["options"]).cuda()
    if spec["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    if kind == "tokens":
        x = torch.randint(0, classes, (spec["batch"], *shape), device="cuda")
        y = torch.randint(0, classes, (spec["batch"], *shape), device="cuda")
    else:
        x = torch.randn(spec["batch"], *shape, device="cuda")
        if spec["channels_last"]:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (spec["batch"],), device="cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer, x, y


def autocast_for(spec: dict) -> Callable[[], ContextManager]:
    """bf16 autocast for the models that train in bf16, else a context that does nothing."""
    import torch
    return (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if spec["bf16"] else contextlib.nullcontext


def join(ctx: Any) -> Any:
    """A benchmark worker's start: its GPU, cuDNN autotuning and TF32 on, this harness's communicator
    and torch.distributed's default group (for DDP) over the same ranks. Returns the communicator."""
    import torch
    from harness.collectives.store import init_torch_distributed
    torch.cuda.set_device(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    comm = ctx.communicator()
    init_torch_distributed(ctx, "nccl")
    return comm


# -- timing ----------------------------------------------------------------------------------------

def time_windows(step: Callable[[], Any], warmup: int, windows: int, per_window: int,
                 before_window: Callable[[], Any] = lambda: None) -> tuple[list[float], list[float]]:
    """Seconds per step in each timed window: (wall, host). Wall runs until the GPU has finished
    the window; host until the last step's call returned (host ~ wall: the host is the bottleneck)."""
    import torch
    for _ in range(warmup):
        step()
    walls, hosts = [], []
    for _ in range(windows):
        torch.cuda.synchronize()
        before_window()
        start = time.perf_counter()
        for _ in range(per_window):
            step()
        hosts.append((time.perf_counter() - start) / per_window)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) / per_window)
    return walls, hosts


def median_step(step: Callable[[], Any], warmup: int, windows: int, per_window: int) -> float:
    """Median wall seconds per step over the timed windows."""
    return statistics.median(time_windows(step, warmup, windows, per_window)[0])


# -- records ---------------------------------------------------------------------------------------

def command_line() -> str:
    """This process's command as a user types it (``python -m scripts.bench.NAME ...``)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return shlex.join(["python", *program, *sys.argv[1:]])


def device() -> dict:
    """Where a figure was measured: the GPUs nvidia-smi lists (CUDA stays untouched in this process),
    the CPUs, and the Python and torch versions."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        names = []
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {"gpu_name": names[0].strip() if names else None, "gpus_visible": len(names), "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "torch": torch}


def bench_record(**fields: Any) -> dict:
    """``fields`` after the command that made them, the date and the device."""
    return {"command": command_line(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": device(), **fields}


def write_json(path: Path, record: dict) -> None:
    """Write ``record`` (indented JSON) to ``path``, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def append_jsonl(path: Path | str, row: dict) -> None:
    """Append ``row`` as one JSON line to ``path``, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


ROW_ERRORS = (RuntimeError, subprocess.TimeoutExpired, StopIteration, json.JSONDecodeError)


def record_row(rows: list[dict], out: Path, about: dict, measure: Callable[[], dict]) -> None:
    """Append ``measure()`` to ``rows`` (where it fails, ``about`` with the error: one failed row does not
    end a benchmark), to OUT/rows.jsonl as soon as it is there (a run cut short keeps it), and print it."""
    try:
        rows.append(measure())
    except ROW_ERRORS as e:
        rows.append({**about, "error": str(e)[-2000:]})
    append_jsonl(out / "rows.jsonl", rows[-1])
    print(json.dumps({k: v for k, v in rows[-1].items() if k != "device"}), flush=True)


# -- subprocesses ----------------------------------------------------------------------------------

def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS``: a benchmark module run again, from the checkout root."""
    return [sys.executable, "-m", module, *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout root on PYTHONPATH (for ``-m scripts...`` under torchrun and
    for workers whose current folder is elsewhere), plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def first_step_stamp(stdout: str, what: str) -> float:
    """When rank 0's first step ended, as the timed command ``what`` printed it (FIRST_STEP)."""
    stamps = [float(line.split()[1]) for line in stdout.splitlines() if line.startswith(FIRST_STEP + " ")]
    if not stamps:
        raise RuntimeError(f"{what} printed no first step:\n{stdout[-3000:]}")
    return stamps[0]


def train_command(*flags: str) -> list[str]:
    """Train.py with ``flags``, as a user runs it."""
    return [sys.executable, str(ROOT / "Train.py"), *flags]


def run_train(flags: list[str], log_dir: Path, cwd: Path) -> list[dict]:
    """Run Train.py with ``flags`` and ``--log-dir log_dir`` in ``cwd``; its metrics records. Its output
    goes to log_dir/train.log; a failed run raises with the end of its stderr. A metrics.jsonl already in
    ``log_dir`` (a benchmark run again into the same folder) is removed first: Train.py appends to it, and the
    records read back would be the earlier run's."""
    (log_dir / "metrics.jsonl").unlink(missing_ok=True)
    done = subprocess.run(train_command(*flags, "--log-dir", str(log_dir)), cwd=cwd, capture_output=True, text=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "train.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"Train.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    from harness.training.metrics import read_metrics
    return read_metrics(log_dir / "metrics.jsonl")


def updates_per_s(records: list[dict]) -> float:
    """Updates per second from the end of the first update to the end of the run (the ``first_step``
    and ``done`` records of metrics.jsonl): start-up left out."""
    first = next(r for r in records if r["event"] == "first_step")
    done = next(r for r in records if r["event"] == "done")
    return (done["step"] - first["step"]) / (done["time"] - first["time"])


def median_step_ms(records: list[dict]) -> float:
    """The median time of an update between progress records (metrics.jsonl's ``step`` events, every
    0.5 s): start-up, compilation and the end of an epoch or run (which wait for the device or
    validate) fall in few intervals, so this is the steady step, as a peer's timed windows are. A run
    too short for two progress records has no steady step: its whole rate (``updates_per_s``) stands in."""
    steps = [r for r in records if r["event"] == "step"]
    intervals = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(steps, steps[1:])]
    return statistics.median(intervals) * 1000 if intervals else 1000 / updates_per_s(records)


# -- charts ----------------------------------------------------------------------------------------

def bar_chart(panels: list[tuple[str, list[str], list[float], list[str]]], ylabel: str, path: Path,
              baseline: float | None = None) -> None:
    """One bar panel per (title, labels, values, colours), side by side, saved as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4), squeeze=False)
    for ax, (title, labels, values, colours) in zip(axes[0], panels):
        ax.bar(labels, values, color=colours)
        if baseline is not None:
            ax.axhline(baseline, color="k", lw=0.8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
