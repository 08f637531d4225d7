"""--amp fp16: dynamic loss scaling on the flat gradient buffers (harness/training/scaling.py). An
update whose gradients overflow is skipped, parameters and optimizer state untouched, and the scale
halves; clean updates grow it back; a heal ticket's void attempt leaves it alone; Train.py trains on
2 CPU workers with it, logs it and resumes exactly."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from harness.collectives.flat import FlatParameters
from harness.collectives.sync import Synchroniser
from harness.resilience.checkpoint import load_checkpoint
from harness.resilience.heal import Ticket
from harness.training.build import model_loss
from harness.training.metrics import read_metrics
from harness.training.scaling import INITIAL_SCALE, LossScaler
from harness.training.step import TrainStep
from tests.helpers.overflowing_model import SPEC as OVERFLOWING_MODEL, Overflowing
from tests.helpers.training import stop_and_resume, train_error


def fp16() -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.float16, cache_enabled=False)


def test_unscaling_the_flat_buffers_divides_every_gradient_and_flags_any_overflow():
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3).double())    # two flat buffers
    flat = FlatParameters(model)
    assert len(flat.grads) == 2
    for overflow in (False, True):
        flat.zero_grad()
        model[1](model[0](torch.randn(4, 6)).double()).sum().backward()
        if overflow:
            model[1].bias.grad[1] = math.inf
        scaler = LossScaler(torch.device("cpu"), scale=1024.0)
        expected = [p.grad * (1 / 1024.0) for p in model.parameters()]      # GradScaler's unscale, by hand
        scaler.unscale_(flat.grads)
        scaler.update()
        for p, want in zip(model.parameters(), expected):
            assert torch.equal(p.grad, want)
        assert scaler.found_inf.item() == float(overflow)
        assert scaler.scale.item() == (512.0 if overflow else 1024.0)


def scaled_step(model: Overflowing, optimizer: torch.optim.Optimizer, scaler: LossScaler, ticket=None) -> TrainStep:
    flat = FlatParameters(model)
    scaler.bind(optimizer)
    return TrainStep(model, model_loss(model, lambda out, batch: torch.nn.functional.cross_entropy(out, batch[1])),
                     optimizer, flat, Synchroniser(None, flat), fp16, ticket=ticket, scaler=scaler)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    params = [p.detach().clone() for p in model.parameters()]
    return params, copy.deepcopy(optimizer.state_dict()["state"])


def same(before: tuple, after: tuple) -> bool:
    """The same parameters and optimizer state; state the step created counts as unchanged if it is
    zeros, what a fresh optimizer starts from (fused Adam makes its moments even when it skips)."""
    (params_a, state_a), (params_b, state_b) = before, after
    return all(torch.equal(p, q) for p, q in zip(params_a, params_b)) and state_a.keys() <= state_b.keys() and \
        all(torch.equal(state_a.get(i, {}).get(k, torch.zeros_like(v)), v) for i in state_b for k, v in state_b[i].items())


@pytest.mark.parametrize("optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    lambda params: torch.optim.AdamW(params, lr=0.01, fused=True)])
@pytest.mark.parametrize("at", [1, 2])      # the first update too: before the optimizer has any state
def test_an_overflowing_update_is_skipped_the_scale_halves_and_grows_back(optimizer, at):
    torch.manual_seed(0)
    model = Overflowing(64, 10, at=[at])        # this update's gradients are infinite
    optimizer = optimizer(model.parameters())
    scaler = LossScaler(torch.device("cpu"), interval=3)
    step = scaled_step(model, optimizer, scaler)
    batch = (torch.randn(16, 64), torch.randint(0, 10, (16,)))
    for _ in range(at - 1):
        step(batch)
    before = snapshot(model, optimizer)
    loss = step(batch)
    assert torch.isfinite(loss)                 # what the stop vote sees: no divergence
    assert same(before, snapshot(model, optimizer))
    assert (scaler.scale.item(), scaler.skipped.item()) == (INITIAL_SCALE / 2, 1)
    for clean in (1, 2, 3):
        step(batch)
        assert scaler.scale.item() == (INITIAL_SCALE if clean == 3 else INITIAL_SCALE / 2)
    assert not same(before, snapshot(model, optimizer)) and scaler.skipped.item() == 1
    assert all(torch.isfinite(t).all() for t in (*model.parameters(), *snapshot(model, optimizer)[1][0].values()))


class Summing:
    """A communicator of ``size`` ranks whose all-reduce leaves the tensor as it is: with size 1 every
    heal ticket is complete, with size 2 every one is void (a peer never added its part)."""

    device_type = "cpu"

    def __init__(self, size: int):
        self.size = size

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        pass


@pytest.mark.parametrize("void, overflow", [(True, False), (False, True), (False, False)])
def test_with_a_heal_ticket_the_update_is_skipped_where_either_says_and_a_void_attempt_keeps_the_scale(
        void, overflow):
    torch.manual_seed(0)
    model = Overflowing(64, 10, at=[1] if overflow else [])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    ticket = Ticket(Summing(2 if void else 1), [optimizer], step=0)
    scaler = LossScaler(torch.device("cpu"))
    step = scaled_step(model, optimizer, scaler, ticket)
    before = snapshot(model, optimizer)
    step.run((torch.randn(16, 64), torch.randint(0, 10, (16,))))      # run: no CUDA events to wait on
    assert same(before, snapshot(model, optimizer)) == (void or overflow)
    assert optimizer.found_inf.item() == float(void or overflow)
    assert scaler.state_dict() == {"scale": INITIAL_SCALE / 2 if overflow else INITIAL_SCALE,
                                   "clean": 0 if void or overflow else 1, "skipped": int(overflow)}


@pytest.mark.parametrize("flags, fix", [(["--optimizer", "adadelta"], "--optimizer adadelta ignores"),
                                        (["--optimizer-impl", "foreach"], "--optimizer sgd --optimizer-impl foreach")])
def test_fp16_refuses_an_optimizer_that_cannot_skip_an_update(flags, fix, monkeypatch, capsys):
    line = train_error("--amp", "fp16", *flags, "--save", "", monkeypatch=monkeypatch, capsys=capsys)
    assert "error: --amp fp16 skips an overflowing update" in line and fix in line


def test_an_fp16_run_on_two_workers_trains_skips_its_overflows_logs_the_scale_and_resumes_exactly(tmp_path):
    flags = ["--amp", "fp16", "--model", OVERFLOWING_MODEL, "--model-options", '{"at": [30, 150], "delay": 0.005}',
             "--batch-size", "8", "--lr", "0.1"]
    straight, resumed, _, stopped = stop_and_resume(tmp_path, flags, stop=100, total=200)
    assert torch.equal(straight, resumed)
    # One overflow before the stop, on both ranks alike (their averaged gradients are the same).
    assert stopped["loss_scale"] == [{"scale": INITIAL_SCALE / 2, "clean": 70, "skipped": 1}] * 2
    assert load_checkpoint(tmp_path / "resumed.pt")["loss_scale"] == \
        load_checkpoint(tmp_path / "straight.pt")["loss_scale"] == [{"scale": INITIAL_SCALE / 4, "clean": 50,
                                                                     "skipped": 2}] * 2
    records = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    done = records[-1] if records[-1]["event"] == "done" else next(r for r in records if r["event"] == "done")
    assert done["step"] == 200 and not done["diverged"]
    losses = [r["train_loss"] for r in records if r["event"] == "epoch"]
    first = next(r["loss"] for r in records if r["event"] == "first_step")
    assert losses and losses[-1] < first / 2
    steps = [r for r in records if r["event"] == "step"]       # the last update's at least
    assert steps and all(r["loss_scale"] == INITIAL_SCALE / 2 ** r["skipped_updates"] for r in steps)
