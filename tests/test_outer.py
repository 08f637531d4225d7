"""Param mode's outer optimizer (DiLoCo): Nesterov on the averaged pseudo-gradient, fragments synced at
staggered updates and applied late, compressed deltas with error feedback, exact resume mid-round."""
from __future__ import annotations

import signal

import pytest
import torch

from harness import Parent
from harness.collectives.async_worker import Solo
from harness.collectives.compress import Int8Codec, make_codec
from harness.collectives.flat import FlatParameters
from harness.collectives.outer import AVERAGE, OuterOptimizer, OuterSynchroniser, fragment_slices
from harness.resilience.checkpoint import load_checkpoint
from harness.resilience.heal import Where, hand_over_anchor
from harness.training.metrics import read_metrics
from tests.helpers import held_model
from tests.helpers.collectives import small_model
from tests.helpers.runs import interrupt, killed_at, records_of
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS
from tests.helpers.training import flat_params, run_train, train_error

DILOCO = ["--mode", "param", "--avg-every", "8", "--outer-optimizer", "nesterov", "--optimizer", "adamw",
          "--lr", "1e-3"]


def two_outer_steps(ctx) -> tuple:
    """Each rank moves its parameters by its own amount, twice, each time followed by an outer sync
    (K = 1, nesterov 0.7 / 0.9); returns the parameters after each sync."""
    model = small_model()
    flat = FlatParameters(model)
    sync = OuterSynchroniser(ctx.communicator(), flat, 1, OuterOptimizer("nesterov", 0.7, 0.9), make_codec("fp32"))
    sync.start()
    after = []
    for step, move in ((1, 0.1), (2, -0.05)):
        flat.params[0].add_(move * (ctx.rank + 1))
        sync.after_step(step)
        after.append(flat.params[0].clone())
    return after


def syncs_of_a_run(ctx, every: int, fragments: int, delay: int, total: int) -> list[tuple[int, int]]:
    """(update, fragment) of each outer step applied in a run of ``total`` updates ending as Train.py ends it."""
    flat = FlatParameters(small_model())
    applied = []
    sync = OuterSynchroniser(ctx.communicator(), flat, every, OuterOptimizer(), make_codec("fp32"), fragments, delay,
                             report=lambda record: applied.append((record["step"], record["fragment"])))
    sync.ends_after(total)
    sync.start()
    for step in range(1, total + 1):
        flat.params[0].add_(0.01)
        sync.after_step(step)
    sync.end_of_run(total)
    return applied


def test_the_run_s_end_syncs_what_has_moved_since_its_last_sync_and_nothing_twice():
    with Parent() as parent:
        pair = parent.fork(2)
        pair.exec(syncs_of_a_run, 8, 1, 0, 16)
        whole, _ = pair.wait()
        pair.exec(syncs_of_a_run, 8, 2, 2, 18)
        streamed, _ = pair.wait()
    assert whole == [(8, 0), (16, 0)]          # update 16 synced already: no second outer step at the end
    # fragment 0 sent after 16 lands at 18 with the progress of 17 and 18 on top, which the end then sends
    assert streamed == [(6, 1), (10, 0), (14, 1), (18, 0), (18, 0), (18, 1)]


