"""What --zero 1 and 2 save per worker, and what they cost a step: Train.py with --zero 0, 1 and 2 on N
workers, side by side.

Rows (``bench_zero.json``, a list ``rows``): ``model``, ``workers``, ``zero``, ``variant`` (``harness``),
``replica`` (``--replica``: --zero with --heal on, each shard replicated on the next worker),
per worker ``param_mb``, ``grad_mb``, ``optimizer_mb`` (the largest over the ranks, from the run's
"memory" record) and ``peak_mb`` (GPU workers: peak allocated; None on CPU), ``step_ms`` (the median
update between progress records, as scripts/bench/single.py times Train.py), ``largest_bucket_mb`` and ``device``. The default model is
an MLP of 4 layers of 1024 on digits (2.2M parameters) with AdamW: two fp32 moments per parameter.

``--peers`` (GPUs): GPT-2 124M on nanoGPT's model and recipe (scripts/bench/single.py), Train.py
``--zero 0/1/2`` against what a torchrun user would run instead (scripts/bench/peers.py): ``ddp``,
``torch-zero`` (DDP + torch's ZeroRedundancyOptimizer) and ``fsdp2`` (fully_shard,
reshard_after_forward=False). Every row there has ``peak_mb`` = the largest rank's peak allocated
(Train.py: at its first update, graph and optimizer state made; torchrun: at the run's end) and
``peak_reserved_mb``. ``--grad-accum A`` runs every one of those rows with A micro-batches of 16 an update instead
of the recipe's 4 (what --zero 2's reduce-scatter of every micro-batch costs against DDP's one all-reduce).
``--compile`` compiles every one of those rows (row ``compile`` true): Train.py ``--compile`` (the compiled step
in the whole-step CUDA graph) against torch.compile of the torchrun module, loss included (peers.py's
``ddp-compile``, ``torch-zero-compile``, ``fsdp2-compile``).

    python -m scripts.bench.zero --out bench/results/DATE-cpu2-zero --workers 2,4,8
    python -m scripts.bench.zero --out bench/results/DATE-DEVICE-zero --workers 2 --gpus --peers
    python -m scripts.bench.zero --out bench/results/DATE-DEVICE-zero-compiled --workers 2 --gpus --peers --compile
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.bench.common import ROOT, bench_record, device, median_step_ms, record_row, run_train, write_json
from scripts.bench.multi import torchrun
from scripts.bench.single import GPT_RECIPE, make_tokens

MODEL = ["--model", "mlp", "--model-options", json.dumps({"hidden": [1024, 1024, 1024, 1024]}), "--dataset", "digits"]
RECIPE = ["--optimizer", "adamw", "--lr", "1e-3", "--batch-size", "8", "--clip-grad", "1.0", "--bucket-mb", "4"]


def row(workers: int, zero: int, steps: int, scratch: Path, extra: list[str], model: str = "mlp-4x1024",
        replica: bool = False) -> dict:
    flags = [*extra, "--zero", str(zero), "--max-steps", str(steps), "--save", "",
             *(["--heal", "on", "--max-restarts", "1"] if replica else [])]
    records = run_train(flags, scratch / f"{model}-w{workers}-z{zero}{'-replica' * replica}", ROOT)
    memory = next(r for r in records if r["event"] == "memory")
    largest = {key: max(rank[key] or 0 for rank in memory["ranks"]) for key in ("param_mb", "grad_mb", "optimizer_mb")}
    peaks = [rank["peak_mb"] for rank in memory["ranks"] if rank["peak_mb"] is not None]
    done = next(r for r in records if r["event"] == "done")
    return {"model": model, "workers": workers, "zero": zero, "variant": "harness", "replica": replica, **largest,
            "peak_mb": max(peaks) if peaks else None, "peak_reserved_mb": done.get("peak_gpu_mb"),
            "step_ms": median_step_ms(records), "largest_bucket_mb": memory["largest_bucket_mb"],
            "device": device()}


PEERS = (("ddp", 0), ("torch-zero", 1), ("fsdp2", 2))      # torchrun's variant and the --zero it matches


def gpt_flags(workers: int, tokens: Path, accum: int | None, compile: bool) -> list[str]:
    """Train.py's flags for GPT-2 124M on nanoGPT's model and recipe, one worker per GPU; ``accum``: another
    number of micro-batches per update than the recipe's 4."""
    return ["--gpus", ",".join(map(str, range(workers))), "--model", "scripts.bench.nanogpt_model:gpt2",
            "--dataset", "tokens", "--data-dir", str(tokens), "--dataset-options",
            json.dumps({"block_size": 1024, "vocab_size": 50257}), *GPT_RECIPE, *accumulation(accum),
            *(["--compile"] if compile else [])]


