"""Healing in place (--max-restarts, with --heal on, the default): a worker that dies
or hangs is replaced, the survivors hand it their state, only the interrupted update is redone, and
the run ends exactly where an uninterrupted one does. Real processes, real signals; and the API
underneath (Children.replace, ctx.await_heal through harness.resilience.heal.rejoin) used directly."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch

import Train
from harness.training import ConfigError
from harness.training.checks import heals_in_place
from harness import ChildFailed, Parent
from harness.control import replace
from harness.control.spawn import Starter
from harness.resilience.heal import Ticket, Where, rewind
from harness.training.optim import FUSED, build_optimizer
from harness.resilience.checkpoint import load_checkpoint
from tests.helpers.processes import harness_children_below, kill_quietly
from tests.helpers.runs import finish, left_in_tmp, recovered, records_of, start_train, wait_for_record, workers_of
from tests.helpers import slow_model
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS, HANG_FLAGS
from tests.helpers.soak import faults, soak
from tests.helpers.training import flat_params, flat_state

SOAK_LIMIT = 240.0          # seconds: below pytest's timeout (300 s, pyproject.toml)
FLAGS = [*SLOW_FLAGS, "--save-every-steps", "20"]


def test_a_killed_and_a_hung_worker_are_healed_and_the_run_equals_the_uninterrupted_one(tmp_path, slow_straight):
    process = start_train(tmp_path, *FLAGS, *HANG_FLAGS, "--max-restarts", "2")
    os.kill(workers_of(process)[1], signal.SIGKILL)
    wait_for_record(process, tmp_path, recovered(1))
    hung = workers_of(process)[0]
    os.kill(hung, signal.SIGSTOP)               # silent for --heartbeat-timeout 5 s: killed, then healed
    status, err, left, out = finish(process, tmp_path)
    kill_quietly(hung, signal.SIGCONT)

    assert status == 0, err
    heals = records_of(tmp_path, "recovered")
    assert [(r["rank"], r["generation"]) for r in heals] == [(1, 1), (0, 2)]
    assert heals[0]["cause"] == "was killed by signal SIGKILL"
    assert heals[1]["cause"].startswith("stopped responding")
    assert all(r["steps_lost"] <= 1 and r["redo_step"] == r["step"] + 1 and r["mode"] == "grad" for r in heals)
    assert records_of(tmp_path, "restart") == []
    assert "rank 1 (was killed by signal SIGKILL) recovered in " in out
    assert left == [] and left_in_tmp(tmp_path) == []
    assert torch.equal(flat_params(slow_straight), flat_params(tmp_path / "model.pt"))      # bit for bit


def test_the_writer_killed_mid_checkpoint_is_healed_and_the_checkpoint_stays_whole(tmp_path, slow_straight):
    """Rank 0 writes the checkpoints: SIGKILL it while its temp file is being written (an 80 MB
    buffer makes that take a while). The previous checkpoint stays whole, the run heals and ends
    bit for bit as the uninterrupted one, and the next save clears the dead writer's temp file.
    The buffer trains nothing, so the uninterrupted run is FLAGS' own, with the buffer still zeros."""
    flags = [*FLAGS, "--model-options", '{"delay": 0.03, "ballast": 20000000}']
    process = start_train(tmp_path, *flags, "--max-restarts", "1")
    writer = records_of(tmp_path, "workers")[0]["pids"][0]
    first = wait_for_record(process, tmp_path, lambda records: any(r["event"] == "saved" for r in records))
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".model.pt.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(writer, signal.SIGKILL)
    assert list(tmp_path.glob(".model.pt.*.tmp")), "the kill missed the second checkpoint's write"
    before = load_checkpoint(tmp_path / "model.pt")        # the first checkpoint, whole
    assert before["step"] == next(r["step"] for r in first if r["event"] == "saved")
    status, err, left, _ = finish(process, tmp_path)

    assert status == 0, err
    assert [(r["rank"], r["cause"]) for r in records_of(tmp_path, "recovered")] == [(0, "was killed by signal SIGKILL")]
    assert not list(tmp_path.glob("*.tmp")) and left == []
    healed = load_checkpoint(tmp_path / "model.pt")["model"]
    assert not healed.pop("ballast").any()
    assert torch.equal(flat_params(slow_straight), flat_state(healed))


