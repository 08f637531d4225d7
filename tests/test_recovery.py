"""A worker that dies or hangs restarts the group from the last checkpoint (--max-restarts with
--heal off; tests/test_heal.py heals in place), and the run ends where an uninterrupted one does;
checkpoints are written in the background."""
from __future__ import annotations

import json
import os
import signal
import threading
from types import SimpleNamespace

import pytest
import torch

import Train
from harness import ChildFailed
from harness.resilience import saver as saver_module
from harness.resilience.checkpoint import load_checkpoint
from harness.resilience.recovery import Recovery
from harness.resilience.saver import BackgroundSaver
from harness.training.metrics import read_metrics
from tests.helpers.processes import kill_quietly
from tests.helpers.runs import finish, left_in_tmp, start_train, wait_for_record, workers_of
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS, HANG_FLAGS
from tests.helpers.training import flat_params

FLAGS = [*SLOW_FLAGS, "--save-every-steps", "5"]


def after_restarts(restarts: int, event: str):
    """A wait condition: ``event`` reported after exactly ``restarts`` restarts."""
    def found(records):
        events = [r["event"] for r in records]
        last = max((i for i, e in enumerate(events) if e == "restart"), default=-1)
        return events.count("restart") == restarts and event in events[last + 1:]
    return found


@pytest.mark.parametrize("restarts, kill", [(0, None), (1, None), (1, [1, 3])])
def test_a_worker_killed_while_rank_0_checks_the_inputs_spends_a_restart_before_anything_trains(
        restarts, kill, tmp_path, capsys):
    """The first build of the model (rank 0's check of the inputs) kills its worker: that costs one of
    --max-restarts and a new group trains, or ends the run when none are left, then or later (``kill``: rank 1
    dies at its third forward, with the budget spent)."""
    marker = tmp_path / "died"
    options = {"delay": 0.0, "die_once": str(marker), **({"kill": kill} if kill else {})}
    status = Train.main([*SLOW_FLAGS, "--model-options", json.dumps(options), "--max-steps", "10",
                         "--max-restarts", str(restarts), "--save", str(tmp_path / "model.pt"),
                         "--log-dir", str(tmp_path / "logs")])
    out, err = capsys.readouterr()
    assert marker.exists()
    if not restarts or kill:
        assert status == 1 and not (tmp_path / "model.pt").exists(), err
        assert ("gave up after 1 restart" in err) == bool(restarts), err
        assert f"child {kill[0] if kill else 0} was killed by signal SIGKILL" in err, err
        return
    assert status == 0, err
    assert ("rank 0 (was killed by signal SIGKILL; not healed in place: it came while rank 0 checked the inputs): "
            "restarting every worker from the start (restart 1 of 1)") in out, out
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [(r["event"], r["rank"], r["during"], r["cause"]) for r in records if r["event"] == "restart"] == [
        ("restart", 0, "checks", "was killed by signal SIGKILL")]
    # logged once the run holds its log folder, as this run's (a plot draws a run's records from its "run" on)
    assert [r["event"] for r in records][:2] == ["run", "restart"], records
    assert load_checkpoint(tmp_path / "model.pt")["step"] == 10


def test_a_killed_and_a_hung_worker_restart_from_checkpoints_and_the_run_ends_as_if_uninterrupted(tmp_path,
                                                                                                  slow_straight):
    process = start_train(tmp_path, *FLAGS, *HANG_FLAGS, "--max-restarts", "2", "--heal", "off")
    wait_for_record(process, tmp_path, after_restarts(0, "saved"))
    os.kill(workers_of(process)[1], signal.SIGKILL)
    wait_for_record(process, tmp_path, after_restarts(1, "saved"))
    hung = workers_of(process)[0]
    os.kill(hung, signal.SIGSTOP)               # silent for --heartbeat-timeout 5 s: killed, then restarted
    status, err, left, out = finish(process, tmp_path)
    kill_quietly(hung, signal.SIGCONT)

    assert status == 0, err
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    restarts = [r for r in records if r["event"] == "restart"]
    assert [(r["restart"], r["rank"]) for r in restarts] == [(1, 1), (2, 0)]
    assert restarts[0]["cause"] == "was killed by signal SIGKILL"
    assert restarts[1]["cause"].startswith("stopped responding")
    assert all(r["resume"] == str(tmp_path / "model.pt") for r in restarts)
    restarted = [(r, records.index(r)) for r in records if r["event"] == "restarted"]
    assert [r["restart"] for r, _ in restarted] == [1, 2] and all(r["seconds"] > 0 for r, _ in restarted)
    for (r, at), restart in zip(restarted, restarts):         # each group's first update after its restart
        first = [f for f in records[records.index(restart):at] if f["event"] == "first_step"]
        assert [f["step"] for f in first] == [r["step"]]
    assert f"training again {restarted[0][0]['seconds']:.1f} s after restart 1, at update" in out + err
    assert left == [] and left_in_tmp(tmp_path) == []

    assert load_checkpoint(tmp_path / "model.pt")["step"] == 60
    assert torch.equal(flat_params(slow_straight), flat_params(tmp_path / "model.pt"))


