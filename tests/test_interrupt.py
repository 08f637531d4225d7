"""Ctrl-C and SIGTERM: Train.py stops at an update every worker agrees on, saves a checkpoint that
--resume continues exactly, says so in one line and exits 128 + the signal; a second signal stops
at once. Either way no process and nothing under TMPDIR is left. Real processes, real signals."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, descendants, kill_quietly, wait_gone
from harness import Parent
from scripts.soak_heal import SLOW_MODEL
from test_train import flat_params, run_train


def start_train(tmp_path, *flags):
    """Train.py in its own session (so a signal to its group reaches only it and its workers), with
    a private TMPDIR; returns the process once rank 0 has reported an update past start-up."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, str(ROOT / "Train.py"), "--save", str(tmp_path / "model.pt"),
                                "--log-dir", str(tmp_path / "logs"), *flags], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "step" for r in records))
    return process


def wait_for_record(process, tmp_path, found) -> list[dict]:
    """The run's records (metrics.jsonl) once ``found(records)`` is true; fails after 120 s."""
    log, deadline, records = tmp_path / "logs" / "metrics.jsonl", time.monotonic() + 120, []
    while time.monotonic() < deadline and process.poll() is None:
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if found(records):
            return records
        time.sleep(0.05)
    process.kill()
    out, err = process.communicate()
    pytest.fail(f"Train.py did not report what the test waits for; its records: {[r['event'] for r in records]}\n"
                f"its stdout:\n{out[-3000:]}\nits stderr:\n{err[-3000:]}")


def left_in_tmp(tmp_path) -> list[str]:
    """What the run left in its TMPDIR, but torch's own compile cache (torchinductor_<user>), which
    torch makes on purpose to outlive runs, as it would in ~/.cache."""
    return [name for name in os.listdir(tmp_path / "tmp") if not name.startswith("torchinductor_")]


def finish(process, tmp_path) -> tuple[int, str, list[int], str]:
    """Wait for Train.py; returns (exit status, stderr, processes left below it, stdout)."""
    workers = descendants(process.pid)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        kill_quietly(-process.pid)
    return process.returncode, err, wait_gone(workers, 2.0), out


def interrupt(tmp_path, sig: signal.Signals, to_group: bool, flags: list[str]) -> tuple[int, str]:
    """Train, send ``sig`` mid-run to the group (as Ctrl-C does) or to the parent only (as ``kill``
    does); check the clean stop. Returns the update it stopped at and its checkpoint."""
    process = start_train(tmp_path, *flags)
    os.killpg(process.pid, sig) if to_group else os.kill(process.pid, sig)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 128 + sig, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"Train\.py: {sig.name}: stopped at epoch (\d+), update (\d+); saved (\S+); "
                         r"continue with --resume \3", line)
    assert match, line
    assert left == [] and left_in_tmp(tmp_path) == []
    assert int(match[2]) % 4 == 0     # StopVote.EVERY: every rank stopped at the same vote
    return int(match[2]), match[3]


def test_ctrl_c_saves_and_exits_130(tmp_path):
    interrupt(tmp_path, signal.SIGINT, True, ["--epochs", "1000"])


def test_sigterm_to_the_parent_saves_a_checkpoint_that_resumes_exactly(tmp_path):
    flags = ["--batch-size", "8", "--epochs", "1000"]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags)
    total = ["--max-steps", str(step + 6)]
    _, straight = run_train(tmp_path, *flags, *total, name="straight")
    _, resumed = run_train(tmp_path, *flags, *total, "--resume", checkpoint, name="resumed")
    assert (flat_params(straight) - flat_params(resumed)).norm() <= 1e-6 * flat_params(straight).norm()


def test_a_second_signal_stops_at_once_without_a_traceback(tmp_path):
    (tmp_path / "slow_model.py").write_text(SLOW_MODEL)       # 8 updates take 2 s: time for a second Ctrl-C
    process = start_train(tmp_path, "--model", "slow_model:model")
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("Train.py: stopped at once by SIGINT (the second signal); "
                                            "nothing saved since the last checkpoint")
    assert left == [] and left_in_tmp(tmp_path) == []


def _count_until_stopped(ctx):
    from harness.resilience.interrupt import StopVote
    import torch
    vote, step = StopVote(ctx, ctx.communicator(), torch.device("cpu")), 0
    ctx.send("ready")
    while True:
        step += 1
        signum = vote.poll(step)
        if signum:
            return step, signum
        time.sleep(0.01)


def test_a_signal_to_one_worker_stops_every_worker_at_the_same_update():
    with Parent() as parent:
        kids = parent.fork(3)
        kids.exec(_count_until_stopped)
        kids.receive()
        os.kill(kids.pids[1], signal.SIGTERM)       # a child never dies of it: it votes to stop
        results = kids.wait()
    assert len(set(results)) == 1 and results[0][1] == signal.SIGTERM
