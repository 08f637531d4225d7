"""The asynchronous parameter server (--mode async): its stale-synchronous rule on its own, and runs
of Train.py that equal synchronous DiLoCo at S = 0, keep within S with a slow worker, and resume."""
from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

from harness import ChildError, Parent
from harness.collectives import shared
from harness.collectives.async_worker import BAD_SAMPLES, AsyncSynchroniser
from harness.collectives.compress import make_codec
from harness.collectives.flat import FlatParameters
from harness.collectives.outer import OuterOptimizer
from harness.collectives.grants import Grants, covering
from harness.collectives.server import HOLD, ParameterServer, Plan
from harness.collectives.shared import SHARED, SharedAreas
from harness.collectives.wire import Wire
from harness.data.bad_samples import RunCount
from harness.resilience.checkpoint import load_checkpoint
from harness.training.metrics import read_metrics
from tests.helpers import held_model, slow_model
from tests.helpers.batchnorm_model import SPEC as BATCHNORM_MODEL
from tests.helpers.diverging_model import SPEC as DIVERGING_MODEL
from tests.helpers.processes import wait_gone
from tests.helpers.runs import finish, interrupt, start_train, wait_for_record, workers_of
from tests.helpers.training import cli, flat_params, run_test_py, run_train, train_error


class Clock:
    """Virtual seconds for the server's grants."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def started(workers: int, staleness: int, kind: str = "nesterov", plan: Plan = Plan(1000),
            clock: Callable[[], float] = time.monotonic, hold: float = HOLD) -> ParameterServer:
    server = ParameterServer(workers, OuterOptimizer(kind, 0.7, 0.9), every=4, max_staleness=staleness, plan=plan,
                             clock=clock, hold=hold)
    answers = []
    for rank in range(workers):
        answers += server.join(rank, {"anchor": [torch.zeros(3)], "version": 0} if rank == 0 else None)
    assert sorted(r for r, _ in answers) == list(range(workers))
    return server


def delta(value: float) -> list[torch.Tensor]:
    return [torch.full((3,), value)]


def test_with_staleness_0_nobody_is_answered_until_every_worker_has_pushed():
    server = started(3, 0)
    assert server.push(0, 4, 4, delta(1.0)) == []
    assert server.push(2, 4, 4, delta(2.0)) == []
    answers = server.push(1, 4, 4, delta(3.0))
    assert [r for r, _ in answers] == [0, 1, 2]
    assert {a["version"] for _, a in answers} == {1}
    assert [r["staleness"] for r in server.records] == [0, 0, 0]


def test_a_push_s_record_says_how_long_its_worker_stood_still_and_leaves_in_the_order_pushes_were_applied():
    """The worker measures its stall for a push (the trip, the wait, the answer applied) and sends it with its next
    message; until then the record, and every record after it, waits in the server."""
    clock = Clock()
    server = started(2, 0, clock=clock)
    server.push(0, 4, 4, delta(1.0))
    clock.now = 1.5
    server.push(1, 4, 4, delta(1.0))
    assert server.drain() == []                                 # neither worker has said yet
    server.push(1, 8, 4, delta(1.0), stood=0.25)                # rank 1's measure: its record waits behind rank 0's
    assert server.drain() == []
    server.handle(0, ("stood", 2.0))                            # rank 0's, as after the run's last answer
    first = server.drain()
    assert [(r["rank"], r["blocked_s"]) for r in first] == [(0, 2.0), (1, 0.25)]
    clock.now = 2.0
    server.push(0, 8, 4, delta(1.0))                            # applied: every worker pushed for version 2
    assert server.drain() == []
    assert [(r["rank"], r["blocked_s"]) for r in server.drain(everything=True)] == [(0, 0.0), (1, 0.5)]   # ours


def test_a_worker_on_the_parent_s_machine_pushes_and_pulls_through_shared_memory(monkeypatch):
    monkeypatch.setenv("HARNESS_ON_PARENT_MACHINE", "1")
    areas = SharedAreas.offered([3], cuda=False)
    assert areas is not None and all(Path(path).exists() for path in areas.paths.values())
    server = ParameterServer(1, OuterOptimizer("nesterov", 0.7, 0.9), every=4, max_staleness=0, plan=Plan(1000))
    [(_, answer)] = server.join(0, {"anchor": [torch.ones(3)], "version": 0, "shared": areas.paths})
    assert not any(Path(path).exists() for path in areas.paths.values())      # unlinked once mapped
    assert answer["anchor"] == SHARED and torch.equal(areas.pull[0], torch.ones(3))
    areas.push[0].copy_(torch.full((3,), 0.5))
    [(_, answer)] = server.push(0, 4, 4, SHARED)
    assert answer["anchor"] == SHARED
    assert torch.allclose(areas.pull[0], torch.full((3,), 1 - 0.7 * (0.5 + 0.9 * 0.5)))     # Nesterov's first step
    assert server.records[-1]["via"] == "shared memory" and server.records[-1]["bytes"] == 12


def test_a_worker_not_forked_by_the_parent_or_without_dev_shm_offers_no_shared_memory(monkeypatch, tmp_path):
    monkeypatch.delenv("HARNESS_ON_PARENT_MACHINE", raising=False)
    assert SharedAreas.offered([3], cuda=False) is None
    monkeypatch.setenv("HARNESS_ON_PARENT_MACHINE", "1")
    monkeypatch.setattr(shared, "ROOT", tmp_path / "missing")
    assert SharedAreas.offered([3], cuda=False) is None


def test_areas_named_on_another_machine_are_not_made_here_and_that_worker_is_answered_through_the_socket(tmp_path):
    elsewhere = {what: str(tmp_path / f"harness-async-1-0-{what}") for what in ("push", "pull")}
    server = ParameterServer(1, OuterOptimizer("nesterov", 0.7, 0.9), every=4, max_staleness=0, plan=Plan(1000))
    [(_, answer)] = server.join(0, {"anchor": [torch.ones(3)], "version": 0, "shared": elsewhere})
    assert torch.equal(answer["anchor"][0], torch.ones(3)) and list(tmp_path.iterdir()) == []
    server.push(0, 4, 4, [torch.full((3,), 0.5)])
    assert server.records[-1]["via"] == "socket"


def test_what_a_worker_that_died_before_its_join_left_in_dev_shm_is_swept(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_ON_PARENT_MACHINE", "1")
    monkeypatch.setattr(shared, "ROOT", tmp_path)
    areas = SharedAreas.offered([3], cuda=False)
    assert len(list(tmp_path.iterdir())) == 2
    SharedAreas.sweep([os.getpid() + 1])
    assert len(list(tmp_path.iterdir())) == 2         # another process's are left alone
    SharedAreas.sweep([os.getpid()])
    assert list(tmp_path.iterdir()) == [] and torch.equal(areas.push[0], torch.zeros(3))     # still mapped


def test_records_drained_while_the_socket_s_thread_serves_pushes_leave_once_each_and_only_once_measured():
    """``handle`` runs on the thread that reads the socket, ``drain`` on the main thread (driver.served_records)."""
    workers, rounds = 8, 600
    server = started(workers, 0)
    def serve():
        for i in range(1, rounds + 1):
            for rank in range(workers):
                server.handle(rank, ("push", {"step": 4 * i, "updates": 4, "delta": delta(1.0), "stood": 1.0}))
    pushing = threading.Thread(target=serve)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)             # the threads take turns as often as they can
    try:
        pushing.start()
        drained = []
        while pushing.is_alive():
            drained += server.drain()
        pushing.join()
    finally:
        sys.setswitchinterval(switching)
    drained += server.drain(everything=True)
    assert len(drained) == workers * rounds and len({id(r) for r in drained}) == len(drained)
    measured = drained[:-workers]           # every push but the last of each worker was followed by its measure
    assert all(r["blocked_s"] == 1.0 for r in measured)


def test_the_averaged_step_is_the_hand_computed_nesterov_update():
    server = started(2, 0)
    server.push(0, 4, 4, delta(0.2))
    answers = server.push(1, 4, 4, delta(0.4))
    # average 0.3; m = 0.3; anchor = 0 - 0.7 * (0.3 + 0.9 * 0.3)
    expected = torch.zeros(3) - 0.7 * (torch.full((3,), 0.3) + 0.9 * torch.full((3,), 0.3))
    assert torch.allclose(answers[0][1]["anchor"][0], expected)
    server.push(0, 8, 4, delta(0.1))
    answers = server.push(1, 8, 4, delta(0.1))
    m = 0.9 * 0.3 + 0.1
    assert torch.allclose(answers[0][1]["anchor"][0], expected - 0.7 * (0.1 + 0.9 * m))


def test_a_worker_pushing_twice_as_often_waits_exactly_when_it_would_exceed_staleness_1():
    server = started(2, 1, hold=0)       # the staleness rule alone: no push waits for a worker due back
    waits = 0
    for tick in range(1, 13):        # the fast worker (0) pushes every tick, the slow one (1) every other
        pending_fast = any(p.rank == 0 for p in server.pending)
        if not pending_fast:
            before = server.version
            answers = server.push(0, 4 * tick, 4, delta(0.1))
            if 0 not in [r for r, _ in answers]:
                waits += 1
                assert before + 1 - server.base[1] > 1      # it waits only where applying would exceed S
        if tick % 2 == 0:
            server.push(1, 4 * tick, 8, delta(-0.1))
    stalenesses = [r["staleness"] for r in server.records]
    assert max(stalenesses) == 1 and waits > 0
    assert all(0 <= s <= 1 for s in stalenesses)


def test_a_push_is_not_applied_alone_where_another_pending_push_would_then_be_more_than_s_versions_stale():
    """Three workers at S = 1: C waits for B, which then pushes from version 0; C's push alone would have left B's
    pending push two versions stale (it was applied so, until a soak found it)."""
    server = started(3, 1, hold=0)
    server.push(0, 4, 4, delta(0.1))                    # applied at once: version 1
    assert server.push(2, 4, 4, delta(0.1)) == []       # C (base 1) waits: B (base 0) would be 2 behind
    assert server.push(1, 4, 4, delta(0.1)) == []       # B (base 0) pending: C's alone would leave it 2 behind
    assert sorted(r for r, _ in server.push(0, 8, 4, delta(0.1))) == [0, 1, 2]     # averaged together
    assert max(r["staleness"] for r in server.records) == 1


def test_a_push_waits_for_workers_not_measured_yet_or_due_back_within_a_round_and_they_are_averaged():
    clock = Clock()
    server = started(2, 1, clock=clock)
    clock.now = 1.0
    assert server.push(0, 4, 4, delta(0.2)) == []          # worker 1 is in its first grant: the first round waits
    clock.now = 2.0
    answers = dict(server.push(1, 4, 4, delta(0.4)))       # 4 and 2 updates a second: 8 granted, split 5 and 3
    assert server.version == 1 and [answers[0]["grant"], answers[1]["grant"]] == [5, 3]
    clock.now = 3.25                # worker 0's 5 at 4 a second; worker 1 is due back at 3.5, within a round
    assert server.push(0, 9, 5, delta(0.2)) == []
    clock.now = 3.5
    answers = dict(server.push(1, 7, 3, delta(0.4)))
    assert sorted(answers) == [0, 1] and server.version == 2 and max(r["staleness"] for r in server.records) == 0


def test_a_worker_granted_nothing_before_the_last_answer_waits_parked_and_saves_with_the_others():
    server = ParameterServer(2, OuterOptimizer(), every=4, max_staleness=1, plan=Plan(5, saves=True), clock=Clock())
    server.join(1, None)
    answers = dict(server.join(0, {"anchor": [torch.zeros(3)], "version": 3, "updates": [2, 2]}))   # 1 update left
    assert [answers[r]["grant"] for r in (0, 1)] == [1, 0] and not answers[1]["final"]
    assert server.push(1, 2, 0, None, park=True) == []                  # it waits for the last answer
    answers = server.push(0, 3, 1, delta(0.1))
    assert sorted(r for r, _ in answers) == [0, 1] and server.grants.given == [3, 2]
    assert all(a["final"] and a["save"] and a["grant"] == 0 for _, a in answers)


def test_parked_workers_are_not_waited_for_and_are_answered_together():
    server = started(2, 1, hold=0)
    assert server.push(0, 4, 4, delta(0.1), park=True) == []         # applied, then parked
    assert server.version == 1
    assert [r for r, _ in server.push(1, 2, 2, delta(0.2))] == [1]    # not held back by the parked worker
    assert server.version == 2 and server.records[-1]["staleness"] == 1
    answers = server.push(1, 4, 2, None, park=True)
    assert sorted(r for r, _ in answers) == [0, 1]
    assert answers[0][1]["version"] == server.version == 2 and server.base == [2, 2]


def test_after_a_signal_every_worker_runs_out_its_grant_then_all_stop_together_and_save():
    server = started(2, 1, plan=Plan(1000, saves=True), hold=0)
    [(_, answer)] = server.push(0, 4, 4, delta(0.1))
    assert answer["grant"] > 0
    assert server.push(1, 4, 4, delta(0.1), signal=15) == []      # applied, parked: nothing more is granted
    answers = server.push(0, 4 + answer["grant"], answer["grant"], delta(0.1))
    assert sorted(r for r, _ in answers) == [0, 1]
    assert all(a["grant"] == 0 and a["stop_why"] == 15 and a["save"] and a["parked"] for _, a in answers)
    server.handle(0, ("part", {}))
    server.handle(1, ("part", {}))
    [[first, _]] = server.checkpoints()
    assert first["server"]["updates"] == [4 + answer["grant"], 4]    # the budget spent, per worker, with rank 0's part
    assert not any(a["validate"] for _, a in answers)                  # a stop is not the run's end


def test_bad_samples_that_workers_meet_together_past_the_limit_stop_the_run_and_save():
    """--max-bad-samples 1: each worker meets one, or the same one twice; only the run's distinct ones count.
    Past the limit the next pushes park and the release stops every worker, saving (each worker's own count,
    under the limit, would not have stopped it)."""
    server = ParameterServer(2, OuterOptimizer(), every=4, max_staleness=1, plan=Plan(1000, saves=True), hold=0,
                             past_bad_limit=RunCount(1).past)
    server.join(1, None)
    server.join(0, {"anchor": [torch.zeros(3)], "version": 0})
    bad = lambda path: {"event": "bad_sample", "split": "train", "path": path, "index": 3, "error": "truncated"}
    server.report(0, bad("a.jpg"))
    server.report(1, bad("a.jpg"))
    assert server.stop_why == 0
    server.report(1, bad("b.jpg"))
    assert server.stop_why == BAD_SAMPLES
    assert server.push(0, 4, 4, delta(0.1)) == []                   # applied, parked
    answers = server.push(1, 4, 4, delta(0.1))
    assert sorted(r for r, _ in answers) == [0, 1]
    assert all(a["grant"] == 0 and a["stop_why"] == BAD_SAMPLES and a["save"] and a["final"] for _, a in answers)
    assert [r["path"] for r in server.records if r["event"] == "bad_sample"] == ["a.jpg", "a.jpg", "b.jpg"]


def simulated(speeds: tuple[float, ...], budget: int, proportional: bool) -> tuple[list[list[int]], list[float]]:
    """Workers of ``speeds`` (updates a second) taking grants (K = 50) in virtual time until the budget is
    spent: the grants each ran, in order, and when each ended."""
    n = len(speeds)
    grants = Grants(budget, 50, n, proportional)
    running = {r: (grants.grant(r, 0.0, set(range(n))), 0.0) for r in range(n)}      # rank: (grant, since)
    ran, ended = [[] for _ in speeds], [0.0] * n
    while running:
        rank = min(running, key=lambda r: running[r][1] + running[r][0] / speeds[r])
        granted, since = running.pop(rank)
        ended[rank] = since + granted / speeds[rank]
        grants.measure(rank, granted, ended[rank])
        grants.deliver(rank, granted)
        ran[rank].append(granted)
        if following := grants.grant(rank, ended[rank], set(running) | {rank}):
            running[rank] = (following, ended[rank])
    return ran, ended


def test_compressed_pulls_keep_each_worker_on_the_server_s_view_of_it_and_a_release_sends_the_anchor():
    """bf16 on the wire: each answer between releases carries the anchor's change since what the worker holds;
    the worker, adding it, holds the server's view exactly, within bf16's rounding of that change of the
    anchor; the run's end (a release) sends the anchor itself."""
    wire = Wire(make_codec("bf16"))
    server = ParameterServer(2, OuterOptimizer(), every=4, max_staleness=0, plan=Plan(2 * 12), wire=wire)
    generator = torch.Generator().manual_seed(0)
    anchor = [torch.randn(1000, generator=generator)]
    held = {rank: [anchor[0].clone()] for rank in (0, 1)}
    assert {r for r, a in server.join(0, {"anchor": anchor, "version": 0}) + server.join(1, None)} == {0, 1}
    changes = []
    for round in range(3):
        before = [t.clone() for t in server.views[0]]
        pushed = [wire.send([torch.randn(1000, generator=generator) * 0.01]) for _ in (0, 1)]
        answers = server.push(0, 4 * round + 4, 4, pushed[0]) + server.push(1, 4 * round + 4, 4, pushed[1])
        assert sorted(r for r, _ in answers) == [0, 1]
        for rank, answer in answers:
            if "change" in answer:
                for h, d in zip(held[rank], wire.received(answer["change"], held[rank])):
                    h.add_(d)
                assert torch.equal(held[rank][0], server.views[rank][0])
                change = server.anchor[0] - before[0]
                assert (server.anchor[0] - held[rank][0]).abs().max() <= change.abs().max() * 2 ** -8
                changes.append(not torch.equal(held[rank][0], server.anchor[0]))
            else:
                assert answer["final"] and torch.equal(answer["anchor"][0], server.anchor[0])
    assert any(changes)         # rounding left something out, which the next pull carried
    assert all(r["bytes"] == 1000 * 2 for r in server.records)


