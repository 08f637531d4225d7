"""Optimizer registry, including the old Lua harness's accelerated Nesterov method (ccnesterov.py).

Each torch optimizer comes in up to three implementations of the same arithmetic: a loop over
parameters, ``foreach`` (one multi-tensor kernel per operation over all parameters) and ``fused``
(one kernel for the whole update). ``impl=None`` picks the fastest one torch has for the optimizer:
fused where it exists (SGD, Adam, AdamW, Adagrad), else foreach. Measured: AdamW on 12M CPU
parameters, 11 ms fused vs 86 ms foreach; the GPU figures are in bench/results/.

The names and the checks need no torch: Train.py's parent checks its flags without it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from harness.spelling import did_you_mean

if TYPE_CHECKING:
    import torch

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw", "adagrad", "adadelta", "ccnesterov")
IMPLS: tuple[str, ...] = ("fused", "foreach")
FUSED: tuple[str, ...] = ("sgd", "adam", "adamw", "adagrad")       # the optimizers torch has fused kernels for


def build_optimizer(
    name: str,
    params: Iterable,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    impl: str | None = None,
) -> torch.optim.Optimizer:
    """Build `name`; options it would ignore are refused, so a run never silently lacks a requested setting.
    ``impl``: "fused" or "foreach" (None: the fastest there is for `name`; see the module's docstring)."""
    import torch

    from .ccnesterov import CCNesterov
    check_options(name, lr, momentum, weight_decay, nesterov, impl)
    if name == "ccnesterov":
        return CCNesterov(params, lr=lr, weight_decay=weight_decay)
    kernels = {"fused": True} if (impl or default_impl(name)) == "fused" else {"foreach": True}
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                               **kernels)
    others = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adagrad": torch.optim.Adagrad,
              "adadelta": torch.optim.Adadelta}
    return others[name](params, lr=lr, weight_decay=weight_decay, **kernels)


def default_impl(name: str) -> str | None:
    """The implementation ``impl=None`` builds: None for ccnesterov, which has only its own."""
    return None if name == "ccnesterov" else "fused" if name in FUSED else "foreach"


def check_options(name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                  nesterov: bool = False, impl: str | None = None) -> None:
    """What build_optimizer refuses, without building one: the first optimizer a process builds
    imports torch._dynamo (about 1.8 s), which a parent that only checks the flags need not pay."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'{did_you_mean(name, OPTIMIZERS)}; valid names: "
                         f"{', '.join(OPTIMIZERS)}")
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"unknown optimizer implementation '{impl}'{did_you_mean(impl, IMPLS)}; valid names: "
                         f"{', '.join(IMPLS)}")
    if impl == "fused" and name not in FUSED:
        raise ValueError(f"torch has no fused {name}; fused optimizers: {', '.join(FUSED)} (or drop "
                         "--optimizer-impl for the fastest implementation there is)")
    if impl is not None and name == "ccnesterov":
        raise ValueError(f"ccnesterov has a single implementation; drop --optimizer-impl {impl}")
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


# What a resumed run's optimizer keeps of its own groups over the checkpoint's: the implementation, and what
# Train.py's flags set (a --resume may change them; the lr is the device tensor a graph reads where it is one).
THIS_RUNS = ("foreach", "fused", "capturable", "lr", "momentum", "weight_decay", "nesterov")


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """``optimizer.load_state_dict(saved)``, keeping this run's implementation and settings (THIS_RUNS). torch
    takes every group setting from the saved state, so a checkpoint written by a foreach run would resume as
    foreach whatever --optimizer-impl says, and a --resume with another --lr would train with the saved one
    (a schedule sets the rate at every update anyway, from the run's --lr); and a fused or capturable update
    wants its step count on the parameters' device, in float32, where a CPU-written checkpoint has it on the host.
    Host tensors are copied: torch keeps a tensor already on the right device as the state itself, and one of a
    memory-mapped checkpoint would keep the file mapped (its disk space held after the next save replaces it)."""
    import torch

    kept = [{k: group[k] for k in THIS_RUNS if k in group} for group in optimizer.param_groups]
    state = {key: {name: value.clone() if torch.is_tensor(value) and value.device.type == "cpu" else value
                   for name, value in values.items()} for key, values in saved["state"].items()}
    optimizer.load_state_dict({**saved, "state": state})
    for group, settings in zip(optimizer.param_groups, kept):
        group.update(settings)
        if settings.get("fused") or settings.get("capturable"):
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(param.device, torch.float32)


def rate_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Make each group's learning rate a tensor on its parameters' device where the optimizer reads it
    from there (fused kernels); returns whether it did. A CUDA graph then replays the update with
    whatever rate ``set_lr`` wrote last, so schedules and warm-up run inside the graph."""
    import torch
    if not all(group.get("fused") for group in optimizer.param_groups):
        return False
    for group in optimizer.param_groups:
        if not torch.is_tensor(group["lr"]):
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=group["params"][0].device)
    return True


def set_lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    """The learning rate of every group: written into the device tensor (no synchronisation) or set."""
    import torch
    for group in optimizer.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def zero_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Give a fused SGD with momentum zeroed momentum buffers where it has none yet. Its first step
    makes them with ``torch.empty_like`` and writes them only if the step is not skipped, so a first
    update skipped through ``found_inf`` (an fp16 overflow, common as the scale starts high, or an
    attempt a heal Ticket voids) would leave uninitialised memory, NaN measured, for the next update
    to read as momentum. Zeros are what a first step computes from:
    without dampening (Train.py sets none) 0.9 * 0 + g is g, as torch's first step makes it."""
    import torch
    for group in optimizer.param_groups:
        if isinstance(optimizer, torch.optim.SGD) and group.get("fused") and group["momentum"]:
            for param in group["params"]:
                state = optimizer.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
