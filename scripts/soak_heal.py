"""Soak test of healing in place: kill workers of a running Train.py again and again, then check that
the run finished exactly where an uninterrupted one does.

    python -m scripts.soak_heal --runs 2 --kills 10 --out bench/results/soak.jsonl
    python -m scripts.soak_heal --gpus 0,1 --train-flags "--model resnet50 --dataset synthetic ..."

Each run trains the same job with --max-restarts equal to the kills and SLACK more (a worker that an
overloaded machine keeps from its heartbeats past the timeout is a failure too, healed like the
others; ``causes`` lists every failure): by default a CPU (gloo) job on a linear model slowed down to
20 ms a step; with --gpus, GPU workers (NCCL) on what --train-flags says (model, data, batch).
Failures are healed in place, or with --heal off every worker restarts from the last checkpoint
(--save-every-steps). Whenever training has gone on after the last heal, a random worker gets
SIGKILL or SIGSTOP (a hang: the parent kills it after --heartbeat-timeout) at a random moment. One uninterrupted run with the same flags gives the
parameters every soaked run must end with. One JSON row per run: model, gpus (0: CPU workers), kills,
recover_s_median / recover_s_max (from the signal to the workers' report that training goes on),
heal_phases_s (for each heal, seconds from the signal to each phase: survivors' "failed" and
"rejoined", the replacement's start-up marks, everyone's "handed_over" and "attached"), queued (for
each heal, the most updates a survivor had issued past the last one applied),
steps_lost_max, max_abs_diff_vs_uninterrupted (parameters and buffers, BatchNorm's running
statistics aside), max_abs_diff_running_stats (those: they are per rank, and a replacement starts
from the donor's; null without BatchNorm), restarts (heals that fell back to a checkpoint
restart), finished (it ended at its last step), last_step (the last update it logged), exit_status (Train.py's), orphans (live processes of the
run left after it; orphans_left says which), hung (the run did not end in time), seed.
Run it from the checkout's root; the soak itself is tests/helpers/soak.py, which tests/test_heal.py runs in CI.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from tests.helpers.soak import faults, soak


def main() -> None:
    """Exits 1, naming each failed run and why (``faults``), where a run did not heal to the uninterrupted end."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--kills", type=int, default=10, help="signals per run")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--workers", type=int, default=3, help="CPU workers of the default job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpus", default=None, help="GPU workers on these GPUs, e.g. 0,1 (default: the CPU job)")
    p.add_argument("--train-flags", default="", help="with --gpus: Train.py's flags for the job (model, data, batch); "
                                                      "else flags added to the CPU job (e.g. \"--zero 2\")")
    p.add_argument("--save-every-steps", type=int, default=50)
    p.add_argument("--signals", default="SIGKILL,SIGSTOP", help="the signals to send, chosen at random")
    p.add_argument("--heal", choices=("on", "off"), default="on",
                   help="on: heal in place; off: restart every worker from the last checkpoint")
    p.add_argument("--out", default=None, help="append the JSON rows to this file (and each run's stderr to "
                                               "OUT.soak-N.stderr)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole soak: then what runs is killed and the soak fails")
    args = p.parse_args()
    rows = soak(args.runs, args.kills, args.steps, args.workers, args.seed, args.gpus, shlex.split(args.train_flags),
                args.save_every_steps, tuple(args.signals.split(",")), Path(args.out) if args.out else None, args.heal,
                args.time_limit)
    for row in rows:
        line = json.dumps(row)
        print(line)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    failed = [f"run {n}: {'; '.join(faults(row))}" for n, row in enumerate(rows, 1) if faults(row)]
    if failed:
        sys.exit("soak_heal: failed: " + " | ".join(failed))


if __name__ == "__main__":
    main()
