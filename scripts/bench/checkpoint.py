"""What frequent checkpoints cost: the same Train.py run with and without --save-every-steps.

A save copies the model and optimizer state to host memory and a background thread writes it
(harness/resilience/saver.py), so training should barely notice. Both runs write their final checkpoint and
neither saves at epoch ends (--save-every is set past the run), so the only difference is the
periodic saves. The rate is updates per second from the end of the first update to the end of the
run (the "first_step" and "done" records of metrics.jsonl); runs alternate, --repeats times each.

    python -m scripts.bench.checkpoint --gpus 0,1 --steps 500 --save-every-steps 100 \\
        --train-flags "--model resnet50 --dataset synthetic --dataset-options '{...}' --batch-size 128 --amp bf16"
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
from pathlib import Path

from scripts.bench.common import append_jsonl, bench_record, run_train, updates_per_s


def measure(train_flags: list[str], work: Path, name: str, steps: int, save_every: int) -> float:
    """Updates per second of one Train.py run, saving every ``save_every`` updates (0: never)."""
    flags = [*train_flags, "--max-steps", str(steps), "--save", str(work / f"{name}.pt"), "--save-every", "1000000",
             *(["--save-every-steps", str(save_every)] if save_every else [])]
    records = run_train(flags, work / name, cwd=work)
    saves = sum(r["event"] == "saved" for r in records)
    if save_every and saves < steps // save_every:
        raise RuntimeError(f"{name}: {saves} saves reported, expected {steps // save_every}")
    return updates_per_s(records)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="0", help="GPU indices, e.g. 0,1; '' for Train.py's CPU workers")
    p.add_argument("--train-flags", default="", help="Train.py's flags for the job (model, data, batch)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--save-every-steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None, help="append the JSON row to this file")
    args = p.parse_args()
    flags = [*(["--gpus", args.gpus] if args.gpus else []), *shlex.split(args.train_flags)]
    rates: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        for repeat in range(args.repeats):
            for variant, every in (("without", 0), ("with", args.save_every_steps)):
                rates[variant].append(measure(flags, Path(tmp), f"{variant}-{repeat}", args.steps, every))
                print(variant, f"{rates[variant][-1]:.3f} updates/s", flush=True)
    without, with_saves = statistics.median(rates["without"]), statistics.median(rates["with"])
    row = bench_record(model=flags[flags.index("--model") + 1] if "--model" in flags else "mlp",
                       gpus=len(args.gpus.split(",")) if args.gpus else 0, save_every_steps=args.save_every_steps,
                       steps=args.steps, updates_per_s_without=without, updates_per_s_with=with_saves,
                       overhead_pct=100 * (without / with_saves - 1), runs=rates)
    print(json.dumps(row))
    if args.out:
        append_jsonl(args.out, row)


if __name__ == "__main__":
    main()