def accumulation(accum: int | None) -> list[str]:
    """``--grad-accum``, Train.py's and peers.py's, where another number than the recipe's is asked for."""
    return ["--grad-accum", str(accum)] if accum else []


def peer_row(workers: int, wrap: str, zero: int, steps: int, tokens: Path, accum: int | None, compile: bool) -> dict:
    """The same GPT under torchrun and ``wrap`` (scripts/bench/peers.py), compiled or not."""
    measured, _ = torchrun(workers, "scripts.bench.peers", "--model", "gpt-nanogpt",
                           "--wrap", f"{wrap}-compile" if compile else wrap,
                           "--steps", str(steps), "--tokens", str(tokens), *accumulation(accum))
    return {"model": "gpt-nanogpt", "workers": workers, "zero": zero, "variant": wrap, "compile": compile,
            **{k: measured[k] for k in ("param_mb", "grad_mb", "optimizer_mb", "step_ms")},
            "peak_mb": measured["peak_allocated_mb"], "peak_reserved_mb": measured["peak_mb"], "device": device()}


def measure(rows: list[dict], workers: int, args: argparse.Namespace) -> None:
    """Every row of ``workers`` workers, each recorded as it is made (common.record_row)."""
    logs = args.out / "logs"
    if args.peers:
        tokens = make_tokens(args.out / "tokens")
        about = {"model": "gpt-nanogpt", "workers": workers, "compile": args.compile}
        for zero in args.zero if "harness" in args.variants.split(",") else ():
            record_row(rows, args.out, {**about, "zero": zero, "variant": "harness"},
                       lambda: {**row(workers, zero, args.steps, logs,
                                      gpt_flags(workers, tokens, args.grad_accum, args.compile), "gpt-nanogpt"),
                                "compile": args.compile})
        for wrap, zero in (p for p in PEERS if p[0] in args.variants.split(",")):
            record_row(rows, args.out, {**about, "zero": zero, "variant": wrap},
                       lambda: peer_row(workers, wrap, zero, args.steps, tokens, args.grad_accum, args.compile))
        return
    where = ["--gpus", ",".join(map(str, range(workers)))] if args.gpus else ["--cpu-workers", str(workers)]
    for zero, replica in [(z, False) for z in args.zero] + [(z, True) for z in args.zero if z and args.replica]:
        record_row(rows, args.out, {"model": "mlp-4x1024", "workers": workers, "zero": zero, "variant": "harness",
                                    "replica": replica},
                   lambda: row(workers, zero, args.steps, logs, [*MODEL, *RECIPE, *where], replica=replica))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-zero"), help="folder for bench_zero.json and the logs")
    p.add_argument("--workers", default="2,4,8", help="worker counts, comma-separated (default 2,4,8)")
    p.add_argument("--steps", type=int, default=30, help="updates per run (default 30)")
    p.add_argument("--gpus", action="store_true", help="one worker per GPU (--gpus 0,...,N-1) instead of CPU workers")
    p.add_argument("--peers", action="store_true", help="GPT-2 124M against DDP, ZeroRedundancyOptimizer and FSDP2 "
                                                        "under torchrun (GPUs; see above)")
    p.add_argument("--replica", action="store_true",
                   help="also --zero 1 and 2 with --heal on (each shard replicated on the next worker; row replica true)")
    p.add_argument("--variants", default="harness,ddp,torch-zero,fsdp2", help="with --peers: which rows")
    p.add_argument("--grad-accum", type=int, help="with --peers: micro-batches per update, every row (default: "
                                                  "nanoGPT's recipe, 4)")
    p.add_argument("--compile", action="store_true", help="with --peers: every row compiled (Train.py --compile; "
                                                           "torch.compile of the torchrun module, loss included)")
    p.add_argument("--zero", default="0,1,2", help="the harness rows' --zero stages, comma-separated (default 0,1,2)")
    args = p.parse_args()
    args.zero = [int(z) for z in args.zero.split(",")]
    args.out = args.out.resolve()
    rows: list[dict] = []
    for workers in map(int, args.workers.split(",")):
        measure(rows, workers, args)
    write_json(args.out / "bench_zero.json", bench_record(rows=rows))


if __name__ == "__main__":
    main()
