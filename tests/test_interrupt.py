"""Ctrl-C and SIGTERM: Train.py stops at an update every worker agrees on, saves a checkpoint that
--resume continues exactly, says so in one line and exits 128 + the signal; a second signal stops
at once. Either way no process and nothing under TMPDIR is left; the command the stop prints, pasted
as it is, continues the run to where an uninterrupted one ends. Real processes, real signals."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import zmq

from harness import Parent
from harness.control import wire
from harness.control.link import Link
from harness.resilience.interrupt import Interrupted, Interrupts
from harness.resilience.checkpoint import load_checkpoint
from tests.helpers import ROOT, TRAIN_PY
from tests.helpers.runs import finish, interrupt, interrupted, left_in_tmp, start_train, wait_for_stderr
from tests.helpers.slow_model import SPEC as SLOW_MODEL
from tests.helpers.training import flat_params, run_train


def test_ctrl_c_saves_exits_130_and_the_command_it_prints_continues_to_where_an_uninterrupted_run_ends(tmp_path):
    flags = ["--model", SLOW_MODEL, "--model-options", '{"delay": 0.02}', "--batch-size", "8", "--epochs", "2"]
    stopped, checkpoint, command = interrupted(tmp_path, signal.SIGINT, True, flags)
    words = shlex.split(command)
    assert words[0] == "python" and words[2:4] == ["--resume", str(tmp_path / "model.pt")] == ["--resume", checkpoint]
    assert load_checkpoint(checkpoint)["step"] == stopped
    resumed = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    _, straight = run_train(tmp_path, *flags, name="straight")
    ended = load_checkpoint(tmp_path / "model.pt")
    assert stopped < ended["step"] == load_checkpoint(straight)["step"]
    assert torch.equal(flat_params(tmp_path / "model.pt"), flat_params(straight))


def test_sigterm_to_the_parent_saves_a_checkpoint_that_resumes_exactly(tmp_path):
    flags = ["--batch-size", "8", "--epochs", "1000"]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags)
    total = ["--max-steps", str(step + 6)]
    _, straight = run_train(tmp_path, *flags, *total, name="straight")
    _, resumed = run_train(tmp_path, *flags, *total, "--resume", checkpoint, name="resumed")
    assert (flat_params(straight) - flat_params(resumed)).norm() <= 1e-6 * flat_params(straight).norm()


def test_a_second_signal_stops_at_once_without_a_traceback(tmp_path):
    process = start_train(tmp_path, "--model", SLOW_MODEL)      # 8 updates take 2 s: time for a second Ctrl-C
    os.killpg(process.pid, signal.SIGINT)
    wait_for_stderr(process, "SIGINT: finishing the current update")    # the parent took the first one
    os.killpg(process.pid, signal.SIGINT)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("Train.py: stopped at once by SIGINT (the second signal); "
                                            "nothing saved since the last checkpoint")
    assert left == [] and left_in_tmp(tmp_path) == []


def test_the_second_signal_while_a_child_s_message_is_decoded_stops_the_run_rather_than_failing_the_child(
        monkeypatch):
    """Once in CI the second Ctrl-C came while the parent's main thread decoded a child's message: its Interrupted
    was taken for that message's fault ("could not decode"), and Train.py exited 1 instead of 130."""
    context = zmq.Context.instance()
    parents_end, childs_end = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    parents_end.bind("inproc://second-signal")
    childs_end.connect("inproc://second-signal")
    key, dispatched = os.urandom(32), []
    parent = Link(parents_end, key, lambda sender, message: dispatched.append(message), lambda: None)
    decode = wire.unpack

    def decode_as_the_second_signal_comes(*args):
        os.kill(os.getpid(), signal.SIGINT)         # its handler runs in this thread before the decoding ends
        return decode(*args)

    monkeypatch.setattr(wire, "unpack", decode_as_the_second_signal_comes)
    try:
        with Interrupts() as caught:
            caught.watch(SimpleNamespace(signal=lambda signum: None))
            os.kill(os.getpid(), signal.SIGINT)     # the first: forwarded to the (stand-in) children
            Link(childs_end, key, lambda *_: None, lambda: None).send(("record", None, "a child's record"))
            with pytest.raises(Interrupted, match="the second signal"):
                parent.pump(5.0)
    finally:
        parents_end.close(linger=0)
        childs_end.close(linger=0)
    assert dispatched == []


def _count_until_stopped(ctx):
    from harness.resilience.interrupt import StopVote
    import torch
    vote, step = StopVote(ctx, ctx.communicator(), torch.device("cpu")), 0
    ctx.send("ready")
    while True:
        step += 1
        signum, diverged = vote.poll(step, torch.zeros(()))
        assert not diverged
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


def test_a_signal_after_the_run_has_finished_exits_with_the_runs_status():
    """Once the run is over (saved, workers gone), a SIGTERM during the interpreter's shutdown does not kill
    Train.py (which would exit -15, as if the work were lost): it exits at once with the run's status."""
    for status in (0, 1):
        code = (f"import os, signal, time; from harness.resilience.interrupt import finished; finished({status}); print('finished', flush=True); "
                "os.kill(os.getpid(), signal.SIGTERM); time.sleep(60); os._exit(99)")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (status, "finished"), done.stderr


def test_a_signal_in_the_last_round_of_an_async_run_that_spends_its_budget_all_the_same_ends_it_finished(tmp_path):
    """--mode async: a SIGTERM (to the group, from rank 0's model at its update 6 of 8) reaches the server with the
    last round's pushes, which spend the run's budget anyway. The checkpoint holds the whole run, so Train.py exits 0
    and says so; it used to say "stopped, continue with --resume" (143), and that resume found nothing to train."""
    save = tmp_path / "model.pt"
    flags = ["--mode", "async", "--max-staleness", "0", "--avg-every", "4", "--max-steps", "8", "--cpu-workers", "2",
             "--model", SLOW_MODEL, "--model-options", '{"delay": 0.05, "term_at": 6}', "--batch-size", "8",
             "--save", str(save), "--log-dir", str(tmp_path / "logs")]
    done = subprocess.run([sys.executable, *TRAIN_PY, *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, start_new_session=True)
    assert done.returncode == 0, done.stderr
    assert "SIGTERM came as the run ended: it trained its 16 updates by 2 workers together" in done.stdout
    assert sum(load_checkpoint(save)["ranks"][0]["server"]["updates"]) == 16
