"""Train.py as a live process the tests signal and kill: started in a session of its own with a
private TMPDIR, waited on through its metrics.jsonl records (never for a set time), and finished with
what it left behind."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import TRAIN_PY
from tests.helpers.processes import descendants, harness_children_below, kill_session, wait_gone

WAIT = 120.0        # seconds a test waits for a record or a line before it fails
STARTED: list[subprocess.Popen] = []     # every Train.py started, for ``end_every_run``


def start_train(tmp_path: Path, *flags: str, until: str = "step") -> subprocess.Popen:
    """Train.py in its own session (so a signal to its group reaches only it and its workers), with
    a private TMPDIR and tmp_path on its ``sys.path`` (a test's own model module); returns the process
    once rank 0 has reported an update past start-up (``until`` "first_step": its first update)."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, *TRAIN_PY, "--save", str(tmp_path / "model.pt"),
                                "--log-dir", str(tmp_path / "logs"), *flags], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    STARTED.append(process)
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == until for r in records))
    return process


def wait_for_record(process: subprocess.Popen, tmp_path: Path, found: Callable[[list[dict]], bool]) -> list[dict]:
    """The run's records (metrics.jsonl) once ``found(records)`` is true; fails after WAIT s or when
    Train.py ends first, showing its records and output."""
    log, deadline, records = tmp_path / "logs" / "metrics.jsonl", time.monotonic() + WAIT, []
    while time.monotonic() < deadline:
        ended = process.poll() is not None      # then the log is read once more: its last records came before
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if found(records):
            return records
        if ended:
            break
        time.sleep(0.05)
    _fail(process, f"Train.py did not report what the test waits for; its records: {[r['event'] for r in records]}")


def wait_for_stderr(process: subprocess.Popen, text: str) -> str:
    """What Train.py wrote to stderr up to and including ``text`` (the rest stays for ``finish``);
    fails after WAIT s or when its stderr closes first."""
    seen, deadline, fd = b"", time.monotonic() + WAIT, process.stderr.fileno()
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0] or not (chunk := os.read(fd, 65536)):
            _fail(process, f"Train.py did not write {text!r} to stderr; it wrote:\n{seen.decode(errors='replace')}")
        seen += chunk
    return seen.decode(errors="replace")


def _fail(process: subprocess.Popen, why: str) -> None:
    kill_session(process.pid)
    out, err = process.communicate()
    pytest.fail(f"{why}\nits stdout:\n{out[-3000:]}\nits stderr:\n{err[-3000:]}")


def end_every_run() -> None:
    """Kill what is left of every Train.py started so far (a test that failed before ``finish``)."""
    while STARTED:
        process = STARTED.pop()
        kill_session(process.pid)
        process.communicate()


def records_of(tmp_path: Path, event: str) -> list[dict]:
    """The run's records of one kind ("recovered", "restart", "saved", ...)."""
    from harness.training.metrics import read_metrics
    return [r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == event]


def recovered(count: int) -> Callable[[list[dict]], bool]:
    """A wait condition: ``count`` heals done, and training has reported an update since."""
    def found(records: list[dict]) -> bool:
        events = [r["event"] for r in records]
        return events.count("recovered") == count and "step" in events[len(events) - events[::-1].index("recovered"):]
    return found


def workers_of(process: subprocess.Popen) -> list[int]:
    """The training workers (python -m harness.child), not their loader processes."""
    return harness_children_below(process.pid)


def killed_at(tmp_path: Path, flags: list[str], step: int, rank: int = 1) -> tuple[int, str, list[int], str]:
    """Train.py with ``flags``, its worker ``rank`` SIGKILLed once rank 0 has logged update ``step`` or later;
    returns ``finish``'s (exit status, stderr, processes left below it, stdout)."""
    process = start_train(tmp_path, *flags)
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "step" and r["step"] >= step
                                                           for r in records))
    os.kill(workers_of(process)[rank], signal.SIGKILL)
    return finish(process, tmp_path)


def left_in_tmp(tmp_path: Path) -> list[str]:
    """What the run left in its TMPDIR, but torch's own compile cache (torchinductor_<user>), which
    torch makes on purpose to outlive runs, as it would in ~/.cache."""
    return [name for name in os.listdir(tmp_path / "tmp") if not name.startswith("torchinductor_")]


def finish(process: subprocess.Popen, tmp_path: Path) -> tuple[int, str, list[int], str]:
    """Wait for Train.py; returns (exit status, stderr, processes left below it, stdout). What is
    left is looked for before anything is killed; whatever happens, nothing of the run outlives this call."""
    workers = descendants(process.pid)
    try:
        out, err = process.communicate(timeout=60)
        left = wait_gone(workers, 2.0)
    finally:
        kill_session(process.pid)
    return process.returncode, err, left, out


def interrupt(tmp_path: Path, sig: signal.Signals, to_group: bool, flags: list[str],
              gate: Path | None = None) -> tuple[int, str]:
    """Train, send ``sig`` mid-run to the group (as Ctrl-C does) or to the parent only (as ``kill``
    does); check the clean stop. Returns the update it stopped at and its checkpoint. ``gate``: the run's
    model is held until that file exists (tests/helpers/held_model.py); the signal is sent once it has trained
    its first update, and the gate opened once Train.py has said it is stopping."""
    step, checkpoint, _ = interrupted(tmp_path, sig, to_group, flags, gate)
    return step, checkpoint


def interrupted(tmp_path: Path, sig: signal.Signals, to_group: bool, flags: list[str],
                gate: Path | None = None) -> tuple[int, str, str]:
    """``interrupt``, which also returns the command the last line says to continue with."""
    process = start_train(tmp_path, *flags, until="first_step" if gate else "step")
    os.killpg(process.pid, sig) if to_group else os.kill(process.pid, sig)
    said = ""
    if gate:
        said = wait_for_stderr(process, f"{sig.name}: finishing the current update")
        gate.touch()
    status, err, left, _ = finish(process, tmp_path)
    err = said + err

    assert status == 128 + sig, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"Train\.py: {sig.name}: stopped at epoch (\d+), update (\d+)(?: \((\d+) of \d+ updates by "
                         r"\d+ workers together\))?; saved (\S+); continue with: python \S*Train\.py --resume \4", line)
    assert match, line
    assert left == [] and left_in_tmp(tmp_path) == []
    assert int(match[2]) % 4 == 0     # StopVote.EVERY: every rank stopped at the same vote
    flags_mode = flags[flags.index("--mode") + 1] if "--mode" in flags else "grad"
    assert (match[3] is not None) == (flags_mode == "async"), line     # async: the budget spent, every worker's
    return int(match[2]), match[4], line.split("continue with: ", 1)[1]
