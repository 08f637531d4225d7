"""Several GPUs of one host: Train.py against torchrun + DDP written the best way a user can, side by
side in one run, on the models and recipes of the one-GPU benchmark (scripts/bench/single.py).

Rows (``bench_multi.json``, a list ``rows``; each with ``model``, ``gpus``, ``variant``,
``samples_per_s`` over all GPUs, ``step_ms``, ``first_step_s`` from the command's start to the end of
rank 0's first update, ``peak_mb`` = torch.cuda.max_memory_reserved of the largest rank, and
``device``):

- ``harness``: Train.py ``--gpus 0,..,N-1`` as a user runs it (``compile`` false: the default CUDA-graphed
  step; true: ``--compile``), on synthetic images (``resnet50``) or on the token file with nanoGPT's
  model.py (``gpt-nanogpt``), with the one-GPU benchmark's flags;
- ``ddp-compile``: torchrun + scripts/bench/peers.py (DDP with gradient_as_bucket_view and static_graph,
  torch.compile, fused optimizer), in both orders (``compile_order``: ``outer`` compiles the DDP module, as
  PyTorch's DDP notes ask; ``inner`` wraps the compiled model, as nanoGPT does);
- ``ddp``: the same DDP eager, a baseline for the compiled rows;
- ``nanogpt-torchrun``: nanoGPT's own train.py under torchrun (gpt-nanogpt only).

Harness rows carry ``vs_ddp_compile``: their samples/s over the best torchrun row of the same model
and GPU count. Every row runs in processes of its own; rows are appended to ``rows.jsonl`` as they
finish, so a run cut short keeps what it measured.

    python -m scripts.bench.multi --gpus 2 --out bench/results/DATE-DEVICE-multi --nanogpt .nanogpt
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.common import (bench_record, device, first_step_stamp, module_command, record_row, subprocess_env,
                                  write_json)
from scripts.bench.single import SAMPLES_PER_STEP, harness_row, make_tokens, nanogpt_row

ROWS = {"resnet50": ("harness", "harness-compile", "ddp-compile", "ddp-compile-inner", "ddp"),
        "gpt-nanogpt": ("harness", "harness-compile", "ddp-compile", "ddp-compile-inner", "ddp", "nanogpt-torchrun")}


def torchrun(gpus: int, module: str, *args: str, timeout: float = 900) -> tuple[dict, float]:
    """Run ``module`` under torchrun on ``gpus`` GPUs: rank 0's last JSON line and its first step's
    time from the command's start."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
               *module_command(module, *args)[1:]]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=subprocess_env())
    if done.returncode != 0:       # the first worker's traceback, not torchrun's own
        first = done.stderr.find("Traceback")
        raise RuntimeError(f"torchrun {module} failed ({done.returncode}):\n{done.stderr[first:first + 3000]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), first_step_stamp(done.stdout, module) - started


def run_row(model: str, variant: str, gpus: int, steps: int, args: argparse.Namespace, tokens: Path) -> dict:
    if variant.startswith("harness"):
        measured = harness_row(model, variant, steps, args.out, tokens, gpus=gpus)
    elif variant == "nanogpt-torchrun":
        measured = nanogpt_row(steps, Path(args.nanogpt).resolve(), tokens, gpus=gpus)
    else:
        measured, first = torchrun(gpus, "scripts.bench.peers", "--model", model, "--wrap", variant,
                                   "--steps", str(steps), "--tokens", str(tokens))
        measured["first_step_s"] = first
    named = {"variant": "harness", "compile": variant.endswith("compile")} if variant.startswith("harness") else \
        {"variant": "ddp-compile", "compile_order": "inner" if variant.endswith("inner") else "outer"} \
        if variant.startswith("ddp-compile") else {"variant": variant}
    return {"model": model, "gpus": gpus, **named,
            **measured, "samples_per_s": SAMPLES_PER_STEP[model] * gpus / measured["step_ms"] * 1000,
            "device": device()}


def compare(rows: list[dict]) -> None:
    """vs_ddp_compile on harness rows: over the best torchrun row of the same model and GPU count."""
    for row in rows:
        if row["variant"] == "harness":
            best = max((r["samples_per_s"] for r in rows if r["model"] == row["model"] and r["gpus"] == row["gpus"]
                        and r["variant"] != "harness"), default=None)
            row["vs_ddp_compile"] = row["samples_per_s"] / best if best else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-multi"), help="folder for bench_multi.json and the logs")
    p.add_argument("--gpus", default="2", help="GPU counts, comma-separated (default 2)")
    p.add_argument("--models", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--variants", default=None, help="only these variants (comma-separated; harness-compile is "
                                                    "Train.py --compile)")
    p.add_argument("--nanogpt", default=".nanogpt", help="a checkout of karpathy/nanoGPT (model.py, train.py)")
    p.add_argument("--steps", type=json.loads, default={"resnet50": 200, "gpt-nanogpt": 30},
                   help="timed updates per model, as JSON")
    args = p.parse_args()
    args.out = args.out.resolve()
    os.environ["NANOGPT_DIR"] = str(Path(args.nanogpt).resolve())
    tokens = make_tokens(args.out / "tokens")
    rows = []
    for gpus in map(int, args.gpus.split(",")):
        for model in args.models.split(","):
            for variant in ROWS[model]:
                if args.variants and variant not in args.variants.split(","):
                    continue
                record_row(rows, args.out, {"model": model, "gpus": gpus, "variant": variant},
                           lambda: run_row(model, variant, gpus, args.steps[model], args, tokens))
    compare([r for r in rows if "error" not in r])
    write_json(args.out / "bench_multi.json", bench_record(rows=rows))


if __name__ == "__main__":
    main()