def push_at(server: ParameterServer, rank: int, step: int, updates: int, value: float = 0.1) -> list:
    """Worker ``rank``'s push after update ``step`` (epoch 0), through ``handle`` as the parent serves it."""
    return server.handle(rank, ("push", {"step": step, "updates": updates, "delta": delta(value),
                                         "place": (0, step, step)}))


def test_a_dead_worker_s_undelivered_grant_goes_back_and_its_replacement_goes_on_from_its_last_applied_push():
    server = ParameterServer(2, OuterOptimizer("nesterov", 0.7, 0.9), every=4, max_staleness=0, plan=Plan(16))
    server.join(0, {"anchor": [torch.zeros(3)], "version": 0, "place": (0, 0, 0)})
    server.join(1, {"place": (0, 0, 0)})
    push_at(server, 0, 4, 4)
    assert [r for r, _ in push_at(server, 1, 4, 4)] == [0, 1]     # a round: applied, both granted 4 more
    assert push_at(server, 1, 8, 4) == []                         # waits for worker 0 (S = 0) ...
    assert server.lose(1) is None                                 # ... and dies: that push is dropped
    assert server.grants.given == [8, 4] and server.grants.left == 4
    assert push_at(server, 1, 8, 4) == []                         # what it sent before it died: ignored
    assert push_at(server, 0, 8, 4) == [] and len(server.pending) == 1     # waits for the replacement
    [(rank, answer)] = server.handle(1, ("rejoin", {"generation": 1}))
    assert rank == 1 and answer["place"] == (0, 4, 4) and answer["grant"] == 4 and answer["version"] == 1
    assert torch.equal(answer["anchor"][0], server.anchor[0]) and answer["generation"] == 1
    answers = push_at(server, 1, 8, 4)                            # the replacement redoes updates 5-8: a round
    assert sorted(r for r, _ in answers) == [0, 1] and all(a["generation"] == 1 for _, a in answers)
    assert all(a["final"] and "place" not in a for _, a in answers) and server.applied == 16
    assert [r["event"] for r in server.drain()].count("healed") == 1


