"""The old Lua harness's ccNesterov: Nesterov's 1983 accelerated gradient method as a torch optimizer."""

import math
from collections.abc import Callable, Iterable

import torch


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
