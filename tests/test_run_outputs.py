"""What a run writes and how it goes on: one run per output (a second run on the same checkpoint or
log folder is refused, naming the first's pid), a checkpoint write that removes only dead writers'
leftovers, a resume that continues the checkpointed run (tests/test_interrupt.py pastes the command
printed on Ctrl-C), and a diverged run that stops with the last good checkpoint kept."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import Train
from harness.resilience.checkpoint import load_checkpoint, write_atomically
from harness.training.metrics import read_metrics
from tests.helpers.diverging_model import SPEC as DIVERGING_MODEL
from tests.helpers.processes import kill_session
from tests.helpers.runs import finish, start_train, wait_for_record, workers_of
from tests.helpers.slow_model import SPEC as SLOW_MODEL
from tests.helpers import TRAIN_PY
from tests.helpers.training import run_train, train_error


def test_two_runs_started_together_on_one_output_one_trains_the_other_is_refused(tmp_path):
    gate = tmp_path / "go"      # the winner waits at its first training forward, holding the lock, until the loser is done
    common = ["--model", SLOW_MODEL, "--model-options", json.dumps({"delay": 0, "gate": str(gate)}),
              "--max-steps", "6", "--save", str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "logs")]
    runs = [subprocess.Popen([sys.executable, *TRAIN_PY, *common], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    first = wait_for_exit(runs)
    gate.touch()
    outcomes = [(run.pid, *run.communicate(timeout=240)) for run in runs]
    assert first.returncode == 2 and sorted(run.returncode for run in runs) == [0, 2], outcomes
    winner = next(pid for (pid, _, _), run in zip(outcomes, runs) if run.returncode == 0)
    refused = next(err for (_, _, err), run in zip(outcomes, runs) if run.returncode == 2).strip().splitlines()
    assert len(refused) == 1 and "in use" in refused[0] and f"(pid {winner})" in refused[0], refused
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("workers") == 1      # one run's log, not two interleaved
    assert load_checkpoint(tmp_path / "model.pt")["step"] == 6


def wait_for_exit(runs: list[subprocess.Popen], timeout: float = 240) -> subprocess.Popen:
    """The first of ``runs`` to exit (each of them would wait at the gate if both took the lock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [run for run in runs if run.poll() is not None]
        if done:
            return done[0]
        time.sleep(0.05)
    raise AssertionError(f"neither run exited in {timeout} s: both passed the lock")


def test_a_run_killed_outright_leaves_no_lock_behind(tmp_path, monkeypatch, capsys):
    first = start_train(tmp_path, "--model", SLOW_MODEL, "--epochs", "1000")
    # the second run is Train.main in this process, which takes the lock as the command does
    busy = train_error("--save", str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "other"),
                       monkeypatch=monkeypatch, capsys=capsys)
    assert f"--save {tmp_path / 'model.pt'} is in use by another run (pid {first.pid})" in busy, busy
    both = train_error("--save", str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "logs"),
                       monkeypatch=monkeypatch, capsys=capsys)     # the same command again: one line for both
    assert both.endswith(f"--save {tmp_path / 'model.pt'} and --log-dir {tmp_path / 'logs'} are in use by another "
                         f"run (pid {first.pid}); wait for it to end or pass another --save and another --log-dir")
    kill_session(first.pid)         # SIGKILL: no handler runs, the kernel drops the lock
    first.wait(timeout=60)
    after = Train.main(["--epochs", "1", "--save", str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "logs")])
    assert after == 0, capsys.readouterr().err