def test_a_checkpoint_is_gathered_from_every_worker_s_part_and_a_worker_dying_before_it_sent_its_own_drops_it():
    """No worker waits for another's part, so a death while they save is healed in place; only the run's last answer
    is followed by an exchange (the bad samples each met), so a death after it is not."""
    server = started(2, 0, plan=Plan(32, save_every=(8,), saves=True))
    for rank in (0, 1):
        answers = server.push(rank, 4, 4, delta(0.1))    # 8 updates applied: every push parks, all answered to save
    assert all(a["save"] for _, a in answers)
    server.handle(1, ("part", {"rank": 1}))
    server.handle(0, ("part", {"rank": 0}))
    [[first, second]] = server.checkpoints()
    assert first["rank"] == 0 and second == {"rank": 1} and server.checkpoints() == []
    assert first["server"]["version"] == 1 and torch.equal(first["server"]["anchor"][0], server.anchor[0])
    for rank in (0, 1):
        answers = server.push(rank, 8, 4, delta(0.1))    # 16: the next checkpoint
    server.handle(0, ("part", {"rank": 0}))
    assert server.lose(1) is None                        # it died before it sent its part
    server.handle(0, ("part", {"rank": 0}))
    assert server.checkpoints() == [] and [r["event"] for r in server.drain(everything=True)][-1] == "save_dropped"
    server = started(2, 0, plan=Plan(8))
    server.push(0, 4, 4, delta(0.1))
    assert all(a["final"] for _, a in server.push(1, 4, 4, delta(0.1)))
    assert "last answer" in server.lose(0)


