"""The knobs of a modern recipe: gradient accumulation, learning-rate schedules with warm-up,
gradient clipping on the flat buffers, torch.compile, and TensorBoard scalars beside metrics.jsonl."""
from __future__ import annotations

import contextlib
import math
import signal

import pytest
import torch

from harness import Parent
from harness.collectives.flat import FlatParameters
from harness.collectives.sync import BucketedGradientAveraging
from harness.training.metrics import read_metrics
from harness.training.schedule import learning_rate
from harness.training.build import model_loss
from harness.training.losses import default_loss
from harness.training.step import TrainStep, clip_grad_norm
from tests.helpers import held_model
from tests.helpers.collectives import Recording, small_model
from tests.helpers.runs import interrupt
from tests.helpers.training import flat_params, run_train, train_error


def one_update(ctx, accum: int) -> tuple:
    """One update of ``small_model`` on this rank's batch of 12 in ``accum`` micro-batches, its
    buckets (one per parameter: hooks) averaged over a recording gloo communicator; returns the
    loss, the parameters after the update, and the launches against the buckets."""
    generator = torch.Generator().manual_seed(ctx.rank)
    x, y = torch.randn(12, 20, generator=generator), torch.randint(0, 5, (12,), generator=generator)
    model = small_model()
    flat, comm = FlatParameters(model), Recording(ctx.communicator())
    sync = BucketedGradientAveraging(comm, flat, bucket_mb=1e-6)
    step = TrainStep(model, model_loss(model, default_loss),
                     torch.optim.SGD(model.parameters(), lr=0.5), flat, sync, contextlib.nullcontext, accum=accum)
    loss = step((x, y))
    return loss.item(), flat.params[0].clone(), [c[:2] for c in comm.calls], \
        [(b.view.data_ptr(), b.view.numel()) for b in sync.buckets]


def test_accumulating_launches_the_buckets_once_per_update_and_equals_the_whole_batch():
    with Parent() as parent:
        pair = parent.fork(2)
        pair.exec(one_update, 1)
        whole = pair.wait()
        pair.exec(one_update, 3)
        accumulated = pair.wait()
    # no_sync: the first two micro-batches' backward passes launch nothing; the third launches each bucket once
    assert all(calls == buckets for _, _, calls, buckets in whole + accumulated)
    for (whole_loss, whole_params, _, _), (mean_loss, params, _, _) in zip(whole, accumulated):
        assert mean_loss == pytest.approx(whole_loss, rel=1e-6)
        torch.testing.assert_close(params, whole_params, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(accumulated[0][1], accumulated[1][1])     # the ranks' updates were averaged


# The two tests that compile on the CPU run on one xdist worker, one after the other: the second finds most of
# the first's kernels in Inductor's cache (alone with a cold cache the second takes 33 s, after the first 7 s).
COMPILED = pytest.mark.xdist_group("compiled_on_cpu")


@COMPILED
def test_workers_times_micro_batches_equal_one_large_batch_bucketed_flat_and_compiled(tmp_path):
    """N workers x K micro-batches x batch b train as one worker with batch N*K*b (the loss is each
    micro-batch's mean over K, the gradients averaged over N once per update), whichever way the
    gradients are averaged, and with the model compiled; every run's replicas stay identical, and the
    bucketed run ends where the flat all-reduce does (to 1e-6)."""
    common = ["--epochs", "2", "--momentum", "0.9", "--lr", "0.1", "--seed", "3"]
    _, one = run_train(tmp_path, *common, "--cpu-workers", "1", "--batch-size", "32", name="one")
    runs = {"2 x 16": ["--batch-size", "16"],
            "2 x 2 x 8, bucketed": ["--batch-size", "8", "--grad-accum", "2", "--bucket-mb", "0.001"],
            "2 x 2 x 8, flat": ["--batch-size", "8", "--grad-accum", "2", "--grad-sync", "flat"],
            "2 x 2 x 8, compiled": ["--batch-size", "8", "--grad-accum", "2", "--bucket-mb", "0.001", "--compile"]}
    reference = flat_params(one)
    epochs = [r["train_loss"] for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if r["event"] == "epoch"]
    ended = {}
    for i, (label, flags) in enumerate(runs.items()):
        results, save = run_train(tmp_path, *common, "--cpu-workers", "2", *flags, name=f"run{i}")
        assert len({r["checksum"] for r in results}) == 1, label        # the replicas stayed identical
        ended[label] = flat_params(save)
        assert (ended[label] - reference).norm() <= 1e-5 * reference.norm(), label
        logged = [r for r in read_metrics(tmp_path / f"run{i}" / "metrics.jsonl") if r["event"] == "epoch"]
        assert [r["train_loss"] for r in logged] == pytest.approx(epochs, rel=1e-5), label
        assert [r["step"] for r in logged] == [40, 80], label
    # buckets launched from the gradient hooks train as one all-reduce of the whole flat gradient
    bucketed, flat = ended["2 x 2 x 8, bucketed"], ended["2 x 2 x 8, flat"]
    assert (bucketed - flat).norm() <= 1e-6 * flat.norm()


@COMPILED
def test_a_compiled_model_in_param_mode_trains_and_validates_as_the_eager_one(tmp_path):
    """--compile compiles the step and, in a graph of its own, validation: both end where eager ones do. With
    micro-batches, and in param mode's autograd gradients, the compiled step adds them up in its backward
    (harness/training/accumulation.py) and the eager one in autograd's: the sums agree."""
    common = ["--max-steps", "30", "--mode", "param", "--avg-every", "3", "--batch-size", "4", "--grad-accum", "2",
              "--seed", "1", "--validate-every", "15"]
    _, eager = run_train(tmp_path, *common, name="eager")
    _, compiled = run_train(tmp_path, *common, "--compile", name="compiled")
    assert (flat_params(compiled) - flat_params(eager)).norm() <= 1e-5 * flat_params(eager).norm()
    validations = {name: [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["event"] == "validation"]
                   for name in ("eager", "compiled")}
    assert [r["step"] for r in validations["compiled"]] == [15, 30]
    for key in ("val_loss", "val_error"):
        assert [r[key] for r in validations["compiled"]] == pytest.approx([r[key] for r in validations["eager"]], rel=1e-5)


def test_schedules_warm_up_then_decay_to_the_minimum():
    lr, low = 0.1, 0.001
    at = lambda schedule, step: learning_rate(step, lr, schedule, total=110, warmup=10, min_lr=low)  # noqa: E731
    assert [at("cosine", s) for s in (0, 4, 9)] == pytest.approx([lr / 11, lr * 5 / 11, lr * 10 / 11])
    assert at("constant", 3) == at("cosine", 3) and at("constant", 100) == lr
    assert at("cosine", 10) == pytest.approx(lr) and at("cosine", 60) == pytest.approx((lr + low) / 2)
    assert at("cosine", 110) == pytest.approx(low) and at("cosine", 500) == pytest.approx(low)
    assert at("linear", 35) == pytest.approx(low + 0.75 * (lr - low))
    assert [at("step", s) for s in (10, 43, 44, 76, 77, 109)] == pytest.approx([lr, lr, lr / 10, lr / 10, lr / 100,
                                                                             lr / 100])
    assert learning_rate(50, lr, "step", total=60, min_lr=0.005) == 0.005     # never below --min-lr
    with pytest.raises(ValueError, match="unknown --lr-schedule 'exp'"):
        learning_rate(0, lr, "exp")


@pytest.mark.parametrize("flatten", [True, False])
def test_clipping_the_flat_gradients_or_autograd_s_own_equals_clip_grad_norm(flatten):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference.load_state_dict(model.state_dict())
    flat, x = FlatParameters(model, flatten_grads=flatten), torch.randn(8, 6)
    for max_norm in (0.05, 1e6):        # clipped, and left alone
        flat.zero_grad()
        reference.zero_grad()
        model(x).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
        expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
        grads = flat.grads if flatten else flat.complete_grads()
        assert len(grads) == (1 if flatten else 4)
        assert clip_grad_norm(grads, max_norm) == pytest.approx(expected.item(), rel=1e-6)
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-8)
        clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])).item()
        assert math.isclose(clipped, min(max_norm, expected.item()), rel_tol=1e-4)


