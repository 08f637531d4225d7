"""Where a run's start-up goes: each process's phases, from the command to the first step.

Train.py writes a ``startup`` record to LOG_DIR/metrics.jsonl at the end of a run (harness/control/timeline.py):
the parent's marks (process created, imports done, inputs checked, workers forked, first step
reported) and each worker's (process created, imports done, the training function received and
its imports done, data loaded, model built, communicator up, first step done). This prints them as
seconds since the parent's process was created, and how long each phase took.

    python Train.py --log-dir runs/start && python -m scripts.startup_timeline runs/start
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PHASES = {   # phase: what the time since the previous mark of the same process was spent on
    "process": "(process created)",
    "imported": "interpreter and imports",
    "checked": "inputs checked (data facts, model on the meta device)",
    "forked": "workers asked for (the zygote forks them; they connect by the first exec)",
    "exec": "training function received; its imports",
    "data": "data opened / loaded",
    "model": "model and optimizer built",
    "communicator": "communicator up (rendezvous with the other ranks)",
    "first_step": "first step done (all-reduce included)",
}


def table(record: dict) -> str:
    processes = {"parent": record["parent"], **{f"rank {r}": m for r, m in enumerate(record["workers"])}}
    zero = record["parent"]["process"] or min(t for m in processes.values() for t in m.values() if t)
    lines = [f"{'phase':<14}" + "".join(f"{name:>16}" for name in processes) + "   spent on"]
    for phase, meaning in PHASES.items():
        if not any(phase in marks for marks in processes.values()):
            continue
        cells = []
        for marks in processes.values():
            names = sorted((p for p in PHASES if marks.get(p) is not None), key=marks.get)
            if marks.get(phase) is None:
                cells.append(f"{'':>16}")
                continue
            before = names[names.index(phase) - 1] if names.index(phase) else None
            step = f" (+{marks[phase] - marks[before]:.2f})" if before else ""
            cells.append(f"{marks[phase] - zero:>7.2f}{step:>9}")
        lines.append(f"{phase:<14}" + "".join(cells) + f"   {meaning}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log_dir", type=Path, help="the run's --log-dir (holding metrics.jsonl)")
    args = p.parse_args()
    path = args.log_dir / "metrics.jsonl"
    if not path.is_file():
        print(f"startup_timeline.py: error: {path} does not exist; give the --log-dir of a finished run", file=sys.stderr)
        return 2
    records = [json.loads(line) for line in path.read_text().splitlines() if '"startup"' in line]
    if not records:
        print(f"startup_timeline.py: error: {path} has no startup record; it is written when a run ends", file=sys.stderr)
        return 2
    print("seconds since the parent process was created (+ time since that process's previous mark)")
    print(table(records[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
