"""--zero 1 and 2: sharded optimizer state and gradients train the same parameters as replicas, hold
1/N of the state, and write checkpoints that any number of workers with any --zero resumes."""
from __future__ import annotations

import contextlib

import pytest
import torch

import Test
from harness.collectives.flat import FlatParameters
from harness.collectives.async_worker import Solo
from harness.collectives.shards import ShardedGradients, ShardLayout
from harness.resilience.checkpoint import load_checkpoint
from harness.resilience.heal import Where
from harness.resilience.shard_heal import Progress, ShardHealRefused, agreed_place
from harness.training import ConfigError
from harness.training.checks import heals_in_place, resolve
from harness.training.config import TrainConfig
from harness.training.metrics import read_metrics
from harness.training.optim import OPTIMIZERS, build_optimizer, default_impl
from tests.helpers.collectives import small_model
from tests.helpers.runs import killed_at, records_of
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS
from tests.helpers.training import flat_params, optimizer_state, run_train, train_error

# AdamW, clipped, 2 micro-batches, buckets of ~0.2 MiB: the MLP's 1.15 MiB of parameters in several
# buckets, so gradients are reduce-scattered from hooks and some buckets are padded.
RECIPE = ["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.1", "--clip-grad", "0.5", "--grad-accum", "2",
          "--bucket-mb", "0.2", "--cpu-workers", "2"]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """``one_epoch(zero)``: the checkpoint of one epoch (10 updates) with --zero 0, 1 or 2, each made once;
    its log is in the checkpoint's folder, under zeroN."""
    made = {}

    def run(zero: int):
        if zero not in made:
            made[zero] = run_train(tmp_path_factory.mktemp(f"zero{zero}"), *RECIPE, "--epochs", "1", "--zero", str(zero),
                                   name=f"zero{zero}")[1]
        return made[zero]
    return run


def memory(log_dir) -> tuple[list[dict], float | None]:
    """The run's "memory" record: every rank's figures, and the largest bucket (--zero)."""
    record = next(r for r in read_metrics(log_dir / "metrics.jsonl") if r["event"] == "memory")
    return record["ranks"], record["largest_bucket_mb"]


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_runs_train_the_parameters_of_replicas_and_hold_a_shard_of_the_state(stage, one_epoch):
    path, replicas = one_epoch(stage), one_epoch(0)
    torch.testing.assert_close(flat_params(path), flat_params(replicas), rtol=0, atol=1e-6)
    torch.testing.assert_close(optimizer_state(path), optimizer_state(replicas), rtol=0, atol=1e-6)
    (whole, _), (shards, bucket_mb) = memory(replicas.parent / "zero0"), memory(path.parent / f"zero{stage}")
    for full, rank in zip(whole, shards):
        assert rank["param_mb"] == full["param_mb"]
        assert rank["optimizer_mb"] <= full["optimizer_mb"] / 2 + bucket_mb
        if stage == 2:      # this rank's pieces and one bucket of staging
            assert rank["grad_mb"] <= full["grad_mb"] / 2 + bucket_mb
    assert sum(r["optimizer_mb"] for r in shards) == pytest.approx(whole[0]["optimizer_mb"], abs=0.01)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_updates_shards_as_it_updates_whole_parameters(name):
    """Three ranks' optimizers over their pieces of one flat buffer (each given its piece of the
    gradient, as a reduce-scatter would) against one optimizer over the whole parameters."""
    options = {"momentum": 0.9, "nesterov": True} if name == "sgd" else {}
    model, reference = small_model(), small_model()
    reference.load_state_dict(model.state_dict())
    flat = FlatParameters(model)
    layouts = [ShardLayout(flat, 3, rank, bucket_mb=1e-4) for rank in range(3)]
    assert len(layouts[0].buckets) > 1 and any(b.padded for b in layouts[0].buckets)
    sharded = [build_optimizer(name, layout.pieces, lr=0.01, weight_decay=0.01, **options) for layout in layouts]
    whole = build_optimizer(name, reference.parameters(), lr=0.01, weight_decay=0.01, **options)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for param, ref in zip(model.parameters(), reference.parameters()):
            ref.grad = torch.randn(ref.shape, generator=generator)
            param.grad.copy_(ref.grad)
        for layout, optimizer in zip(layouts, sharded):
            for index, bucket in enumerate(layout.buckets):
                first, last = bucket.owned(layout.rank)
                layout.grads[index][:last - first].copy_(flat.grads[0][first:last])
            optimizer.step()
        whole.step()
    for param, ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(param, ref, rtol=0, atol=1e-6, msg=f"{name} ({default_impl(name)})")


