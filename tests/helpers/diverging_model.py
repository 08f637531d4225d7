"""A linear model whose logits turn to NaN from its ``after``-th training forward on: a run that
diverges mid-way, for the tests of the divergence stop. Train.py takes it as ``--model SPEC``."""
from __future__ import annotations

import torch

SPEC = f"{__name__}:model"


class Diverging(torch.nn.Linear):
    def __init__(self, inputs: int, outputs: int, after: int):
        super().__init__(inputs, outputs)
        self.after, self.calls = after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        out = super().forward(x.flatten(1))
        return out * float("nan") if self.calls >= self.after else out


def model(info, after: int = 12) -> Diverging:
    return Diverging(64, info.num_classes, after)
