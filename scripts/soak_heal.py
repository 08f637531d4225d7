"""Soak test of healing in place: kill workers of a running Train.py again and again, then check that
the run finished exactly where an uninterrupted one does.

    python scripts/soak_heal.py --runs 2 --kills 10 --out bench/results/soak.jsonl
    python scripts/soak_heal.py --gpus 0,1 --train-flags "--model resnet50 --dataset synthetic ..."

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
restart), finished (it ended at its last step), exit_status (Train.py's), orphans (live processes of the
run left after it; orphans_left says which), hung (the run did not end in time).
tests/test_heal.py runs it in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SLOW_MODEL = '''
import time
import torch

class Slow(torch.nn.Linear):
    """A linear model whose forward pass takes ``delay`` seconds, so that signals land mid-training
    (the soak here, and the tests of signals, restarts and healing). ``ballast``: that many floats
    of an unused buffer, which make its checkpoints slow to write."""
    def __init__(self, inputs, outputs, delay, ballast=0):
        super().__init__(inputs, outputs)
        self.delay = delay
        if ballast:
            self.register_buffer("ballast", torch.zeros(ballast))

    def forward(self, x):
        time.sleep(self.delay)
        return super().forward(x.flatten(1))

def model(info, delay=0.25, ballast=0):
    return Slow(64, info.num_classes, delay, ballast)
'''
RUN_TIMEOUT = 600.0
SLACK = 2                   # failures allowed beyond the signals sent (see the docstring)
RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")   # BatchNorm's, per rank


def cpu_job(workers: int) -> list[str]:
    """The default job: CPU workers on a linear model whose steps take 20 ms."""
    return ["--model", "soak_model:model", "--model-options", '{"delay": 0.02}', "--batch-size", "8",
            "--cpu-workers", str(workers), "--heartbeat-timeout", "2"]


def flags(work: Path, name: str, job: list[str], steps: int, kills: int, save_every: int, heal: str) -> list[str]:
    return [*job, "--max-steps", str(steps), "--save", str(work / f"{name}.pt"), "--log-dir", str(work / name),
            "--save-every-steps", str(save_every), *(["--max-restarts", str(kills + SLACK), "--heal", heal] if kills else [])]


def start(work: Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(ROOT / "Train.py"), *args], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def records(log_dir: Path) -> list[dict]:
    path = log_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def workers(found: list[dict]) -> list[int]:
    """The run's training workers now, from its log: the "workers" record, and each heal's (not the
    warm spare, which trains nothing until it takes a dead rank's place)."""
    latest = [r["pids"] for r in found if r["event"] in ("workers", "recovered")]
    return [pid for pid in (latest[-1] if latest else []) if os.path.exists(f"/proc/{pid}")]


def in_session(session: int) -> list[int]:
    """The live processes of ``session`` (zombies aside: dead, they wait only for a parent to reap them,
    which a container's first process may never do)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != session:
            fields = _read(f"/proc/{name}/stat").rsplit(b")", 1)[-1].split()
            if len(fields) > 3 and int(fields[3]) == session and fields[0] != b"Z":
                found.append(int(name))
    return found


def described(pids: list[int]) -> list[str]:
    """Each process as "pid state command", for the row of a run that left some behind."""
    def one(pid: int) -> str:
        state = (_read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split() or [b"?"])[0].decode()
        command = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
        return f"{pid} {state} {command[:120]}"
    return [one(pid) for pid in pids]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def soak_run(work: Path, name: str, job: list[str], steps: int, kills: int, save_every: int,
             rng: random.Random, signals: list[signal.Signals], heal: str) -> dict:
    process = start(work, flags(work, name, job, steps, kills, save_every, heal))
    log_dir, signalled, stopped = work / name, [], []
    deadline = time.monotonic() + RUN_TIMEOUT
    while len(signalled) < kills and process.poll() is None and time.monotonic() < deadline:
        found = records(log_dir)
        events = [r["event"] for r in found]
        healed = events.count("recovered") + events.count("restart")
        last = max((i for i, e in enumerate(events) if e in ("recovered", "restart")), default=-1)
        if healed < len(signalled) or "step" not in events[last + 1:]:
            time.sleep(0.05)
            continue
        time.sleep(rng.uniform(0.0, 0.3))
        pids = workers(found)
        if not pids:
            continue
        victim, sig = rng.choice(pids), rng.choice(signals)
        os.kill(victim, sig)
        signalled.append((time.time(), sig.name))
        if sig == signal.SIGSTOP:
            stopped.append(victim)
    hung = False
    try:
        _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    orphans = in_session(process.pid)
    left = described(orphans)
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    found = records(log_dir)
    heals = [r for r in found if r["event"] == "recovered"]
    # Kill to training resumed: from each signal to the first heal reported after it, or after a restart
    # to the restarted group's first update. A restart loses the updates since its checkpoint: at least
    # those between it and the last progress record before the signal.
    recover, lost, phases = [], [r["steps_lost"] for r in heals], []
    queued = [max(filter(None, r.get("queued", [])), default=0) for r in heals]
    for when, _ in signalled:
        after = [r for r in found if r["event"] in ("recovered", "first_step") and r["time"] >= when]
        if after:
            recover.append(after[0]["time"] - when)
            if after[0]["event"] == "recovered":
                phases.append(heal_phases(after[0], when))
            if after[0]["event"] == "first_step":
                before = [r["step"] for r in found if r["event"] == "step" and r["time"] < when]
                lost.append(max(before, default=0) - (after[0]["step"] - 1))
    messages = [line for line in err.splitlines() if "update/s" not in line and line.strip()]
    return {"process_status": process.returncode, "stderr_tail": messages[-8:], "hung": hung,
            "orphans": len(orphans), "left": left, "signals": [s for _, s in signalled], "recover": recover,
            "steps_lost": lost, "phases": phases, "queued": queued,
            "causes": [f'{r["event"]}: rank {r["rank"]} {r["cause"]}' + (f' (not healed: {r["not_healed"]})' if "not_healed" in r else "")
                       for r in found if r["event"] in ("recovered", "restart")],
            "restarts": sum(r["event"] == "restart" for r in found), "stderr": err}


def heal_phases(record: dict, signalled: float) -> dict[str, float]:
    """Seconds from the signal to each phase of a heal, as the slowest rank reached it (the phases
    of harness/training/loop.py's heal, and the replacement's start-up marks since the signal)."""
    latest: dict[str, float] = {}
    for marks in record.get("phases", []):
        for phase, at in marks.items():
            if at is not None and at >= signalled:
                latest[phase] = max(latest.get(phase, 0.0), round(at - signalled, 3))
    return dict(sorted(latest.items(), key=lambda item: item[1]))


def max_abs_diff(state: dict, expected: dict, running_stats: bool) -> float | None:
    """The largest difference between two model state dicts, over BatchNorm's running statistics or
    over everything else; None where there is nothing of the kind."""
    diffs = [(state[k].double() - v.double()).abs().max().item() for k, v in expected.items()
             if k.endswith(RUNNING_STATS) == running_stats]
    return max(diffs, default=None)


def soak(runs: int, kills: int, steps: int = 400, workers_n: int = 3, seed: int = 0, gpus: str | None = None,
         train_flags: list[str] | None = None, save_every: int = 50,
         signals: tuple[str, ...] = ("SIGKILL", "SIGSTOP"), stderr_to: Path | None = None,
         heal: str = "on") -> list[dict]:
    """The soak's rows, one per run (see the module's docstring). ``gpus`` ("0,1"): GPU workers on the
    job ``train_flags`` describes, instead of the default CPU job."""
    rng = random.Random(seed)
    rows = []
    job = ["--gpus", gpus, *(train_flags or [])] if gpus else cpu_job(workers_n)
    model = job[job.index("--model") + 1] if gpus and "--model" in job else "soak_model (Linear 64x10 on digits)"
    workers_n = len(gpus.split(",")) if gpus else workers_n
    sent = [signal.Signals[name] for name in signals]
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        (work / "soak_model.py").write_text(SLOW_MODEL)
        straight = start(work, flags(work, "straight", job, steps, 0, save_every, heal))
        _, err = straight.communicate(timeout=RUN_TIMEOUT)
        if straight.returncode != 0:
            raise RuntimeError(f"the uninterrupted run failed:\n{err}")
        expected = torch.load(work / "straight.pt", map_location="cpu", weights_only=False)["model"]
        for run in range(runs):
            name = f"soak-{run}"
            result = soak_run(work, name, job, steps, kills, save_every, rng, sent, heal)
            if stderr_to is not None:
                stderr_to.with_name(f"{stderr_to.name}.{name}.stderr").write_text(result["stderr"])
            saved = work / f"{name}.pt"
            diff, stats_diff, finished = None, None, False
            if result["process_status"] == 0 and saved.exists():
                final = torch.load(saved, map_location="cpu", weights_only=False)
                diff = max_abs_diff(final["model"], expected, running_stats=False)
                stats_diff = max_abs_diff(final["model"], expected, running_stats=True)
                finished = final["step"] == steps
            recover = result["recover"]
            rows.append({"model": model, "heal": heal, "gpus": workers_n if gpus else 0,
                         "workers": workers_n, "backend": "nccl" if gpus else "gloo",
                         "kills": len(result["signals"]), "signals": result["signals"],
                         "recover_s_median": statistics.median(recover) if recover else None,
                         "recover_s_max": max(recover) if recover else None,
                         "steps_lost_max": max(result["steps_lost"], default=None),
                         "heal_phases_s": result["phases"], "queued": result["queued"],
                         "max_abs_diff_vs_uninterrupted": diff, "max_abs_diff_running_stats": stats_diff,
                         "restarts": result["restarts"],
                         "finished": finished, "exit_status": result["process_status"],
                         "orphans": result["orphans"], "orphans_left": result["left"], "hung": result["hung"], "causes": result["causes"],
                         "stderr_tail": result["stderr_tail"]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--kills", type=int, default=10, help="signals per run")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--workers", type=int, default=3, help="CPU workers of the default job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpus", default=None, help="GPU workers on these GPUs, e.g. 0,1 (default: the CPU job)")
    p.add_argument("--train-flags", default="", help="with --gpus: Train.py's flags for the job (model, data, batch)")
    p.add_argument("--save-every-steps", type=int, default=50)
    p.add_argument("--signals", default="SIGKILL,SIGSTOP", help="the signals to send, chosen at random")
    p.add_argument("--heal", choices=("on", "off"), default="on",
                   help="on: heal in place; off: restart every worker from the last checkpoint")
    p.add_argument("--out", default=None, help="append the JSON rows to this file (and each run's stderr to "
                                               "OUT.soak-N.stderr)")
    args = p.parse_args()
    rows = soak(args.runs, args.kills, args.steps, args.workers, args.seed, args.gpus, shlex.split(args.train_flags),
                args.save_every_steps, tuple(args.signals.split(",")), Path(args.out) if args.out else None, args.heal)
    for row in rows:
        line = json.dumps(row)
        print(line)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