def test_a_stop_in_the_last_round_still_ends_the_run_on_the_anchor_itself():
    """A signal that comes with the pushes that spend the budget: the run ends there as it would without it, so
    its release sends the anchor whole, not a change (a compressed change only where updates are left)."""
    wire = Wire(make_codec("int8"))
    server = ParameterServer(2, OuterOptimizer(), every=4, max_staleness=0, plan=Plan(2 * 8), wire=wire)
    server.join(0, {"anchor": [torch.randn(64)], "version": 0})
    server.join(1, None)
    answers = server.push(0, 4, 4, wire.send([torch.randn(64)])) + server.push(1, 4, 4, wire.send([torch.randn(64)]))
    assert all("change" in a for _, a in answers)
    answers = server.push(0, 8, 4, wire.send([torch.randn(64)]), signal=15) + \
        server.push(1, 8, 4, wire.send([torch.randn(64)]), signal=15)
    assert [(r, a["final"]) for r, a in answers] == [(0, True), (1, True)]
    assert all(torch.equal(a["anchor"][0], server.anchor[0]) for _, a in answers)


def test_at_staleness_0_a_worker_is_set_aside_no_more_than_is_left_of_its_own_share():
    """--outer-delay at S = 0: the updates a worker may run ahead come out of its own share of the budget, not the
    others' (set aside 3 with 2 of its own left, it ran past its T and was then granted a negative number)."""
    grants = Grants(2 * 200, every=8, workers=2, proportional=False)
    grants.given = [198, 190]
    assert grants.reserve(0, 3) == 2 and grants.reserve(1, 3) == 3
    grants.given = [201, 190]
    assert grants.share_out([0], now=0.0) == [0]


def test_a_round_granted_together_covers_each_worker_s_window_and_never_overspends_the_budget():
    """--outer-delay at S >= 1: both workers ran 3 ahead of their answers, 1 update of the budget is left, and the
    fast one's rate is 10 times the slow one's. Split by rate alone ([6, 1]) the slow one's grant left 2 of its
    window held while the fast one's grant spent them: the budget went to -2, was never spent, and the run went on
    with negative grants, forever."""
    grants = Grants(2 * 100, every=4, workers=2, proportional=True)
    grants.given, grants.window, grants.rates = [100, 93], [3, 3], [10.0, 1.0]
    assert grants.left == 1
    assert grants.share_out([0, 1], now=0.0) == [4, 3]
    assert grants.left == 0 and grants.window == [0, 0]
    assert covering([6, 1], [3, 3]) == [4, 3] and covering([5, 1, 0], [0, 0, 2]) == [3, 1, 2]


