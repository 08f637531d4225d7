"""Soak test of healing in place: kill workers of a running Train.py again and again, then check that
the run finished exactly where an uninterrupted one does. tests/test_heal.py runs it in CI;
``python -m scripts.soak_heal`` is its command line (its --help says what each row holds).

Each run trains the same job with --max-restarts equal to the kills and SLACK more (a worker that an
overloaded machine keeps from its heartbeats past the timeout is a failure too, healed like the
others; ``causes`` lists every failure): by default a CPU (gloo) job on a linear model slowed down to
20 ms a step; with ``gpus``, GPU workers (NCCL) on what ``train_flags`` says (model, data, batch).
Failures are healed in place, or with heal "off" every worker restarts from the last checkpoint.
Whenever training has gone on after the last heal, a random worker gets SIGKILL or SIGSTOP (a hang:
the parent kills it after --heartbeat-timeout) at a random moment. One uninterrupted run with the
same flags gives the parameters every soaked run must end with.

Every Train.py runs in a session of its own; whatever ends it (its end, its time limit, an error
here) the whole session is killed before the next run starts, so nothing of a soak outlives it.
"""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tests.helpers import TRAIN_PY
from tests.helpers.processes import in_session, kill_quietly, kill_session
from tests.helpers.slow_model import SPEC as SLOW_MODEL

RUN_TIMEOUT = 600.0         # seconds one Train.py run may take, unless the soak's own time limit ends sooner
SLACK = 2                   # failures allowed beyond the signals sent (see the docstring)
RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")   # BatchNorm's, per rank


class SoakTimeout(RuntimeError):
    """The soak's time limit ended before its runs did (what ran was killed)."""


def cpu_job(workers: int) -> list[str]:
    """The default job: CPU workers on a linear model whose steps take 20 ms."""
    return ["--model", SLOW_MODEL, "--model-options", '{"delay": 0.02}', "--batch-size", "8",
            "--cpu-workers", str(workers), "--heartbeat-timeout", "2"]


def flags(work: Path, name: str, job: list[str], steps: int, kills: int, save_every: int, heal: str) -> list[str]:
    return [*job, "--max-steps", str(steps), "--save", str(work / f"{name}.pt"), "--log-dir", str(work / name),
            "--save-every-steps", str(save_every), *(["--max-restarts", str(kills + SLACK), "--heal", heal] if kills else [])]


def start(work: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *TRAIN_PY, *args], cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def records(log_dir: Path) -> list[dict]:
    path = log_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def workers(found: list[dict]) -> list[int]:
    """The run's training workers now, from its log: the "workers" record, and each heal's (not the
    warm spare, which trains nothing until it takes a dead rank's place)."""
    latest = [r["pids"] for r in found if r["event"] in ("workers", "recovered")]
    return [pid for pid in (latest[-1] if latest else []) if os.path.exists(f"/proc/{pid}")]


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


def signal_workers(process: subprocess.Popen, log_dir: Path, kills: int, deadline: float, rng: random.Random,
                   signals: list[signal.Signals]) -> tuple[list[tuple[float, str]], list[int]]:
    """Whenever training has gone on after the last heal, signal a random worker at a random moment,
    ``kills`` times (or until the run ends or the deadline passes); returns (when and which signal,
    the workers stopped with SIGSTOP)."""
    signalled, stopped = [], []
    while len(signalled) < kills and process.poll() is None and time.monotonic() < deadline:
        found = records(log_dir)
        events = [r["event"] for r in found]
        healed = events.count("recovered") + events.count("restart")
        last = max((i for i, e in enumerate(events) if e in ("recovered", "restart")), default=-1)
        if healed < len(signalled) or "step" not in events[last + 1:]:
            time.sleep(0.05)
            continue
        time.sleep(rng.uniform(0.0, 0.3))       # a random moment of the step
        pids = workers(found)
        if not pids:
            continue
        victim, sig = rng.choice(pids), rng.choice(signals)
        os.kill(victim, sig)
        signalled.append((time.time(), sig.name))
        if sig == signal.SIGSTOP:
            stopped.append(victim)
    return signalled, stopped