def test_a_scheduled_clipped_run_logs_its_rate_and_norm_writes_tensorboard_and_resumes_exactly(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    flags = ["--max-steps", "200", "--batch-size", "8", "--lr-schedule", "cosine", "--warmup-steps", "30",
             "--min-lr", "0.001", "--clip-grad", "0.5", "--validate-every", "50",
             *held_model.flags(tmp_path / "gate", 100)]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags, tmp_path / "gate")    # stopped soon after 100
    _, straight = run_train(tmp_path, *flags, "--tensorboard", name="straight")
    _, resumed = run_train(tmp_path, *flags, "--resume", checkpoint, name="resumed")
    assert (flat_params(straight) - flat_params(resumed)).norm() <= 1e-6 * flat_params(straight).norm()

    for run in ("straight", "resumed"):
        steps = [r for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["event"] == "step"]
        assert steps[-1]["step"] == 200         # the last update's record, however fast the run went
        assert all(r["lr"] == pytest.approx(learning_rate(r["step"] - 1, 0.05, "cosine", 200, 30, 0.001))
                   for r in steps)
        assert all(r["grad_norm"] > 0 for r in steps)
    board = EventAccumulator(str(tmp_path / "straight")).Reload()
    assert {"step/loss", "step/lr", "step/grad_norm", "validation/val_error"} <= set(board.Tags()["scalars"])
    assert [e.step for e in board.Scalars("validation/val_error")] == [50, 100, 150, 200]


@pytest.mark.parametrize("flags, message", [
    (["--min-lr", "1"], "--min-lr 1.0 must be between 0 and --lr 0.05"),
    (["--warmup-steps", "-1"], "--warmup-steps -1 must not be negative"),
    (["--clip-grad", "0"], "--clip-grad must be a positive norm, got 0.0"),
    (["--cuda-graph", "--warmup-steps", "5", "--optimizer", "adadelta"], "--cuda-graph would freeze the learning rate"),
    (["--grad-accum", "0"], "--grad-accum must be at least 1, got 0"),
    (["--batch-size", "400", "--grad-accum", "2"], "--batch-size 400 x --grad-accum 2 is larger than a worker's "
                                                   "shard (647 samples of 1294 over 2 workers); --batch-size is each "
                                                   "worker's, so it can be 323 at most with --grad-accum 2"),
    (["--optimizer", "adadelta", "--optimizer-impl", "fused"], "torch has no fused adadelta"),
    (["--max-steps", "20", "--lr-schedule", "cosine", "--warmup-steps", "20"],
     "--warmup-steps 20 is as long as the run or longer (20 updates): the rate would never reach --lr 0.05"),
    (["--max-steps", "20", "--validate-every", "21"],
     "--validate-every 21 is longer than the run (20 updates): it would never validate; validate more often"),
])
def test_bad_recipe_flags_are_one_line_errors(flags, message, tmp_path, monkeypatch, capsys):
    assert message in train_error(*flags, "--log-dir", str(tmp_path), monkeypatch=monkeypatch, capsys=capsys)