def run_ended(ctx, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nesterov syncs at K = 4 with momentum built up, in a run of ``total`` updates ended as Train.py ends it;
    returns this rank's parameters before its last sync and after it."""
    flat = FlatParameters(small_model())
    sync = OuterSynchroniser(ctx.communicator(), flat, 4, OuterOptimizer("nesterov", 0.7, 0.9), make_codec("fp32"))
    sync.ends_after(total)
    sync.start()
    for step in range(1, total + 1):
        flat.params[0].add_(0.01 * (ctx.rank + 1) * step)
        sync.after_step(step)
    before = flat.params[0].clone()
    sync.end_of_run(total)
    return before, flat.params[0].clone()


@pytest.mark.parametrize("total", [10, 12])
def test_the_run_s_last_sync_whole_round_or_partial_ends_on_the_mean_of_the_replicas(total):
    """The outer momentum carries the anchor ahead of the replicas for them to train on from there; the run's
    model is their mean (ending 2 updates into a round, or on a whole one)."""
    with Parent() as parent:
        pair = parent.fork(2)
        pair.exec(run_ended, total)
        (before0, after0), (before1, after1) = pair.wait()
    assert torch.equal(after0, after1)
    torch.testing.assert_close(after0, (before0 + before1) / 2, rtol=0, atol=1e-6)


def test_outer_nesterov_matches_the_hand_computed_update_for_two_syncs():
    with Parent() as parent:
        pair = parent.fork(2)
        pair.exec(two_outer_steps)
        (first, second), other = pair.wait()
    assert all(torch.equal(a, b) for a, b in zip((first, second), other))     # every rank holds the anchor
    start = FlatParameters(small_model()).params[0]
    # round 1: the ranks moved by 0.1 and 0.2, so the averaged delta (anchor - params) is -0.15 everywhere
    delta1 = torch.full_like(start, -0.15)
    m1 = delta1
    anchor1 = start - 0.7 * (delta1 + 0.9 * m1)
    # round 2: from anchor1, moved by -0.05 and -0.1: delta +0.075
    delta2 = torch.full_like(start, 0.075)
    m2 = 0.9 * m1 + delta2
    anchor2 = anchor1 - 0.7 * (delta2 + 0.9 * m2)
    torch.testing.assert_close(first, anchor1, rtol=0, atol=1e-6)
    torch.testing.assert_close(second, anchor2, rtol=0, atol=1e-6)


def exchanged(ctx) -> dict:
    """Each codec's average of two ranks' vectors."""
    x = torch.linspace(-1, 1, 3000) * (ctx.rank + 1)
    comm = ctx.communicator()
    return {name: make_codec(name).exchange(comm, make_codec(name).encode(x))() for name in ("fp32", "bf16", "int8")}


def test_every_codec_averages_over_the_ranks_to_within_its_rounding():
    with Parent() as parent:
        pair = parent.fork(2)
        pair.exec(exchanged)
        results = pair.wait()
    truth = torch.linspace(-1, 1, 3000) * 1.5
    for name, tolerance in (("fp32", 1e-7), ("bf16", 1e-2), ("int8", 2 / 127)):
        assert torch.equal(results[0][name], results[1][name]), name
        assert (results[0][name] - truth).abs().max() <= tolerance, name


def test_int8_error_feedback_keeps_the_sum_sent_within_one_quantum_of_the_true_sum():
    codec, generator = Int8Codec(), torch.Generator().manual_seed(0)
    residual, true_sum, sent_sum = torch.zeros(5000), torch.zeros(5000), torch.zeros(5000)
    for _ in range(50):
        delta = torch.randn(5000, generator=generator) * 0.01
        x = delta + residual
        payload = codec.encode(x)
        sent = codec.decoded(payload)
        residual = x - sent
        true_sum += delta
        sent_sum += sent
        quantum = payload[1].repeat_interleave(1024)[:5000]
    assert ((true_sum - sent_sum).abs() <= quantum / 2 + 1e-7).all()
    assert (true_sum - sent_sum).abs().max() > 0        # int8 does round: the feedback is doing the work


@pytest.mark.parametrize("fragments", [1, 3, 4])
def test_fragments_cover_every_parameter_exactly_once_per_round(fragments):
    sizes, every = [1000, 37, 5], 12
    slices = fragment_slices(sizes, fragments)
    for buffer, size in enumerate(sizes):
        covered = torch.zeros(size, dtype=torch.int32)
        for fragment in slices:
            for b, start, stop in fragment:
                if b == buffer:
                    covered[start:stop] += 1
        assert torch.equal(covered, torch.ones(size, dtype=torch.int32))
    offsets = [f * every // fragments for f in range(fragments)]
    launches = [sum(1 for step in range(1 + r * every, 1 + (r + 1) * every) if step % every == offset)
                for r in range(3) for offset in offsets]
    assert launches == [1] * (3 * fragments)


def test_streaming_diloco_resumed_after_a_sigterm_with_an_exchange_in_flight_ends_bit_for_bit(tmp_path):
    """The stop vote stops at a multiple of 4 updates, where a fragment's int8 exchange (fragments at
    updates 0 and 4 mod 8, applied 2 later) has just been launched: it is in the checkpoint."""
    flags = [*DILOCO, "--fragments", "2", "--outer-delay", "2", "--outer-dtype", "int8", "--max-steps", "200",
             "--batch-size", "8", *held_model.flags(tmp_path / "gate", 100)]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags, tmp_path / "gate")
    saved = load_checkpoint(checkpoint)
    assert [p[:3] for p in saved["ranks"][0]["pending"]] == [(step % 8 // 4, step, step + 2)]
    # rank 0's AdamW state is in the file once: the top level's is its own part's, the same storage
    sizes = [len(part["optimizer"]["state"]) for part in saved["ranks"]]
    assert sizes == [len(saved["optimizer"]["state"])] * 2 and sizes[0] > 0
    assert all(state["exp_avg"].untyped_storage().data_ptr() == own["exp_avg"].untyped_storage().data_ptr()
               for state, own in zip(saved["optimizer"]["state"].values(), saved["ranks"][0]["optimizer"]["state"].values()))
    results, straight = run_train(tmp_path, *flags, name="straight")
    _, resumed = run_train(tmp_path, *flags, "--resume", checkpoint, name="resumed")
    assert torch.equal(flat_params(straight), flat_params(resumed))
    assert len({r["checksum"] for r in results}) == 1          # every worker ends on the anchor
    validations = [r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["event"] == "validation"]
    assert validations[-1]["val_error"] < 0.5
    syncs = [r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert [(r["launched"], r["step"], r["fragment"]) for r in syncs[:3]] == [(4, 6, 1), (8, 10, 0), (12, 14, 1)]
    assert all(r["bytes"] > 0 and r["blocked_s"] >= 0 and r["staleness"] == 0 for r in syncs)


def test_a_streaming_checkpoint_saved_with_its_exchange_s_snapshot_loads_and_lands_the_exchange():
    """Checkpoints of before the mixing (52a8fa4) kept each exchange in flight with the replica's parameters at its
    launch; they load, that copy dropped, and the exchange lands mixed at the update it was due."""
    flat = FlatParameters(small_model())
    applied = []
    sync = OuterSynchroniser(Solo(), flat, 8, AVERAGE, make_codec("fp32"), 2, 2,
                             report=lambda record: applied.append((record["step"], record["launched"])))
    sync.start()
    state = sync.state_dict()
    size = sum(stop - start for _, start, stop in sync.slices[0])
    state["pending"] = [(0, 6, 8, torch.full((size,), 0.5), [torch.zeros(3)], 1234)]
    sync.load_state_dict(state)
    before = [view.clone() for view in sync._views(flat.params, 0)]
    for step in (7, 8):
        sync.after_step(step)
    assert applied == [(8, 6)]
    for now, then in zip(sync._views(flat.params, 0), before):      # anchor - 0.5, mixed half with the replica's
        assert torch.allclose(now, then - 0.25)


@pytest.mark.parametrize("flags, message", [
    (["--outer-optimizer", "nesterov"], "--outer-optimizer sets what --mode param (or async) does every --avg-every "
                                        "updates; add --mode param"),
    (["--mode", "param", "--avg-every", "4", "--fragments", "5"], "at most K fragments"),
    (["--mode", "param", "--avg-every", "8", "--fragments", "2", "--outer-delay", "4"], "--outer-delay 4 must be under"),
    (["--mode", "param", "--outer-momentum", "0.5"], "add --outer-optimizer nesterov"),
    (["--avg-optimizer-state"], "in plain averaging (--mode param); add --mode param or drop it"),
    (["--mode", "param", "--outer-optimizer", "nesterov", "--avg-optimizer-state"],
     "the outer optimizer keeps each worker's own inner state, as DiLoCo does: drop it"),
    (["--mode", "param", "--outer-dtype", "bf16", "--avg-optimizer-state"], "without an outer optimizer, fragments"),
])
def test_outer_flags_that_cannot_work_are_one_line(flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)


def anchor_hand_over(ctx) -> dict:
    """Three ranks whose parameters, anchors, outer momenta, residuals and AdamW states differ: rank 2 is the
    replacement (nothing held, an optimizer without state), rank 1 the survivor with the fewest updates."""
    model = small_model()
    flat = FlatParameters(model)
    for param in flat.params:
        param.add_(ctx.rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    if ctx.rank < 2:
        model(torch.full((4, 20), float(ctx.rank + 1))).sum().backward()
        optimizer.step()
    before = [v.clone() for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    held = None if ctx.rank == 2 else {"anchor": [t + 10 * (ctx.rank + 1) for t in flat.params],
                                      "momentum": [torch.full_like(t, ctx.rank + 1.0) for t in flat.params],
                                      "residual": [torch.full_like(t, ctx.rank + 1.0) for t in flat.params]}
    where = None if ctx.rank == 2 else Where(0, 10 - ctx.rank, 10 - ctx.rank, float("inf"), 0)
    place, summary, held = hand_over_anchor(ctx, ctx.communicator(), flat, optimizer, where, held, nesterov=True)
    after = [v.clone() for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return {"params": [p.clone() for p in flat.params], **held, "before": before, "after": after,
            "place": place, "summary": summary}


def test_a_diloco_heal_takes_every_rank_back_to_the_donor_s_anchor_and_gives_the_replacement_its_inner_state():
    with Parent() as parent:
        group = parent.fork(3)
        group.exec(anchor_hand_over)
        ranks = group.wait()
    donor = ranks[1]
    assert donor["summary"]["donor"] == 1 and donor["place"].step == 9 and donor["summary"]["back_to_anchor"]
    for rank in ranks:
        assert all(torch.equal(p, a) for p, a in zip(rank["params"], donor["anchor"]))
        assert all(torch.equal(m, torch.full_like(m, 2.0)) for m in rank["momentum"])      # the donor's
    assert [float(rank["residual"][0].flatten()[0]) for rank in ranks] == [1.0, 2.0, 0.0]    # each its own
    def same(a: list, b: list) -> bool:
        return len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert same(ranks[0]["after"], ranks[0]["before"]) and same(donor["after"], donor["before"])   # survivors keep theirs
    assert ranks[2]["before"] == [] and same(ranks[2]["after"], donor["before"])       # the replacement: the donor's
    assert not same(ranks[0]["before"], donor["before"])


def test_a_diloco_worker_killed_is_healed_in_place_from_the_last_sync(tmp_path):
    """DiLoCo (K = 8) on three CPU workers, one SIGKILLed after update 20: no restart; the group goes back to the
    anchor of its last sync and finishes. It loses at most K - 1 updates of progress, so it ends below the loss
    the uninterrupted run had 2K updates before its end."""
    flags = [*SLOW_FLAGS, *DILOCO, "--max-restarts", "1", "--heal", "on", "--validate-every", "4"]
    status, err, left, _ = killed_at(tmp_path, flags, step=20)

    assert status == 0, err
    [heal] = records_of(tmp_path, "recovered")
    assert heal["rank"] == 1 and heal["back_to_anchor"] and heal["mode"] == "param" and left == []
    assert records_of(tmp_path, "restart") == []
    healed = {r["step"]: r["val_loss"] for r in records_of(tmp_path, "validation")}
    run_train(tmp_path, *flags, name="straight")
    straight = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")
                if r["event"] == "validation"}
    print("DiLoCo heal at update", heal["step"], "val_loss healed", healed[60], "uninterrupted", straight[60],
          "at 44", straight[44])
    assert healed[60] < straight[44]