def test_at_staleness_0_workers_that_run_ahead_across_checkpoints_end_on_their_share(tmp_path):
    """The run that never ended: checkpoints every epoch shifted the rounds so that the last began 2 updates
    short of the end with --outer-delay 3."""
    flags = ["--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "200", "--outer-delay", "3"]
    results, _ = run_train(tmp_path, *flags, name="ahead")
    syncs = [r for r in read_metrics(tmp_path / "ahead" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert [sum(r["inner_updates"] for r in syncs if r["rank"] == rank) for rank in (0, 1)] == [200, 200]
    assert [r["step"] for r in results] == [200, 200]


def test_grants_follow_the_measured_speed_and_spend_the_budget_exactly():
    ran, ended = simulated((2.0, 1.0), 400, proportional=True)
    assert ran[0][:2] == [50, 50] and ran[1][:1] == [50]                # K until both speeds are measured
    assert ran[0][2:4] == [67, 67] and ran[1][1:3] == [33, 33]         # K * rate / mean rate: 50 * 2 / 1.5, 50 / 1.5
    assert sum(map(sum, ran)) == 400
    assert abs(ended[0] - ended[1]) < 1.0       # the last grants shrink so that both end within one slow update


def test_a_resumed_server_grants_by_the_rates_its_checkpoint_measured_from_its_first_round():
    clock = Clock()
    server = started(2, 1, clock=clock)
    clock.now = 2.0
    server.push(0, 4, 4, delta(0.1))                # rank 0: 4 updates in 2 s; rank 1: 4 in 4 s
    clock.now = 4.0
    server.push(1, 4, 4, delta(0.1), park=True)
    server.push(0, 8, 4, delta(0.1), park=True)
    saved = server.state()
    assert saved["rates"] == [2.0, 1.0]
    resumed = ParameterServer(2, OuterOptimizer("nesterov", 0.7, 0.9), every=4, max_staleness=1, plan=Plan(1000))
    answers = resumed.join(0, {"anchor": [torch.zeros(3)], **saved}) + resumed.join(1, None)
    assert sorted((rank, a["grant"]) for rank, a in answers) == [(0, 5), (1, 3)]     # K x rate / mean, not 4 each


def test_at_staleness_0_every_worker_is_granted_k_out_of_its_own_share_whatever_its_speed():
    ran, _ = simulated((2.0, 1.0), 410, proportional=False)
    assert ran == [[50, 50, 50, 50, 5]] * 2


def test_what_a_worker_did_not_run_of_its_grant_goes_back_to_the_budget():
    grants = Grants(100, 50, 2, proportional=True)
    assert grants.grant(0, 0.0, {0, 1}) == 50 and grants.grant(1, 0.0, {0, 1}) == 50 and grants.left == 0
    grants.measure(0, 20, 1.0)
    grants.deliver(0, 20)                  # it stopped after 20
    assert grants.given == [20, 50] and grants.left == 30 and grants.rates[0] == 20.0


def test_updates_set_aside_to_run_ahead_of_an_answer_are_counted_by_the_push_after_it_and_never_overdraw():
    grants = Grants(24, 10, 2, proportional=True)
    assert grants.share_out([0, 1], 0.0) == [10, 10]
    assert (grants.reserve(0, 3), grants.reserve(1, 3), grants.left) == (3, 1, 0)   # only what the budget has left
    grants.deliver(0, 10, ahead=True)           # worker 0's push runs ahead: its 3 are its window now
    assert (grants.ahead, grants.window, grants.left) == ([0, 1], [3, 0], 0)
    assert grants.settle(0, 1.0) == 3 and grants.window == [0, 0]      # the budget's end: granted its window
    grants = Grants(100, 10, 2, proportional=True)
    grants.share_out([0, 1], 0.0)
    grants.reserve(0, 8)
    grants.deliver(0, 10, ahead=True)
    assert grants.grant(0, 1.0, {0, 1}) == 10 and grants.left == 100 - 30 and grants.window == [0, 0]   # covered
    grants.current[0] = 5                       # granted 5, it ran 8 ahead before it had the answer: it pushes 8
    grants.deliver(0, 8)
    assert grants.given == [23, 10] and grants.window == [0, 0] and grants.left == 100 - 33
    grants.since[0] = 1.0
    grants.measure(0, 3, 5.0, waited=2.5)        # it stood 2.5 s of those 4 waiting for an answer
    assert grants.rates[0] == 2.0


def test_a_push_that_ran_ahead_is_answered_with_its_window_when_the_budget_ends_then_parks_with_the_others():
    """--outer-delay 2, K = 4, S = 1, a budget of 16 updates: every answer sets 2 updates aside for after the next
    push, and a grant counts from the push, its window inside it; where the budget ends, a push whose worker runs
    ahead is granted its window, and its next push parks."""
    server = ParameterServer(2, OuterOptimizer(), every=4, max_staleness=1, plan=Plan(16), hold=0, ahead=2)
    joined = [a for rank in range(2) for a in server.join(rank, {"anchor": [torch.zeros(3)]} if rank == 0 else None)]
    assert [(a["grant"], a["ahead"]) for _, a in joined] == [(4, 2), (4, 2)]
    [(rank, first)] = server.push(0, 4, 4, delta(0.1), ahead=2)           # applied alone: 1 version ahead of 1
    assert rank == 0 and (first["grant"], first["ahead"]) == (4, 2)       # its 2 ahead are inside the 4
    assert server.grants.window == [0, 0] and server.grants.left == 0     # granted or set aside, none twice
    [(rank, last)] = server.push(1, 4, 4, delta(0.1), ahead=2)            # the budget is all granted or set aside
    assert rank == 1 and (last["grant"], last["ahead"], last["parked"]) == (2, 0, False)    # its window of 2
    assert server.push(1, 6, 2, delta(0.1)) == []                         # parked: it waits for worker 0
    [(rank, window)] = server.push(0, 8, 4, delta(0.1), ahead=2)          # ran its 4, then 2 ahead: its window
    assert rank == 0 and (window["grant"], window["ahead"], window["final"]) == (2, 0, False)
    final = server.push(0, 10, 2, delta(0.1))
    assert sorted((r, a["final"], a["grant"]) for r, a in final) == [(0, True, 0), (1, True, 0)]
    assert server.grants.given == [10, 6] and server.applied == 16 and server.grants.left == 0
    with pytest.raises(RuntimeError, match="ran 2 updates ahead"):
        server.push(0, 12, 2, delta(0.1), park=True, ahead=2)


def served(speeds: tuple[float, ...], plan: Plan) -> tuple[ParameterServer, list[tuple[int, dict]]]:
    """Workers of ``speeds`` (updates a second) against a server at S = 1, K = 4, in virtual time: each pushes
    the updates it was granted that many seconds after its answer. Returns the server and every answer."""
    clock = Clock()
    server = ParameterServer(len(speeds), OuterOptimizer(), every=4, max_staleness=1, plan=plan, clock=clock)
    answers = [a for rank in range(len(speeds))
               for a in server.join(rank, {"anchor": [torch.zeros(3)], "version": 0} if rank == 0 else None)]
    due = {r: (a["grant"] / speeds[r], a["grant"]) for r, a in answers}      # rank: (when it pushes, updates)
    steps = [0] * len(speeds)
    while due:
        rank = min(due, key=lambda r: due[r][0])
        clock.now, updates = due.pop(rank)
        steps[rank] += updates
        for r, answer in server.push(rank, steps[rank], updates, delta(0.1)):
            answers.append((r, answer))
            if answer["grant"]:
                due[r] = (clock.now + answer["grant"] / speeds[r], answer["grant"])
    return server, answers


def test_the_server_grants_by_speed_asks_one_worker_per_validation_without_a_barrier_and_ends_on_the_budget():
    server, answers = served((4.0, 1.0), Plan(96, validate_every=16))
    syncs = [r for r in server.records if r["event"] == "outer_sync"]
    granted = {rank: [r["inner_updates"] for r in syncs if r["rank"] == rank] for rank in (0, 1)}
    assert sum(granted[0]) + sum(granted[1]) == 96                       # the budget, each update once
    assert min(granted[0][1:]) > max(granted[1][1:])       # once measured, the fast one gets more
    assert max(r["staleness"] for r in syncs) <= 1
    asked = [(r, a) for r, a in answers if a["validate"]]
    assert [a["parked"] for _, a in asked] == [False] * 5 + [True]       # 16, 32, ... 80 as they came; then the end
    assert [a["updates"] // 16 for _, a in asked] == [1, 2, 3, 4, 5, 6] and asked[-1][0] == 0
    final = [a for _, a in answers if a["parked"]][-2:]
    assert all(a["grant"] == 0 for a in final) and server.grants.given == [sum(granted[0]), sum(granted[1])]


def ask(ctx, service: str) -> object:
    return ctx.request(service, ctx.rank * 10)


def test_a_service_in_the_parent_may_hold_a_request_back_until_another_child_asks():
    held: dict[int, int] = {}

    def pair_up(rank: int, value: int) -> list[tuple[int, object]]:
        held[rank] = value
        return [(r, sum(held.values())) for r in sorted(held)] if len(held) == 2 else []

    with Parent() as parent:
        pair = parent.fork(2)
        pair.serve("pair", pair_up)
        pair.exec(ask, "pair")
        assert pair.wait() == [10, 10]
        pair.exec(ask, "nobody")
        with pytest.raises(ChildError, match="no such service"):
            pair.wait()


SERVED = ["--avg-every", "8", "--outer-optimizer", "nesterov", "--optimizer", "adamw", "--lr", "1e-3",
          "--batch-size", "8"]


def test_staleness_0_trains_the_parameters_of_synchronous_diloco_bit_for_bit(tmp_path):
    """With checkpoints too: their point (every 12 updates' worth) falls inside a round, which parks every worker;
    and the run ends 4 updates into a round, which both end by plain averaging (as they end a whole one: the
    BatchNorm test below)."""
    saves = ["--max-steps", "36", "--save-every-steps", "12"]
    results, served = run_train(tmp_path, "--mode", "async", "--max-staleness", "0", *SERVED, *saves, name="async")
    _, synchronous = run_train(tmp_path, "--mode", "param", *SERVED, *saves, name="sync")
    assert torch.equal(flat_params(served), flat_params(synchronous))
    assert len({r["checksum"] for r in results}) == 1          # every worker ends on the server's anchor
    syncs = [r for r in read_metrics(tmp_path / "async" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert [(r["step"], r["rank"], r["staleness"]) for r in syncs] == [(s, rank, 0) for s in (8, 16, 24, 32, 36)
                                                                       for rank in (0, 1)]
    parameters = flat_params(served).numel()
    assert all(r["bytes"] == parameters * 4 and r["blocked_s"] >= 0 for r in syncs)     # fp32: 4 bytes an element
    assert {r["via"] for r in syncs} == {"shared memory"}       # workers forked on the parent's machine


def test_batchnorm_statistics_are_averaged_at_staleness_0_as_synchronous_diloco_averages_them(tmp_path):
    """The workers' running statistics go with their pushes, and every answer carries their mean: the same buffers,
    and so the same parameters, as param mode's all-reduce of them every round."""
    flags = ["--model", BATCHNORM_MODEL, *SERVED, "--max-steps", "24", "--save-every-steps", "12"]
    results, served = run_train(tmp_path, "--mode", "async", "--max-staleness", "0", *flags, name="async")
    _, synchronous = run_train(tmp_path, "--mode", "param", *flags, name="sync")
    served, synchronous = load_checkpoint(served)["model"], load_checkpoint(synchronous)["model"]
    assert all(torch.equal(served[name], synchronous[name]) for name in synchronous)
    assert not torch.equal(served["2.running_mean"], torch.zeros(32))      # the statistics did move
    assert len({r["checksum"] for r in results}) == 1


SLOWED = ["--model", slow_model.SPEC, "--model-options", '{"delay": 0.05, "rank": 1}']


def ran_by_rank(syncs: list[dict]) -> dict[int, list[int]]:
    """The inner updates of each worker's applied pushes, in order."""
    return {rank: [r["inner_updates"] for r in syncs if r["rank"] == rank] for rank in (0, 1)}


def test_with_one_worker_slowed_the_fast_one_runs_more_of_the_exact_budget_and_staleness_stays_within_s(tmp_path):
    results, _ = run_train(tmp_path, "--mode", "async", "--max-staleness", "1", *SERVED[:1], "4", *SERVED[2:],
                           *SLOWED, "--max-steps", "30", "--validate-every", "5", name="uneven")
    records = read_metrics(tmp_path / "uneven" / "metrics.jsonl")
    syncs = [r for r in records if r["event"] == "outer_sync"]
    assert max(r["staleness"] for r in syncs) <= 1 and min(r["staleness"] for r in syncs) == 0
    ran = ran_by_rank(syncs)
    assert sum(ran[0]) + sum(ran[1]) == 2 * 30          # the samples of 30 updates on each worker, each once
    assert sum(ran[0]) > 30 > sum(ran[1])               # the fast worker took more of them
    assert sum(ran[0]) / len(ran[0]) > sum(ran[1]) / len(ran[1])     # and was granted more at a time
    assert [r["step"] for r in results] == [sum(ran[0]), sum(ran[1])]     # every update pushed, once
    assert [r["step"] for r in syncs if r["rank"] == 0] == list(itertools.accumulate(ran[0]))
    validations = [r for r in records if r["event"] == "validation"]
    passed = [r["updates"] // 10 for r in validations]       # asked every 10 updates of both workers, at most once
    assert len(passed) > 2 and passed == sorted(set(passed)) and all(r["rank"] == 0 for r in validations[1:])
    assert validations[-1]["updates"] == 60 and validations[-1]["step"] == 30   # the end, by the fast worker
    assert [r["step"] for r in validations] == [r["updates"] // 2 for r in validations]


def test_workers_that_train_on_under_their_push_spend_the_exact_budget_and_save_at_consistent_points(tmp_path, capsys):
    """--outer-delay 2: each worker trains on under its push until the answer is there, 2 updates at most, except
    where it parks (the checkpoints every 10 updates' worth, the end): every update is pushed once, the budget is
    spent exactly, and the checkpoint is the anchor."""
    results, saved = run_train(tmp_path, "--mode", "async", "--max-staleness", "1", "--outer-delay", "2",
                               *SERVED[:1], "4", *SERVED[2:], *SLOWED, "--max-steps", "30",
                               "--save-every-steps", "10", name="ahead")
    syncs = [r for r in read_metrics(tmp_path / "ahead" / "metrics.jsonl") if r["event"] == "outer_sync"]
    ran = ran_by_rank(syncs)
    assert sum(ran[0]) + sum(ran[1]) == 2 * 30 and sum(ran[0]) > sum(ran[1])
    assert [r["step"] for r in results] == [sum(ran[0]), sum(ran[1])]
    assert max(r["staleness"] for r in syncs) <= 1
    aheads = {r["ahead"] for r in syncs}      # 2, fewer where less of the budget is left, 0 where parking
    assert {0, 2} <= aheads <= {0, 1, 2}
    assert all(r["blocked_s"] > 0 for r in syncs)       # each worker's own stall, sent on; the server alone saw none
    assert len({r["checksum"] for r in results}) == 1          # parked at the end: every worker on the anchor
    status, _, err = run_test_py(capsys, "--checkpoint", str(saved), "--json")
    assert status == 0, err


class Answers:
    """A worker's context whose server is a list of answers, taken in turn by ``request`` and ``answer``; every
    answer is there as soon as it is looked for."""

    replacing, generation = None, 0

    def __init__(self, *answers: dict):
        self.answers, self.sent = list(answers), []

    def request(self, to: str, message: tuple) -> dict:
        self.sent.append(message)
        return self.answers.pop(0)

    def ask(self, to: str, message: tuple) -> None:
        self.sent.append(message)

    def answered(self) -> bool:
        return True

    def answer(self) -> dict:
        return self.answers.pop(0)

    def follow_heal(self, generation: int) -> None:
        pass


def answer(anchor: float, grant: int, ahead: int = 0) -> dict:
    return {"anchor": [torch.full((8,), anchor)], "version": 1, "stop_why": 0, "grant": grant, "ahead": ahead,
            "updates": 0, "parked": False, "final": False, "validate": False, "save": False}


def test_a_worker_past_its_bad_samples_at_the_update_a_release_answered_parks_again_to_say_so():
    """The release answered its push with a grant of more updates; its bad samples, counted after that update, end
    its loop there. Its finish must tell the server (a park with the stop's reason), or the others' next
    consistent point waits for it for ever while it waits for them in the final exchange of bad samples."""
    flat = FlatParameters(torch.nn.Linear(7, 1))
    ctx = Answers(answer(0.0, grant=2), {**answer(10.0, grant=2), "parked": True},
                  {**answer(10.0, grant=0), "parked": True, "final": True, "stop_why": BAD_SAMPLES})
    worker = AsyncSynchroniser(flat, 0, 2, ctx, signal=lambda: None)
    worker.start()
    worker.after_step(1)
    worker.after_step(2)                # pushes; the release answers it, granting 2 more
    assert worker.parked and worker.grant == 2
    worker.bad_samples = True           # the loop's count after update 2 (ServerVote.bad_samples)
    worker.finish()
    kind, body = ctx.sent[-1]
    assert kind == "push" and body["park"] and body["signal"] == BAD_SAMPLES and body["delta"] is None
    assert worker.final and not ctx.answers


def test_a_worker_that_trained_on_under_its_push_lands_half_way_between_its_parameters_and_the_new_anchor():
    """--outer-delay: the answer taken one update after the push mixes the replica's own parameters and the new
    anchor half and half (not the anchor plus the update made since the push); taken with no update since the
    push, the parameters are the anchor."""
    flat = FlatParameters(torch.nn.Linear(7, 1))
    ctx = Answers(answer(0.0, grant=2, ahead=1), answer(10.0, grant=2, ahead=1), answer(20.0, grant=2, ahead=1),
                  answer(30.0, grant=2))
    worker = AsyncSynchroniser(flat, 0, 1, ctx, signal=lambda: None)
    worker.start()
    for step, moved_to in [(1, 1.0), (2, 2.0), (3, 3.0)]:      # the push after update 2, the answer after 3
        flat.params[0].fill_(moved_to)
        worker.after_step(step)
    assert torch.equal(ctx.sent[1][1]["delta"][0], torch.full((8,), -2.0))     # anchor 0 minus the parameters
    assert torch.equal(flat.params[0], torch.full((8,), (3.0 + 10.0) / 2))
    flat.params[0].fill_(4.0)
    worker.after_step(4)                # pushes again, runs ahead; the end takes that answer with no update since
    worker.finish()
    assert torch.equal(worker.anchor[0], torch.full((8,), 30.0)) and torch.equal(flat.params[0], worker.anchor[0])


def test_a_run_stopped_by_sigterm_resumes_from_the_server_s_state_and_ends_bit_for_bit(tmp_path, capsys):
    """Every worker stops after its grant (K each at S = 0), parks, and rank 0 saves the server's anchor,
    momentum, version and budget spent with every rank's own state, int8 exchanges' rounding error that each
    worker carries into its next push among it (fp32 runs stop and resume so in the tests below)."""
    flags = ["--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "240", "--outer-dtype", "int8",
             *held_model.flags(tmp_path / "gate", 100)]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags, tmp_path / "gate")
    saved = load_checkpoint(checkpoint)
    assert step % 8 == 0 and saved["ranks"][0]["server"]["version"] == step // 8
    assert saved["ranks"][0]["server"]["updates"] == [step, step]
    _, straight = run_train(tmp_path, *flags, name="straight")
    _, resumed = run_train(tmp_path, *flags, "--resume", checkpoint, name="resumed")
    assert torch.equal(flat_params(straight), flat_params(resumed))
    pushed = {r["bytes"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["event"] == "outer_sync"}
    parameters = flat_params(straight).numel()
    assert max(pushed) < parameters * 1.01          # a byte an element
    status, out, err = run_test_py(capsys, "--checkpoint", str(resumed), "--json")     # the server's anchor
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])["accuracy"] > 0.5


def test_uneven_workers_stopped_by_sigterm_resume_each_from_its_own_update_and_spend_the_rest_of_the_budget(tmp_path):
    """At S = 1 the workers have run different numbers of updates when the stop comes: the checkpoint keeps
    each one's place and the budget spent, and the resumed run ends when the rest of it is spent."""
    flags = ["--mode", "async", "--max-staleness", "1", *SERVED[:1], "4", *SERVED[2:], *SLOWED, "--max-steps", "400"]
    process = start_train(tmp_path, *flags)
    os.kill(process.pid, signal.SIGTERM)
    status, err, _, _ = finish(process, tmp_path)
    assert status == 128 + signal.SIGTERM, err
    saved = load_checkpoint(tmp_path / "model.pt")
    places = [rank["place"][1] for rank in saved["ranks"]]
    assert saved["ranks"][0]["server"]["updates"] == places and places[0] > places[1]
    before = ran_by_rank([r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == "outer_sync"])
    assert [sum(before[0]), sum(before[1])] == places
    results, _ = run_train(tmp_path, *flags, "--resume", str(tmp_path / "model.pt"), name="resumed")
    after = ran_by_rank([r for r in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if r["event"] == "outer_sync"])
    assert [r["step"] for r in results] == [places[0] + sum(after[0]), places[1] + sum(after[1])]
    assert sum(places) + sum(after[0]) + sum(after[1]) == 2 * 400
    # a shorter run that the fast worker alone has already passed still has budget left: resumed, it spends it
    shorter = [*flags[:-1], str(places[0]), "--resume", str(tmp_path / "model.pt")]
    results, _ = run_train(tmp_path, *shorter, name="shorter")
    after = ran_by_rank([r for r in read_metrics(tmp_path / "shorter" / "metrics.jsonl") if r["event"] == "outer_sync"])
    assert sum(places) + sum(after[0]) + sum(after[1]) == 2 * places[0]


@pytest.mark.parametrize("flags, message", [
    (["--max-staleness", "2"], "add --mode async"),
    (["--mode", "async", "--max-staleness", "-1"], "--max-staleness"),
    (["--mode", "async", "--avg-every", "8", "--fragments", "2"], "--mode async does not support --fragments"),
    (["--mode", "async", "--patience", "3"], "--mode async does not support --patience"),
    (["--mode", "async", "--zero", "1"], "--zero 1 shards"),
])
def test_what_async_mode_cannot_do_is_refused_in_one_line(flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)


def test_a_worker_whose_loss_turns_nan_stops_the_run_at_its_next_push_and_the_last_good_checkpoint_stays(tmp_path):
    """NaN from update 12 on: every worker stops with the run's exit status 1 by the push after it, and the
    checkpoint due at update 12, which would hold NaN, is not written."""
    save = tmp_path / "model.pt"
    run = cli("Train.py", "--model", DIVERGING_MODEL, "--mode", "async", "--max-staleness", "0", "--avg-every", "4",
              "--max-steps", "40", "--save-every-steps", "4", "--save", str(save), "--log-dir", str(tmp_path / "logs"))
    assert run.returncode == 1, run.stderr
    assert "training diverged" in run.stderr and f"the last good checkpoint is {save}" in run.stderr
    kept = load_checkpoint(save)
    assert kept["step"] == 8 and all(torch.isfinite(v).all() for v in kept["model"].values())
    done = next(r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == "done")
    assert done["diverged"] and done["step"] <= 16      # NaN from update 12 on: seen by the push at 12 or 16


def test_a_worker_killed_mid_run_restarts_the_group_from_the_last_checkpoint_and_the_run_ends_as_if_uninterrupted(
        tmp_path):
    """--heal off: the server lives in the parent, and a dead worker brings the group back to the last checkpoint (the
    server's anchor, momentum and budget spent, every worker's own place and state); at S = 0 that resume is exact."""
    flags = ["--mode", "async", "--max-staleness", "0", *SERVED, *SLOWED, "--max-steps", "64",
             "--save-every-steps", "16", "--max-restarts", "1", "--heal", "off"]
    _, straight = run_train(tmp_path, *flags, name="straight")
    process = start_train(tmp_path, *flags)
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "saved" for r in records))
    os.kill(workers_of(process)[1], signal.SIGKILL)
    status, err, left, _ = finish(process, tmp_path)
    assert status == 0, err
    restarts = [r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == "restart"]
    assert [(r["rank"], r["cause"]) for r in restarts] == [(1, "was killed by signal SIGKILL")]
    assert torch.equal(flat_params(straight), flat_params(tmp_path / "model.pt"))
    assert left == [] and not list(Path("/dev/shm").glob("harness-async-*"))


def test_a_killed_parent_takes_the_server_and_its_workers_with_it_and_the_last_checkpoint_resumes_bit_for_bit(
        tmp_path):
    """The server lives in the parent, so its death ends the group (the workers exit once they no longer hear it);
    what it had written, every worker's part of the last checkpoint, goes on to the uninterrupted run's end."""
    flags = ["--mode", "async", "--max-staleness", "0", *SERVED, *SLOWED, "--max-steps", "64", "--save-every-steps", "16",
             "--heartbeat-timeout", "3"]      # how soon a worker gives up a silent parent
    _, straight = run_train(tmp_path, *flags, name="straight")
    process = start_train(tmp_path, *flags)
    wait_for_record(process, tmp_path, lambda records: any(r["event"] == "saved" for r in records))
    workers = workers_of(process)
    process.kill()
    process.communicate()
    assert len(workers) == 2 and wait_gone(workers, 20) == []
    assert 0 < load_checkpoint(tmp_path / "model.pt")["step"] < 64
    _, resumed = run_train(tmp_path, *flags, "--resume", str(tmp_path / "model.pt"), name="resumed")
    assert torch.equal(flat_params(straight), flat_params(resumed))


@pytest.mark.parametrize("staleness, killed, steps, after", [("0", 1, 64, 16), ("1", 0, 160, 8)])
def test_a_killed_worker_is_replaced_in_place_from_its_last_applied_push_and_the_budget_is_spent_exactly(
        tmp_path, staleness, killed, steps, after):
    """Healing in place (the default with --max-restarts): the other worker trains on, never aborted; the replacement
    rejoins the server and goes on from the place of its predecessor's last applied push, which is all that is kept of
    it: what it had been granted beyond that goes back to the budget, so the updates applied add up to N x T exactly
    and the run ends with status 0, without a restart. Rank 0 is no different, and so is a death while the workers
    save: each sends its part to the parent (which writes the checkpoint) and trains on, waiting for no other. The
    killed worker SIGKILLs itself at its update ``after`` + 1: at S = 1 the fast rank 0 runs nearly all of the budget,
    and a kill from outside, under load, once came after it had spent it (no heal was needed)."""
    slowed = json.dumps({"delay": 0.05, "rank": 1, "kill": [killed, after + 1]})
    flags = ["--mode", "async", "--max-staleness", staleness, *SERVED, *SLOWED[:-1], slowed, "--max-steps", str(steps),
             "--save-every-steps", "8", "--max-restarts", "1"]
    status, err, left, _ = finish(start_train(tmp_path, *flags), tmp_path)
    assert status == 0, err
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert not [r for r in records if r["event"] == "restart"]
    [recovered] = [r for r in records if r["event"] == "recovered"]
    assert recovered["rank"] == killed and recovered["mode"] == "async"
    syncs = [r for r in records if r["event"] == "outer_sync"]
    last = max(r["step"] for r in syncs if r["rank"] == killed and r["version"] <= recovered["version"])
    assert recovered["step"] == last        # its last applied push
    [started] = [r["pids"] for r in records if r["event"] == "workers"]
    assert recovered["pids"][killed] != started[killed] and recovered["pids"][1 - killed] == started[1 - killed]
    assert sum(r["inner_updates"] for r in syncs) == 2 * steps
    assert max(r["staleness"] for r in syncs) <= int(staleness)
    saved = [r for r in records if r["event"] == "saved"]
    assert any(r["time"] > recovered["time"] for r in saved[:-1])     # checkpoints after the heal, and the end's
    assert load_checkpoint(tmp_path / "model.pt")["step"] == saved[-1]["step"]
    assert left == [] and not list(Path("/dev/shm").glob("harness-async-*"))


def test_the_parent_imports_its_server_beside_rank_0_s_checks_not_after_them(tmp_path, monkeypatch):
    """The parameter server the parent serves imports torch: a thread starts that import once the workers are
    forked, so that the workers, which get their first exec after the checks, do not wait for it too."""
    import Train
    from harness.training import driver
    order = []
    start_import, check = driver.import_meanwhile, driver.checked_by
    monkeypatch.setattr(driver, "import_meanwhile",
                        lambda modules, name: order.append(modules) or start_import(modules, name))
    monkeypatch.setattr(driver, "checked_by", lambda kids, config: order.append("checks") or check(kids, config))
    assert Train.main(["--no-plot", "--mode", "async", "--max-steps", "4", "--save", str(tmp_path / "m.pt"),
                       "--log-dir", str(tmp_path)]) == 0
    assert order == [driver.SERVER_IMPORTS, "checks"]
