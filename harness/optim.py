"""Optimizer registry, including the old Lua harness's accelerated Nesterov method."""

import math
from collections.abc import Callable, Iterable

import torch

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw", "adagrad", "adadelta", "ccnesterov")

_TORCH_OPTIMIZERS = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
}


def build_optimizer(
    name: str,
    params: Iterable,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> torch.optim.Optimizer:
    """Build `name`; options it would ignore are refused, so a run never silently lacks a requested setting."""
    check_options(name, lr, momentum, weight_decay, nesterov)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if name == "ccnesterov":
        return CCNesterov(params, lr=lr, weight_decay=weight_decay)
    return _TORCH_OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay)


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


def _next_lambda(lam: float) -> float:
    return (1 + math.sqrt(1 + 4 * lam * lam)) / 2


class CCNesterov(torch.optim.Optimizer):
    """Nesterov's 1983 accelerated gradient method, as in the old harness's ccNesterov.lua.

    With lambda_0 = 0, lambda_s = (1 + sqrt(1 + 4 lambda_{s-1}^2)) / 2 and
    gamma_s = (1 - lambda_s) / lambda_{s+1}, each step does
        y_{s+1} = x_s - lr * grad f(x_s)
        x_{s+1} = (1 - gamma_s) y_{s+1} + gamma_s y_s,      y_1 = x_1,
    so the first step is plain gradient descent (gamma_1 = 0) and later steps
    overshoot along y_{s+1} - y_s. For smooth convex f, f(y_s) - f* = O(1 / s^2).
    Per-parameter state: "lambda" (lambda_s of the last step) and "y" (y_s).
    Weight decay adds weight_decay * x to the gradient (L2, as in torch SGD).
    """

    graph_safe = False   # lambda lives on the host: a CUDA graph would replay its first value forever

    def __init__(self, params: Iterable, lr: float, weight_decay: float = 0.0) -> None:
        if lr <= 0:
            raise ValueError(f"lr={lr} is invalid; use a learning rate > 0")
        if weight_decay < 0:
            raise ValueError(f"weight_decay={weight_decay} is invalid; use weight_decay >= 0")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group["lr"], group["weight_decay"])
        return loss

    def _update(self, p: torch.Tensor, lr: float, weight_decay: float) -> None:
        state = self.state[p]
        if not state:
            state["lambda"] = 0.0
            state["y"] = p.detach().clone()
        lam = _next_lambda(state["lambda"])
        gamma = (1 - lam) / _next_lambda(lam)
        grad = p.grad.add(p, alpha=weight_decay) if weight_decay else p.grad
        y_next = p.add(grad, alpha=-lr)
        p.copy_(torch.lerp(y_next, state["y"], gamma))  # (1 - gamma) * y_next + gamma * y
        state["y"] = y_next
        state["lambda"] = lam