def test_stage_2_reduces_a_bucket_of_one_parameter_where_autograd_left_its_gradient():
    """A parameter larger than a bucket is a bucket alone, reduce-scattered straight from its gradient: the
    staging buffer is only as large as the largest bucket of several parameters, and two micro-batches still
    accumulate exactly (a world of one: the reduce-scatter leaves the sum as it is)."""
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 40), torch.nn.ReLU(),
                                   torch.nn.Linear(40, 64))
    model, reference = make(), make()
    flat = FlatParameters(model, flatten_grads=False)
    layout = ShardLayout(flat, 1, 0, bucket_mb=4 * 1000 / 2**20)       # 1000 floats: the last weight is a bucket alone
    sync = ShardedGradients(Solo(), flat, layout, stage=2)
    assert [len(b.params) for b in layout.buckets] == [1, 1, 4] and layout.buckets[1].numel == 40 * 64
    x, y = torch.randn(2, 4, 8), torch.randn(2, 4, 64)
    sync.zero_grad()
    for index in range(2):
        with sync.no_sync() if index == 0 else contextlib.nullcontext():
            torch.nn.functional.mse_loss(model(x[index]), y[index]).backward()
        torch.nn.functional.mse_loss(reference(x[index]), y[index]).backward()
    sync.after_backward()
    assert [t.numel() for slot in sync.slots for t in slot.buffers.values()] == [layout.buckets[2].numel]
    assert all(p.grad is None for p in model.parameters())
    for bucket, grad in zip(layout.buckets, layout.grads):
        for param, offset in zip(bucket.params, bucket.offsets):
            (ref,) = [r for p, r in zip(model.parameters(), reference.parameters()) if p is param]
            got = grad[offset - bucket.start:offset - bucket.start + param.numel()]
            torch.testing.assert_close(got, ref.grad.reshape(-1), rtol=0, atol=1e-6)


def test_a_sharded_checkpoint_resumes_on_other_workers_with_any_zero_and_test_py_reads_it(one_epoch, tmp_path,
                                                                                           capsys):
    """Saved by 2 workers with --zero 2 and by 2 with --zero 0 after one epoch; both resumed by 3 workers,
    the first with --zero 1: the same parameters at the end."""
    sharded, replicated = one_epoch(2), one_epoch(0)
    more = ["--epochs", "2", "--cpu-workers", "3"]
    _, from_sharded = run_train(tmp_path, *more, "--zero", "1", "--resume", str(sharded), name="from-sharded")
    _, from_replicated = run_train(tmp_path, *more, "--resume", str(replicated), name="from-replicated")
    assert load_checkpoint(from_sharded)["config"]["workers"] == 3
    torch.testing.assert_close(flat_params(from_sharded), flat_params(from_replicated), rtol=0, atol=1e-6)
    torch.testing.assert_close(optimizer_state(from_sharded), optimizer_state(from_replicated), rtol=0, atol=1e-6)
    assert Test.main(["--checkpoint", str(from_sharded), "--cpu-workers", "2"]) == 0
    assert "accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("flags, clash", [
    (["--mode", "param"], "--mode param"),
    (["--grad-sync", "flat"], "--grad-sync flat"),
    (["--reduce-dtype", "bf16"], "--reduce-dtype bf16"),
])
def test_zero_with_what_it_cannot_shard_is_one_line(flags, clash, monkeypatch, capsys):
    line = train_error("--zero", "1", *flags, monkeypatch=monkeypatch, capsys=capsys)
    assert clash in line and "--zero" in line


