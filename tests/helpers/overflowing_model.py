"""A linear model whose gradients are infinite on chosen training forwards (the ``at`` list, counting
from 1) while its output stays finite: an overflow that loss scaling must skip, for the tests of
--amp fp16. The count is a buffer, so a checkpoint keeps it and a resumed run overflows where the
uninterrupted one did. ``delay``: seconds each training forward sleeps, so that a short run lasts long
enough for progress records (one every 0.5 s). Train.py takes it as ``--model SPEC``."""
from __future__ import annotations

import time

import torch

SPEC = f"{__name__}:model"


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; backward, every gradient times infinity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class Overflowing(torch.nn.Linear):
    def __init__(self, inputs: int, outputs: int, at: list[int], delay: float = 0.0):
        super().__init__(inputs, outputs)
        self.at, self.delay = set(at), delay
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x.flatten(1))
        if not self.training:
            return out
        self.calls += 1
        time.sleep(self.delay)
        return InfiniteGradient.apply(out) if int(self.calls) in self.at else out


def model(info, at: list[int] = (5,), delay: float = 0.0) -> Overflowing:
    return Overflowing(64, info.num_classes, list(at), delay)
