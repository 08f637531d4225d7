"""The asynchronous parameter server (--mode async): its stale-synchronous rule on its own, and runs
of Train.py that equal synchronous DiLoCo at S = 0, keep within S with a slow worker, and resume."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from harness import ChildError, Parent
from harness.collectives.outer import OuterOptimizer
from harness.collectives.server import ParameterServer
from harness.resilience.checkpoint import load_checkpoint
from harness.training.metrics import read_metrics
from tests.helpers import slow_model
from tests.helpers.runs import interrupt
from tests.helpers.training import cli, flat_params, run_train, train_error


def started(workers: int, staleness: int, kind: str = "nesterov") -> ParameterServer:
    server = ParameterServer(workers, OuterOptimizer(kind, 0.7, 0.9), every=4, max_staleness=staleness)
    answers = []
    for rank in range(workers):
        answers += server.join(rank, {"anchor": [torch.zeros(3)], "version": 0} if rank == 0 else None)
    assert sorted(r for r, _ in answers) == list(range(workers))
    return server


def delta(value: float) -> list[torch.Tensor]:
    return [torch.full((3,), value)]


def test_with_staleness_0_nobody_is_answered_until_every_worker_has_pushed():
    server = started(3, 0)
    assert server.push(0, 4, delta(1.0)) == []
    assert server.push(2, 4, delta(2.0)) == []
    answers = server.push(1, 4, delta(3.0))
    assert [r for r, _ in answers] == [0, 1, 2]
    assert {a["version"] for _, a in answers} == {1}
    assert [r["staleness"] for r in server.records] == [0, 0, 0]


def test_the_averaged_step_is_the_hand_computed_nesterov_update():
    server = started(2, 0)
    server.push(0, 4, delta(0.2))
    answers = server.push(1, 4, delta(0.4))
    # average 0.3; m = 0.3; anchor = 0 - 0.7 * (0.3 + 0.9 * 0.3)
    expected = torch.zeros(3) - 0.7 * (torch.full((3,), 0.3) + 0.9 * torch.full((3,), 0.3))
    assert torch.allclose(answers[0][1]["anchor"][0], expected)
    server.push(0, 8, delta(0.1))
    answers = server.push(1, 8, delta(0.1))
    m = 0.9 * 0.3 + 0.1
    assert torch.allclose(answers[0][1]["anchor"][0], expected - 0.7 * (0.1 + 0.9 * m))


def test_a_worker_pushing_twice_as_often_waits_exactly_when_it_would_exceed_staleness_1():
    server = started(2, 1)
    waits = 0
    for tick in range(1, 13):        # the fast worker (0) pushes every tick, the slow one (1) every other
        pending_fast = any(p.rank == 0 for p in server.pending)
        if not pending_fast:
            before = server.version
            answers = server.push(0, 4 * tick, delta(0.1))
            if 0 not in [r for r, _ in answers]:
                waits += 1
                assert before + 1 - server.base[1] > 1      # it waits only where applying would exceed S
        if tick % 2 == 0:
            server.push(1, 4 * tick, delta(-0.1))
    stalenesses = [r["staleness"] for r in server.records]
    assert max(stalenesses) == 1 and waits > 0
    assert all(0 <= s <= 1 for s in stalenesses)


def test_parked_workers_are_not_waited_for_and_are_answered_together():
    server = started(2, 1)
    assert server.push(0, 4, delta(0.1), park=True) == []         # applied, then parked
    assert server.version == 1
    assert [r for r, _ in server.push(1, 2, delta(0.2))] == [1]    # not held back by the parked worker
    assert server.version == 2 and server.records[-1]["staleness"] == 1
    answers = server.push(1, 4, None, park=True)
    assert sorted(r for r, _ in answers) == [0, 1]
    assert answers[0][1]["version"] == server.version == 2 and server.base == [2, 2]


def test_a_signal_announces_a_stop_at_the_next_boundary_no_worker_has_passed():
    server = started(2, 1)
    server.push(0, 8, delta(0.1))
    answers = server.push(1, 4, delta(0.1), signal=15)
    assert server.stop_at == 12 and all(a["stop_at"] == 12 for _, a in answers)


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
    results, served = run_train(tmp_path, "--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "40",
                                name="async")
    _, synchronous = run_train(tmp_path, "--mode", "param", *SERVED, "--max-steps", "40", name="sync")
    assert torch.equal(flat_params(served), flat_params(synchronous))
    assert len({r["checksum"] for r in results}) == 1          # every worker ends on the server's anchor
    syncs = [r for r in read_metrics(tmp_path / "async" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert [(r["step"], r["rank"], r["staleness"]) for r in syncs] == [(s, rank, 0) for s in range(8, 41, 8)
                                                                       for rank in (0, 1)]
    assert all(r["bytes"] > 0 and r["blocked_s"] >= 0 for r in syncs)


def test_with_one_worker_slowed_no_push_is_applied_more_than_s_versions_stale(tmp_path):
    slowed = ["--model", slow_model.SPEC, "--model-options", '{"delay": 0.05, "rank": 1}']
    run_train(tmp_path, "--mode", "async", "--max-staleness", "1", *SERVED[:1], "2", *SERVED[2:], *slowed,
              "--max-steps", "30", name="uneven")
    syncs = [r for r in read_metrics(tmp_path / "uneven" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert max(r["staleness"] for r in syncs) == 1 and min(r["staleness"] for r in syncs) == 0
    fast = [r["step"] for r in syncs if r["rank"] == 0]
    assert fast == list(range(2, 31, 2))            # the fast worker's every push was applied, once


def test_a_run_stopped_by_sigterm_resumes_from_the_server_s_state_and_ends_bit_for_bit(tmp_path):
    """Every worker stops at the update the server announced (a multiple of K), parks, and rank 0 saves
    the server's anchor, momentum and version with every rank's own state."""
    flags = ["--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "200"]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags)
    saved = load_checkpoint(checkpoint)
    assert step % 8 == 0 and saved["ranks"][0]["server"]["version"] == step // 8
    _, straight = run_train(tmp_path, *flags, name="straight")
    _, resumed = run_train(tmp_path, *flags, "--resume", checkpoint, name="resumed")
    assert torch.equal(flat_params(straight), flat_params(resumed))
    tested = cli("Test.py", "--checkpoint", str(resumed), "--json")        # its model is the server's anchor
    assert tested.returncode == 0, tested.stderr
    assert json.loads(tested.stdout.strip().splitlines()[-1])["accuracy"] > 0.5


@pytest.mark.parametrize("flags, message", [
    (["--max-staleness", "2"], "add --mode async"),
    (["--mode", "async", "--max-staleness", "-1"], "--max-staleness"),
    (["--mode", "async", "--avg-every", "8", "--fragments", "2"], "--mode async does not support --fragments"),
    (["--mode", "async", "--outer-dtype", "int8"], "--mode async does not support --outer-dtype int8"),
    (["--mode", "async", "--patience", "3"], "--mode async does not support --patience"),
    (["--mode", "async", "--zero", "1"], "--zero 1 shards"),
])
def test_what_async_mode_cannot_do_is_refused_in_one_line(flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)
