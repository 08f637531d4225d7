"""Optimizer registry, including the old Lua harness's accelerated Nesterov method (ccnesterov.py).

The names and the checks need no torch: Train.py's parent reads its flags before it imports torch,
so that the workers, started at once, import it while the parent does.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw", "adagrad", "adadelta", "ccnesterov")


def build_optimizer(
    name: str,
    params: Iterable,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> torch.optim.Optimizer:
    """Build `name`; options it would ignore are refused, so a run never silently lacks a requested setting."""
    import torch

    from .ccnesterov import CCNesterov
    check_options(name, lr, momentum, weight_decay, nesterov)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if name == "ccnesterov":
        return CCNesterov(params, lr=lr, weight_decay=weight_decay)
    others = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adagrad": torch.optim.Adagrad,
              "adadelta": torch.optim.Adadelta}
    return others[name](params, lr=lr, weight_decay=weight_decay)


def check_options(name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                  nesterov: bool = False) -> None:
    """What build_optimizer refuses, without building one: the first optimizer a process builds
    imports torch._dynamo (about 1.8 s), which a parent that only checks the flags need not pay."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; valid names: {', '.join(OPTIMIZERS)}")
    if lr <= 0:
        raise ValueError(f"lr={lr} is invalid; use a learning rate > 0")
    if name != "sgd" and (momentum or nesterov):
        raise ValueError(
            f"momentum={momentum}, nesterov={nesterov} apply only to sgd, not '{name}'; drop them or use sgd"
        )
    if momentum < 0 or weight_decay < 0:
        raise ValueError(f"momentum={momentum}, weight_decay={weight_decay}: neither may be negative")
    if nesterov and momentum <= 0:
        raise ValueError(f"nesterov needs momentum > 0, got momentum={momentum}; set momentum (e.g. 0.9)")