def test_param_mode_heals_from_the_survivors_average(tmp_path):
    process = start_train(tmp_path, *FLAGS, "--mode", "param", "--avg-every", "4", "--max-restarts", "1")
    os.kill(workers_of(process)[2], signal.SIGKILL)
    status, err, left, out = finish(process, tmp_path)

    assert status == 0, err
    [heal] = records_of(tmp_path, "recovered")
    assert heal["rank"] == 2 and heal["mode"] == "param"
    assert "(parameters: the survivors' average)" in out
    assert records_of(tmp_path, "done")[0]["step"] == 60 and left == []


def test_two_workers_dying_at_once_fall_back_to_a_restart_from_the_checkpoint(tmp_path, slow_straight):
    """The second death is found while the first is being healed: the group restarts instead."""
    # No hang in this test: a longer heartbeat timeout keeps a restarted worker that is slow to start
    # on a busy 2-core machine from counting as hung.
    process = start_train(tmp_path, *FLAGS, *slow_model.held(tmp_path / "gate", 30), "--max-restarts", "2",
                          "--heartbeat-timeout", "15")
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "saved" for r in records))
    for pid in workers_of(process)[:2]:
        os.kill(pid, signal.SIGKILL)
    (tmp_path / "gate").touch()
    status, err, left, out = finish(process, tmp_path)

    assert status == 0, err
    [restart] = records_of(tmp_path, "restart")
    assert restart["restart"] == 2 and restart["resume"] == str(tmp_path / "model.pt")
    assert re.match(r"it came [\d.]+ s into the heal of rank \d \(was killed by signal SIGKILL\)|the replacement "
                    r"failed: rank \d was killed by signal SIGKILL", restart["not_healed"]), restart
    assert "not healed in place" in out
    assert records_of(tmp_path, "recovered") == [] and left == []
    assert torch.equal(flat_params(slow_straight), flat_params(tmp_path / "model.pt"))


def test_heals_spend_the_restart_budget_and_then_the_run_ends_with_one_clear_error(tmp_path):
    process = start_train(tmp_path, *FLAGS, "--max-restarts", "1")
    os.kill(workers_of(process)[0], signal.SIGKILL)
    wait_for_record(process, tmp_path, recovered(1))
    os.kill(workers_of(process)[1], signal.SIGKILL)
    status, err, left, out = finish(process, tmp_path)

    assert status == 1, err
    assert re.search(r"Train.py: training failed: child \d was killed by signal SIGKILL", err)
    assert "gave up after 1 restart: raise --max-restarts to allow more" in err
    assert left == []


# What count_to imports (torch with it), imported before the first exec: three children importing torch at
# once on a busy machine can hold the GIL past the 5 s heartbeat timeout these groups run with.
HEAL = ["harness.resilience.heal"]


def count_to(ctx, n: int, pause: float) -> tuple[int, int, int]:
    """All-reduce ones n times; a rank that fails rejoins and the group agrees where to go on. Rank 0
    sends "counting" at step 10, and again at its first step after each heal."""
    from harness.resilience.heal import rejoin
    comm, step, heals, announced = ctx.communicator(), 0, 0, 0
    if ctx.replacing is not None:
        step = agree(ctx, None)
    while step < n:
        try:
            t = torch.ones(1)
            comm.all_reduce(t)
            assert t.item() == ctx.world_size
            step += 1
            if ctx.rank == 0 and step >= 10 and announced == heals:
                ctx.send("counting")
                announced += 1
            time.sleep(pause)
        except RuntimeError as error:
            comm, heals = rejoin(ctx, comm, error), heals + 1
            if comm is None:
                raise
            step = agree(ctx, step)
    return step, heals, ctx.generation


def agree(ctx, step: int | None) -> int:
    return min(s for s in ctx.exchange(ctx.unique_tag("agree"), step) if s is not None)


def test_the_api_replaces_a_dead_child_and_the_survivors_go_on_with_it():
    with Parent(heartbeat_timeout=5.0) as parent:
        kids = parent.fork(3, heal=True, preload=HEAL)
        kids.exec(count_to, 150, 0.01)
        assert kids[0].receive() == "counting"
        started = set(harness_children_below(os.getpid()))
        os.kill(kids.pids[1], signal.SIGKILL)
        with pytest.raises(ChildFailed, match="child 1 was killed by signal SIGKILL"):
            kids.wait()
        kids.replace(1)
        assert kids.pids[1] in started        # the warm spare, started with the group, took rank 1's place
        results = kids.wait()
    assert [r[0] for r in results] == [150, 150, 150]
    assert [r[1:] for r in results] == [(1, 1), (0, 1), (1, 1)]     # the replacement joined in generation 1