def test_a_checkpoint_write_removes_dead_writers_leftovers_only(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine, dead, older = (tmp_path / f".model.pt.{pid}.x1.tmp" for pid in (alive.pid, 2**22 + 1, "ab"))
        for leftover in (mine, dead, older):
            leftover.write_bytes(b"partial")
        write_atomically(tmp_path / "model.pt", {"step": 1})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.pt", mine.name])
    finally:
        alive.kill()
        alive.wait()


def test_a_resume_takes_the_run_from_its_checkpoint_and_refuses_what_cannot_change(tmp_path, monkeypatch, capsys):
    _, save = run_train(tmp_path, "--epochs", "2", "--lr", "0.02", name="model")
    capsys.readouterr()                 # the run's own output
    # the refusals (Train.main: exit 2, one line), then the resume that trains, all in this process
    done = train_error("--resume", str(save), monkeypatch=monkeypatch, capsys=capsys)
    assert "nothing is left to train; pass a larger --epochs or --max-steps" in done
    changed = train_error("--resume", str(save), "--epochs", "3", "--optimizer", "adam", monkeypatch=monkeypatch,
                          capsys=capsys)
    assert "continues a run of --optimizer 'sgd'; drop --optimizer" in changed
    for flag, value, saved in (("--val-fraction", "0.2", "0.1"), ("--seed", "3", "0")):     # digits' split moves
        moved = train_error("--resume", str(save), "--epochs", "3", flag, value, monkeypatch=monkeypatch,
                            capsys=capsys)
        assert f"was trained with {flag} {saved}; drop" in moved and "validate on samples it trained on" in moved
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Train.main(["--resume", str(save), "--epochs", "3"]) == 0, capsys.readouterr().err
    resumed = load_checkpoint(save)
    assert resumed["step"] == 3 * (1293 // 2 // 32) and resumed["config"]["lr"] == 0.02
    _, short = run_train(tmp_path, "--max-steps", "3", name="short")
    capsys.readouterr()
    assert "(--max-steps 3): nothing is left" in train_error("--resume", str(short), monkeypatch=monkeypatch,
                                                             capsys=capsys)
    shorter = train_error("--resume", str(short), "--max-steps", "2", monkeypatch=monkeypatch, capsys=capsys)
    assert "(--max-steps 2): nothing is left to train; pass a larger --epochs or --max-steps" in shorter
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")      # --epochs lengthens a --max-steps run, which it used to refuse
    assert Train.main(["--resume", str(short), "--epochs", "1"]) == 0, capsys.readouterr().err
    lengthened = load_checkpoint(short)
    assert lengthened["step"] == 1293 // 2 // 32 and lengthened["config"]["max_steps"] is None


@pytest.mark.parametrize("change, epochs, updates", [(["--cpu-workers", "1"], 4, 2 * 20 + 2 * (1293 // 32)),
                                                    (["--grad-accum", "2"], 5, 2 * 20 + 3 * (1293 // 2 // 64))])
def test_a_resume_that_changes_an_epoch_s_updates_at_its_end_trains_the_epochs_left(change, epochs, updates, tmp_path,
                                                                                    capsys):
    """Two epochs of 20 updates, resumed with 40 (one worker) or 10 (micro-batches of two) an epoch: --epochs counts
    the epochs left in the new updates, not the checkpoint's update count against the new epochs' worth."""
    _, save = run_train(tmp_path, "--epochs", "2", name="model")
    assert Train.main(["--resume", str(save), "--epochs", str(epochs), *change]) == 0, capsys.readouterr().err
    resumed = load_checkpoint(save)
    assert (resumed["epoch"], resumed["step"], resumed["position"]) == (epochs, updates, 0)
    trained = [r["epoch"] for r in read_metrics(tmp_path / "model" / "metrics.jsonl") if r["event"] == "epoch"]
    assert trained == list(range(1, epochs + 1)), trained


def test_a_resume_from_another_folder_continues_the_checkpoint_and_log_of_the_run_it_resumes(tmp_path, monkeypatch,
                                                                                            capsys):
    """The run saved ``ck/model.pt`` and logged to ``logs`` relative to the folder it ran in: a resume started
    elsewhere writes there too, not beside itself (Test.py would then score the older checkpoint)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "first").mkdir()
    (tmp_path / "later").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    assert Train.main(["--epochs", "1", "--save", "ck/model.pt", "--log-dir", "logs"]) == 0, capsys.readouterr().err
    monkeypatch.chdir(tmp_path / "later")
    assert Train.main(["--resume", "../first/ck/model.pt", "--epochs", "2"]) == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path / "first" / "ck" / "model.pt")["epoch"] == 2
    epochs = [r["epoch"] for r in read_metrics(tmp_path / "first" / "logs" / "metrics.jsonl") if r["event"] == "epoch"]
    assert epochs == [1, 2] and list((tmp_path / "later").iterdir()) == []


def test_a_resume_of_a_copy_is_refused_rather_than_replacing_the_checkpoint_it_was_copied_from(tmp_path, monkeypatch,
                                                                                             capsys):
    """The copy's run saved another file, which a resume would write (its --save): it must be given a --save."""
    _, original = run_train(tmp_path, "--max-steps", "3", name="base")
    capsys.readouterr()
    copy = tmp_path / "try.pt"
    copy.write_bytes(original.read_bytes())
    refused = train_error("--resume", str(copy), "--max-steps", "5", monkeypatch=monkeypatch, capsys=capsys)
    assert refused == (f"Train.py: error: --resume {copy} is a copy of {original}, the checkpoint its run saved, which "
                       f"this run would replace (and add to its log in {tmp_path / 'base'}); pass --save for this run, "
                       f"e.g. --save {copy} --log-dir {tmp_path / 'runs'}, or resume {original}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Train.main(["--resume", str(copy), "--max-steps", "5", "--save", str(copy), "--log-dir",
                       str(tmp_path / "runs")]) == 0, capsys.readouterr().err
    assert load_checkpoint(copy)["step"] == 5 and load_checkpoint(original)["step"] == 3


def test_a_diverged_run_stops_with_exit_1_and_keeps_its_last_good_checkpoint(tmp_path, capsys):
    save = tmp_path / "model.pt"
    status = Train.main(["--model", DIVERGING_MODEL, "--epochs", "3", "--save-every-steps", "5", "--save", str(save),
                         "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert status == 1, err
    assert "training diverged" in err and f"the last good checkpoint is {save}" in err
    kept = load_checkpoint(save)
    assert kept["step"] == 10 and all(torch.isfinite(v).all() for v in kept["model"].values())
    done = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()][-2]
    assert done["event"] == "done" and done["diverged"] and done["step"] < 12 + 8


def test_an_epoch_whose_loss_is_not_finite_stops_the_run_at_its_end_without_validating_it(tmp_path, capsys):
    """The stop vote reads a diverged loss up to 8 updates late: an epoch's loss, which every rank sums alike, is
    known at once (a run without --save validated the epoch with NaN weights and began the next)."""
    status = Train.main(["--model", DIVERGING_MODEL, "--model-options", '{"after": 8}', "--batch-size", "64",
                         "--epochs", "3", "--save", "", "--log-dir", str(tmp_path / "logs")])   # 10 updates an epoch
    assert status == 1 and "the loss is not finite by update 10" in capsys.readouterr().err
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [(r["event"], r["step"]) for r in records if r["event"] in ("epoch", "validation", "done")] == \
        [("epoch", 10), ("done", 10)]


def test_a_stopped_worker_is_named_long_before_it_counts_as_hung(tmp_path):
    process = start_train(tmp_path, "--model", SLOW_MODEL, "--epochs", "1000", "--heartbeat-timeout", "9")
    victim = workers_of(process)[1]
    os.kill(victim, signal.SIGSTOP)
    records = wait_for_record(process, tmp_path, lambda found: any(r["event"] == "silent" for r in found))
    os.kill(victim, signal.SIGCONT)
    silent = next(r for r in records if r["event"] == "silent")
    assert silent["rank"] == 1 and 3 <= silent["seconds"] < 9 and silent["timeout"] == 9
    wait_for_record(process, tmp_path, lambda found: any(r["event"] == "heard" and r["rank"] == 1 for r in found))
    os.killpg(process.pid, signal.SIGINT)
    status, err, _, out = finish(process, tmp_path)
    assert status == 130, err
    assert "rank 1 has been silent for" in out and "rank 1 is heard again" in out