def test_restarts_exhausted_end_the_run_with_one_clear_error(tmp_path):
    process = start_train(tmp_path, *FLAGS, "--max-restarts", "1", "--heal", "off")
    os.kill(workers_of(process)[0], signal.SIGKILL)
    wait_for_record(process, tmp_path, after_restarts(1, "step"))
    os.kill(workers_of(process)[1], signal.SIGKILL)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 1, err
    assert "Train.py: training failed: child 1 was killed by signal SIGKILL" in err
    assert "gave up after 1 restart: raise --max-restarts to allow more" in err
    assert left == []


def test_a_worker_that_dies_during_a_stop_ends_the_run_stopped_at_its_last_checkpoint_not_restarted(tmp_path):
    """SIGTERM, then a worker killed before the stop is saved: a new group would only be stopped again (or die of
    the signal forwarded to it before its handlers are in), so the run ends as stopped (143), with no restart."""
    process = start_train(tmp_path, *FLAGS, "--max-restarts", "2", "--heal", "off")
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "saved" for r in records))
    victim = workers_of(process)[1]
    os.kill(process.pid, signal.SIGTERM)
    os.kill(victim, signal.SIGKILL)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 128 + signal.SIGTERM, err
    assert f"during the stop; the last checkpoint: {tmp_path / 'model.pt'}" in err
    assert "restart" not in [r["event"] for r in read_metrics(tmp_path / "logs" / "metrics.jsonl")]
    assert left == [] and left_in_tmp(tmp_path) == []


def test_background_saves_snapshot_the_state_and_never_overlap(tmp_path):
    saver, done = BackgroundSaver(), []
    weights = torch.zeros(1000)
    for step in range(5):
        weights += 1                 # the training goes on at once: the snapshot must not see this change
        saver.save(tmp_path / "c.pt", {"model": {"w": weights}, "optimizer": {}, "epoch": 0, "step": step,
                                       "config": {}}, done=lambda step=step: done.append(step))
        weights += 100
    saver.wait()
    assert done == [0, 1, 2, 3, 4]
    saved = load_checkpoint(tmp_path / "c.pt")
    assert saved["step"] == 4 and torch.equal(saved["model"]["w"], torch.full((1000,), 405.0))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]      # no temporary file left


def test_a_background_save_writes_what_it_is_given_as_it_is_and_snapshots_the_rest(tmp_path, monkeypatch):
    """Every rank's own part is a host copy made for the save: the saver writes it without a second copy."""
    release, write = threading.Event(), saver_module.save_checkpoint
    monkeypatch.setattr(saver_module, "save_checkpoint", lambda path, state: release.wait(30) and write(path, state))
    weights, part = torch.zeros(4), torch.zeros(4)
    saver = BackgroundSaver()
    saver.save(tmp_path / "c.pt", {"model": {"w": weights}, "optimizer": {}, "epoch": 0, "step": 1, "config": {},
                                   "ranks": [{"params": part}]}, given=("ranks",))
    weights += 1                    # after the snapshot, before the write
    part += 1
    release.set()
    saver.wait()
    saved = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(saved["model"]["w"], torch.zeros(4)) and torch.equal(saved["ranks"][0]["params"], torch.ones(4))


def test_a_replacement_that_fails_is_reported_with_the_cause_of_the_failure_it_replaced():
    """A host cut off: its worker stops responding, and its replacement cannot reach the host. The error names
    both, not only the replacement's ssh failure."""
    def replace(rank):
        raise ChildFailed(rank, "exited with status 255", ["ssh: connect to host 10.0.0.2: Connection timed out"],
                          host="10.0.0.2")
    kids = SimpleNamespace(replace=replace, stop=lambda grace: None)
    recovery = Recovery(1, heals_in_place=True, resume=None, last_saved=lambda: None, report=lambda record: None)
    with pytest.raises(ChildFailed) as failed:
        recovery.heal(kids, ChildFailed(1, "stopped responding (no heartbeat for 5.0 s; killed)", host="10.0.0.2"))
    assert failed.value.rank == 1 and failed.value.host == "10.0.0.2"
    assert "exited with status 255 as it replaced the worker that stopped responding (no heartbeat" in str(failed.value)
    assert "Connection timed out" in str(failed.value)