def test_zero_heals_in_place_only_when_asked_on_cpu_and_gpu_workers_alike():
    """A replica of each shard costs memory: --zero restarts from the checkpoint unless --heal on; GPU
    workers guard the shards' updates with the heal ticket as they do whole ones."""
    assert resolve(TrainConfig(zero=2, max_restarts=1))[1].heal_in_place is False
    assert resolve(TrainConfig(zero=2, max_restarts=1, heal="on"))[1].heal_in_place is True
    assert resolve(TrainConfig(zero=0, max_restarts=1))[1].heal_in_place is True
    assert heals_in_place(TrainConfig(zero=1, max_restarts=1, heal="on"), gpus=[0]) is True
    assert heals_in_place(TrainConfig(zero=1, max_restarts=1), gpus=[0]) is False
    with pytest.raises(ConfigError, match="--workers-per-gpu 2"):
        heals_in_place(TrainConfig(zero=1, max_restarts=1, heal="on", workers_per_gpu=2), gpus=[0])


def test_a_sharded_heal_finishes_an_update_some_survivor_stepped_on_and_refuses_ranks_an_update_apart():
    """A survivor may have stepped but not counted the update; one that was ready to step (its gradients
    reduced, replicated and clipped) when the last all-reduce failed steps in the heal; one that finished the
    update and failed afterwards (the stop vote, the next update's all-gather) has counted it. Any of those with
    one that stepped or counted: the group goes back to before the count and finishes that update together. A
    survivor that was not ready when another had stepped is an update behind: refused. Only the ready ones
    step in the heal: one that had counted the update already stepped on it."""
    def at(step, ready, applied):
        return Where(0, step, step, 1.0, 0), Progress(ready, applied)
    counted, uncounted, ready, before = at(21, False, False), at(20, True, True), at(20, True, False), at(20, False, False)
    assert agreed_place([counted, (None, None), uncounted]) == (uncounted[0], True, set())    # rank 0 steps no more
    assert agreed_place([ready, uncounted, (None, None)]) == (ready[0], True, {0})
    assert agreed_place([counted, ready, (None, None)]) == (ready[0], True, {1})
    assert agreed_place([before, (None, None), ready]) == (before[0], False, set())      # nobody stepped: redo it
    assert agreed_place([counted, counted, (None, None)]) == (counted[0], False, set())
    for ahead in (uncounted, counted):
        with pytest.raises(ShardHealRefused, match=r"ranks \[2\] had not applied update 21"):
            agreed_place([ahead, (None, None), before])
    with pytest.raises(ShardHealRefused, match="one dead worker at a time"):
        agreed_place([(None, None), (None, None), before])


def test_a_killed_worker_of_a_sharded_run_is_healed_from_its_shards_replica_bit_for_bit(tmp_path):
    """--zero 2 over three workers (the slow model: padded buckets), a worker SIGKILLed mid-run: the
    replacement takes its shard from the next rank's replica, and the run ends on the parameters and
    optimizer state of the uninterrupted one, bit for bit. Each rank holds two shards of optimizer state."""
    flags = [*SLOW_FLAGS, "--optimizer", "adamw", "--clip-grad", "0.5", "--zero", "2", "--heal", "on",
             "--max-restarts", "1"]
    _, straight = run_train(tmp_path, *flags, name="straight")
    # killed_at starts it with a TMPDIR of its own: socket paths as short as a test's can be
    status, err, left, _ = killed_at(tmp_path, flags, step=20)

    assert status == 0, err
    [heal] = records_of(tmp_path, "recovered")
    assert heal["rank"] == 1 and heal["donor"] == 2 and left == []
    assert records_of(tmp_path, "restart") == []
    healed = tmp_path / "model.pt"
    assert torch.equal(flat_params(straight), flat_params(healed))
    assert torch.equal(optimizer_state(straight), optimizer_state(healed))
    ranks, _ = memory(tmp_path / "logs")
    whole = ranks[0]["param_mb"] * 2       # AdamW: two moments a parameter
    assert all(2 * whole / 3 <= r["optimizer_mb"] < whole for r in ranks)
