"""Gradient accumulation inside the compiled backward (harness/training/accumulation.py): the micro-batches'
gradients add up to what autograd's own accumulation gives, each micro-batch's sum a gradient autograd takes
over rather than adds into; tied weights count once, frozen ones get none; a step of K micro-batches on it
trains as the plain step does."""
from __future__ import annotations

import contextlib
import functools

import torch

from harness.collectives.async_worker import Solo
from harness.collectives.flat import FlatParameters
from harness.collectives.sync import Synchroniser
from harness.training.accumulation import FusedAccumulation
from harness.training.build import model_loss
from harness.training.step import TrainStep

LIGHT = functools.partial(torch.compile, backend="aot_eager")       # autograd traced as Inductor's is, no codegen


class Tied(torch.nn.Module):
    """An embedding tied to the output layer (as GPT-2's), and a frozen layer between."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.out = torch.nn.Linear(8, 11)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.frozen(self.embed(tokens))))


def loss(logits: torch.Tensor, batch: tuple) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 11, (4, 5), generator=g), torch.randint(0, 11, (4, 5), generator=g))
            for _ in range(count)]


def test_the_micro_batches_gradients_sum_as_autograds_own_accumulation_gives():
    torch.manual_seed(0)
    model = Tied()
    fused = FusedAccumulation(model, loss, compile=LIGHT)
    plain = model_loss(model, loss)
    parts = batches(3)
    for part in parts:
        plain(part).backward()
    expected = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    seen = []
    for part in parts:
        fused(part).backward()
        seen.append([p.grad for p in model.parameters() if p.requires_grad])
    assert [p.shape for p in fused.params] == [(11, 8), (11,)]      # the tied weight once, the frozen layer not
    assert all(p.grad is None for p in model.frozen.parameters())
    for got, want in zip([p.grad for p in model.parameters()], expected):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # each micro-batch's backward handed over a new sum: nothing was added into the previous gradient in place
    assert all(a is not b for first, later in zip(seen, seen[1:]) for a, b in zip(first, later))


def test_a_step_of_micro_batches_on_it_trains_as_the_plain_step():
    def train(fuse: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = Tied()
        flat = FlatParameters(model, flatten_grads=False)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        compute = FusedAccumulation(model, loss, compile=LIGHT) if fuse else model_loss(model, loss)
        step = TrainStep(model, compute, optimizer, flat, Synchroniser(Solo(), flat), contextlib.nullcontext,
                         clip=1.0, accum=3)
        for x, y in batches(4):
            step((x.repeat(3, 1), y.repeat(3, 1)))
        return [p.detach().clone() for p in model.parameters()]

    trained, plain = train(fuse=True), train(fuse=False)
    assert not torch.equal(plain[0], Tied().embed.weight)
    for got, want in zip(trained, plain):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