def _recorded_late(monkeypatch) -> None:
    """The parent records each new spare 0.5 s after asking for it: its hello comes first, which a loaded machine
    made happen once in CI (the hello was dropped and the next heal waited for it in vain)."""
    start = Starter._start_spare

    def slow(self):
        spare = start(self)
        time.sleep(0.5)
        return spare
    monkeypatch.setattr(Starter, "_start_spare", slow)
    monkeypatch.setattr(replace, "START_TIMEOUT", 20.0)


@pytest.mark.parametrize("late", [False, True], ids=["", "recorded-after-its-hello"])
def test_a_second_death_soon_after_the_first_takes_the_spare_started_at_the_first(late, tmp_path, monkeypatch):
    """The spare started at the first heal takes the place of a second child that dies soon after,
    told which rank it is once connected; its preloads come from the parent's sys.path."""
    (tmp_path / "preloaded_from_tmp.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))            # children get the parent's sys.path
    if late:
        _recorded_late(monkeypatch)
    with Parent(heartbeat_timeout=5.0) as parent:
        kids = parent.fork(3, heal=True, preload=["preloaded_from_tmp", *HEAL])
        kids.exec(count_to, 150, 0.01)
        assert kids[0].receive() == "counting"
        os.kill(kids.pids[1], signal.SIGKILL)
        with pytest.raises(ChildFailed, match="child 1 was killed"):
            kids.wait()
        before = set(harness_children_below(os.getpid()))
        kids.replace(1)
        assert kids[0].receive() == "counting"          # healed, and counting again
        new_spare = set(harness_children_below(os.getpid())) - before
        os.kill(kids.pids[2], signal.SIGKILL)
        with pytest.raises(ChildFailed, match="child 2 was killed"):
            kids.wait()
        kids.replace(2)
        assert kids.pids[2] in new_spare
        results = kids.wait()
    assert [r[0] for r in results] == [150, 150, 150]
    assert [r[1:] for r in results] == [(2, 2), (1, 2), (0, 2)]     # heals seen by each, and the generation


def place(ctx) -> tuple:
    """Where a child works: rank, generation, GPU, device, and the GPUs it sees."""
    return ctx.rank, ctx.generation, ctx.gpu, str(ctx.device), os.environ["CUDA_VISIBLE_DEVICES"]


def report_place_across_a_heal(ctx) -> tuple:
    """Every rank sends its place; the survivor waits out the heal (the test kills rank 1 while both
    wait for a message); every rank of the healed group returns its place."""
    ctx.send(place(ctx))
    if ctx.replacing is None:
        try:
            ctx.receive()
        except RuntimeError:                # the peer's death aborts the wait
            ctx.await_heal()
    return place(ctx)


def test_a_gpu_groups_spare_sees_the_groups_gpus_and_takes_the_dead_ranks_own(monkeypatch):
    """A GPU group's warm spare starts with every GPU of the group visible and none its own; told to
    assume rank 1, it works on rank 1's GPU, by that GPU's index among those it sees ("3,5": it saw
    both). Neither the parent nor these children touch CUDA, so six GPUs named in CUDA_VISIBLE_DEVICES
    do on any machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5")
    with Parent(heartbeat_timeout=5.0) as parent:
        kids = parent.fork(2, gpus=[3, 5], heal=True, preload=HEAL)
        kids.exec(report_place_across_a_heal)
        assert kids.receive() == [(0, 0, "3", "cuda:0", "3"), (1, 0, "5", "cuda:0", "5")]
        [spare] = set(harness_children_below(os.getpid())) - set(kids.pids)  # forked right after them
        os.kill(kids.pids[1], signal.SIGKILL)
        with pytest.raises(ChildFailed, match="child 1 was killed"):
            kids.wait()
        kids.replace(1)
        assert kids.pids[1] == spare
        assert kids[1].receive() == (1, 1, "5", "cuda:1", "3,5")
        assert kids.wait() == [(0, 1, "3", "cuda:0", "3"), (1, 1, "5", "cuda:1", "3,5")]


def test_replace_needs_a_group_forked_to_heal():
    with Parent() as parent:
        kids = parent.fork(1)
        with pytest.raises(RuntimeError, match="heal=True"):
            kids.replace(0)


def test_soak_of_five_kills_and_hangs_in_one_run_ends_bit_exact_with_nothing_left():
    """The heal soak (tests/helpers/soak.py): one run of 250 updates, 5 signals (SIGKILL and SIGSTOP
    at random moments; seed 0 draws both kinds, and a hang right after a hang), each sent once training
    has gone on after the last heal, so heals follow heals and the spare is replaced again and again.
    A signal waits for a progress record after the last heal (one every 0.5 s, 25 updates) and then up to
    0.3 s more: 40 updates at most, so 5 of them land before the run ends however the heals go.
    Its time limit ends it, and every process of it, well before pytest's timeout would. A hang counts
    after 4 s of silence rather than the soak's 2, so that a survivor slowed by the other xdist workers'
    tests is not taken for hung mid-heal. ``python -m scripts.soak_heal`` runs more."""
    [row] = soak(runs=1, kills=5, steps=250, time_limit=SOAK_LIMIT, train_flags=["--heartbeat-timeout", "4"])

    shown = json.dumps(row, indent=1)        # the whole row, its stderr's tail included
    assert row["kills"] == 5 and {"SIGKILL", "SIGSTOP"} <= set(row["signals"]), shown
    assert not faults(row) and row["max_abs_diff_vs_uninterrupted"] == 0.0, shown
    assert row["steps_lost_max"] is None or row["steps_lost_max"] <= 1, shown


def test_a_gpu_rank_that_went_ahead_of_its_applied_updates_is_moved_back_across_an_epoch_end():
    """GPU workers: the CPU may have queued updates past the last one the GPU applied (harness/resilience/heal.py)."""
    assert rewind(Where(3, 50, 2, 0.5, 1), applied=45, steps_per_epoch=16) == Where(2, 45, 13, 0.5, 1)
    assert rewind(Where(3, 50, 2, 0.5, 1), applied=50, steps_per_epoch=16) == Where(3, 50, 2, 0.5, 1)
    assert rewind(Where(3, 48, 16, 0.5, 1), applied=47, steps_per_epoch=16) == Where(3, 47, 15, 0.5, 1)


class _TwoRanks:
    """A communicator of two ranks in which the other rank completed the update, or did not."""
    size = 2

    def __init__(self, other_completed: bool):
        self.other_completed = other_completed

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self.other_completed:
            tensor.mul_(2)


@pytest.mark.parametrize("name", FUSED)
def test_a_ticket_lets_every_fused_optimizer_apply_an_update_only_where_every_rank_completed_it(name):
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(name, model.parameters(), lr=0.1, impl="fused")
    comm = _TwoRanks(other_completed=True)
    ticket = Ticket(comm, [optimizer], step=5)
    for other_completed, changes in ((True, True), (False, False), (True, True)):
        comm.other_completed = other_completed
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.ones(4, 3)).sum().backward()
        ticket.punch()
        optimizer.step()
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())) is changes
    assert ticket.applied() == 7
    steps = [state["step"] for state in optimizer.state.values() if "step" in state]
    assert all(int(step) == 2 for step in steps)       # the skipped update did not count either


@pytest.mark.parametrize("flags, limit", [([], None), (["--no-cuda-graph"], None), (["--mode", "param"], "--mode param"),
                                          (["--optimizer-impl", "foreach"], "--optimizer sgd --optimizer-impl foreach"),
                                          (["--optimizer", "ccnesterov"], "--optimizer ccnesterov"),
                                          (["--workers-per-gpu", "2"], "--workers-per-gpu 2")])
def test_gpu_workers_heal_in_place_where_their_updates_can_be_guarded_and_else_restart(flags, limit):
    default = Train.parse_args(["--max-restarts", "2", *flags])
    assert heals_in_place(default, gpus=[0, 1]) is (limit is None)
    assert heals_in_place(default, gpus=[]) is True
    assert heals_in_place(Train.parse_args(["--max-restarts", "2", "--heal", "off", *flags]), gpus=[0, 1]) is False
    asked = Train.parse_args(["--max-restarts", "2", "--heal", "on", *flags])
    if limit is None:
        assert heals_in_place(asked, gpus=[0, 1]) is True
    else:
        with pytest.raises(ConfigError, match=f"not with {re.escape(limit)}; drop --heal on"):
            heals_in_place(asked, gpus=[0, 1])