def soak_run(work: Path, name: str, job: list[str], steps: int, kills: int, save_every: int,
             rng: random.Random, signals: list[signal.Signals], heal: str, deadline: float) -> dict:
    """One soaked run, ended by ``deadline`` at the latest: what happened to it (see ``measure``)."""
    process = start(work, flags(work, name, job, steps, kills, save_every, heal))
    try:
        signalled, stopped = signal_workers(process, work / name, kills, deadline, rng, signals)
        hung = False
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            kill_quietly(-process.pid)
            _, err = process.communicate()
        for pid in stopped:
            kill_quietly(pid, signal.SIGCONT)
        time.sleep(0.5)                         # the run's last processes end after Train.py: then count them
        orphans = in_session(process.pid)
        left = described(orphans)
    finally:
        kill_session(process.pid)
    found = records(work / name)
    return {**measure(found, signalled), "process_status": process.returncode, "hung": hung,
            "last_step": max((r["step"] for r in found if r["event"] in ("step", "first_step")), default=0),
            "stderr_tail": [line for line in err.splitlines() if line.strip() and not line.startswith("update ")][-8:],
            "orphans": len(orphans), "left": left, "signals": [s for _, s in signalled], "stderr": err}


def measure(found: list[dict], signalled: list[tuple[float, str]]) -> dict:
    """From a run's records: the time from each signal to training resumed (the first heal reported
    after it, or after a restart the restarted group's first update), the updates each heal or restart
    lost (a restart: at least those between its checkpoint and the last progress record before the
    signal), each heal's phases and queued updates, and every failure's cause."""
    heals = [r for r in found if r["event"] == "recovered"]
    recover, lost, phases = [], [r["steps_lost"] for r in heals if "steps_lost" in r], []   # async: not known
    for when, _ in signalled:
        after = [r for r in found if r["event"] in ("recovered", "first_step") and r["time"] >= when]
        if not after:
            continue
        recover.append(after[0]["time"] - when)
        if after[0]["event"] == "recovered":
            phases.append(heal_phases(after[0], when))
        else:
            before = [r["step"] for r in found if r["event"] == "step" and r["time"] < when]
            lost.append(max(before, default=0) - (after[0]["step"] - 1))
    causes = [f'{r["event"]}: rank {r["rank"]} {r["cause"]}' + (f' (not healed: {r["not_healed"]})' if "not_healed" in r else "")
              for r in found if r["event"] in ("recovered", "restart")]
    return {"recover": recover, "steps_lost": lost, "phases": phases, "causes": causes,
            "queued": [max(filter(None, r.get("queued", [])), default=0) for r in heals],
            "restarts": sum(r["event"] == "restart" for r in found)}


def heal_phases(record: dict, signalled: float) -> dict[str, float]:
    """Seconds from the signal to each phase of a heal, as the slowest rank reached it (the phases
    of harness/training/loop_heal.py's heal, and the replacement's start-up marks since the signal)."""
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


def uninterrupted(work: Path, job: list[str], steps: int, save_every: int, heal: str, deadline: float) -> dict:
    """The model state of the job's uninterrupted run, which every soaked run must end with."""
    straight = start(work, flags(work, "straight", job, steps, 0, save_every, heal))
    try:
        _, err = straight.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise SoakTimeout("the uninterrupted run did not end within the soak's time limit") from None
    finally:
        kill_session(straight.pid)
    if straight.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{err}")
    return torch.load(work / "straight.pt", map_location="cpu", weights_only=False)["model"]


