"""A small model with a BatchNorm layer, whose running statistics are floating-point buffers that the
synchronising modes must keep in step as they keep the parameters. Train.py takes it as ``--model SPEC``."""
from __future__ import annotations

import torch

SPEC = f"{__name__}:model"


def model(info, hidden: int = 32) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.BatchNorm1d(hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, info.num_classes))
