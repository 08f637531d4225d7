"""What --zero 1 and 2 save per worker, and what they cost a step: Train.py with --zero 0, 1 and 2 on N
workers, side by side.

Rows (``bench_zero.json``, a list ``rows``): ``model``, ``workers``, ``zero``, ``variant`` (``harness``),
per worker ``param_mb``, ``grad_mb``, ``optimizer_mb`` (the largest over the ranks, from the run's
"memory" record) and ``peak_mb`` (GPU workers: peak allocated; None on CPU), ``step_ms`` (from the
end of the first update to the end of the run), ``largest_bucket_mb`` and ``device``. The default model is
an MLP of 4 layers of 1024 on digits (2.2M parameters) with AdamW: two fp32 moments per parameter.
The multi-GPU comparison with DDP, torch's ZeroRedundancyOptimizer and FSDP2 needs several GPUs and
is its own benchmark.

    python -m scripts.bench.zero --out bench/results/DATE-cpu2-zero --workers 2,4,8
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.bench.common import ROOT, append_jsonl, bench_record, device, run_train, updates_per_s, write_json

MODEL = ["--model", "mlp", "--model-options", json.dumps({"hidden": [1024, 1024, 1024, 1024]}), "--dataset", "digits"]
RECIPE = ["--optimizer", "adamw", "--lr", "1e-3", "--batch-size", "8", "--clip-grad", "1.0", "--bucket-mb", "4"]


def row(workers: int, zero: int, steps: int, scratch: Path, extra: list[str]) -> dict:
    flags = [*MODEL, *RECIPE, "--cpu-workers", str(workers), "--zero", str(zero), "--max-steps", str(steps),
             "--save", "", *extra]
    records = run_train(flags, scratch / f"w{workers}-z{zero}", ROOT)
    memory = next(r for r in records if r["event"] == "memory")
    largest = {key: max(rank[key] or 0 for rank in memory["ranks"]) for key in ("param_mb", "grad_mb", "optimizer_mb")}
    peaks = [rank["peak_mb"] for rank in memory["ranks"] if rank["peak_mb"] is not None]
    return {"model": "mlp-4x1024", "workers": workers, "zero": zero, "variant": "harness", **largest,
            "peak_mb": max(peaks) if peaks else None, "step_ms": 1000 / updates_per_s(records),
            "largest_bucket_mb": memory["largest_bucket_mb"], "device": device()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-zero"), help="folder for bench_zero.json and the logs")
    p.add_argument("--workers", default="2,4,8", help="worker counts, comma-separated (default 2,4,8)")
    p.add_argument("--steps", type=int, default=30, help="updates per run (default 30)")
    p.add_argument("--gpus", action="store_true", help="one worker per GPU (--gpus 0,...,N-1) instead of CPU workers")
    args = p.parse_args()
    rows = []
    for workers in map(int, args.workers.split(",")):
        extra = ["--gpus", ",".join(map(str, range(workers)))] if args.gpus else []
        for zero in (0, 1, 2):
            rows.append(row(workers, zero, args.steps, args.out / "logs", extra))
            append_jsonl(args.out / "rows.jsonl", rows[-1])
            print(json.dumps(rows[-1]))
    write_json(args.out / "bench_zero.json", bench_record(rows=rows))


if __name__ == "__main__":
    main()