def row(result: dict, saved: Path, expected: dict, steps: int, about: dict) -> dict:
    """The JSON row of one soaked run (the fields scripts/soak_heal.py's --help lists)."""
    diff, stats_diff, finished = None, None, False
    if result["process_status"] == 0 and saved.exists():
        final = torch.load(saved, map_location="cpu", weights_only=False)
        diff = max_abs_diff(final["model"], expected, running_stats=False)
        stats_diff = max_abs_diff(final["model"], expected, running_stats=True)
        finished = final["step"] == steps
    recover = result["recover"]
    return {**about, "kills": len(result["signals"]), "signals": result["signals"],
            "recover_s_median": statistics.median(recover) if recover else None,
            "recover_s_max": max(recover) if recover else None,
            "steps_lost_max": max(result["steps_lost"], default=None),
            "heal_phases_s": result["phases"], "queued": result["queued"],
            "max_abs_diff_vs_uninterrupted": diff, "max_abs_diff_running_stats": stats_diff,
            "restarts": result["restarts"], "finished": finished, "last_step": result["last_step"],
            "exit_status": result["process_status"],
            "orphans": result["orphans"], "orphans_left": result["left"], "hung": result["hung"],
            "causes": result["causes"], "stderr_tail": result["stderr_tail"]}


def faults(row: dict) -> list[str]:
    """What makes a soaked run's ``row`` a failure of healing: it did not end where the uninterrupted run does,
    or it hung, or it left processes behind."""
    found = [] if row["exit_status"] == 0 else [f"Train.py exited {row['exit_status']}"]
    found += [] if row["finished"] else [f"it ended at update {row['last_step']}, not at the last"]
    found += ["it hung"] if row["hung"] else []
    found += [f"{row['orphans']} processes left"] if row["orphans"] else []
    diff = row["max_abs_diff_vs_uninterrupted"]
    found += [f"its parameters differ from the uninterrupted run's by {diff}"] if diff not in (0.0, None) else []
    return found


def soak(runs: int, kills: int, steps: int = 400, workers_n: int = 3, seed: int = 0, gpus: str | None = None,
         train_flags: list[str] | None = None, save_every: int = 50,
         signals: tuple[str, ...] = ("SIGKILL", "SIGSTOP"), stderr_to: Path | None = None,
         heal: str = "on", time_limit: float | None = None) -> list[dict]:
    """The soak's rows, one per run. ``gpus`` ("0,1"): GPU workers on the job ``train_flags``
    describes, instead of the default CPU job (to which ``train_flags`` are added: --zero 2, say). ``time_limit``: seconds for the whole soak, after
    which what runs is killed and ``SoakTimeout`` raised (each run has RUN_TIMEOUT s at most)."""
    rng, rows, began = random.Random(seed), [], time.monotonic()
    end = began + time_limit if time_limit is not None else float("inf")
    job = ["--gpus", gpus, *(train_flags or [])] if gpus else [*cpu_job(workers_n), *(train_flags or [])]
    workers_n = len(gpus.split(",")) if gpus else workers_n
    about = {"model": job[job.index("--model") + 1] if gpus and "--model" in job else "slow_model (Linear 64x10 on digits)",
             "heal": heal, "gpus": workers_n if gpus else 0, "workers": workers_n,
             "backend": "nccl" if gpus else "gloo", "seed": seed}
    sent = [signal.Signals[name] for name in signals]
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        expected = uninterrupted(work, job, steps, save_every, heal, min(end, time.monotonic() + RUN_TIMEOUT))
        for run in range(runs):
            name = f"soak-{run}"
            result = soak_run(work, name, job, steps, kills, save_every, rng, sent, heal,
                              min(end, time.monotonic() + RUN_TIMEOUT))
            if stderr_to is not None:
                stderr_to.with_name(f"{stderr_to.name}.{name}.stderr").write_text(result["stderr"])
            rows.append(row(result, work / f"{name}.pt", expected, steps, about))
            if result["hung"] and time.monotonic() >= end:
                stuck = " (it logged no update: a hang before its first step?)" if not result["last_step"] else ""
                raise SoakTimeout(f"the soak's {time_limit:.0f} s ended during run {run + 1} of {runs}{stuck}; "
                                  f"the rows so far:\n" + "\n".join(json.dumps(r) for r in rows))
    return rows
