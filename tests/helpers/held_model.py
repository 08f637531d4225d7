"""A registry model (``mlp`` by default) whose training forward ``hold_at`` waits until a ``gate`` file exists:
a test signals the run there and then opens the gate, so the signal lands mid-run however fast the machine is
(an unheld run of a few hundred small updates can end before a signal sent at its first report arrives).
The hold is a forward pre-hook: the model's parameters and arithmetic are the registry's, so a run of it
equals one of the plain model. Train.py takes it as ``--model SPEC --model-options '{"hold_at": N, "gate":
PATH}'`` (its workers import it from the checkout, which is on their ``sys.path``)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

SPEC = f"{__name__}:model"


class Hold:
    """The pre-hook: counts its module's training forwards, and waits at forward ``at`` for ``gate``."""

    def __init__(self, at: int, gate: str):
        self.at, self.gate, self.forwards = at, gate, 0

    def __call__(self, module: torch.nn.Module, _args: tuple) -> None:
        self.forwards += module.training
        while module.training and self.forwards == self.at and not os.path.exists(self.gate):
            time.sleep(0.02)


def model(info, hold_at: int, gate: str, name: str = "mlp", **options) -> torch.nn.Module:
    """The registry's ``name`` built with ``options``, held at its training forward ``hold_at`` (each worker's,
    counted from 1) until ``gate`` exists."""
    from harness.checkout.models import build_model
    built = build_model(name, info, **options)
    built.register_forward_pre_hook(Hold(hold_at, gate))
    return built


def flags(gate: Path, hold_at: int, name: str = "mlp", **options) -> list[str]:
    """Train.py's flags for ``name`` built with ``options``, held at ``hold_at`` until ``gate`` exists."""
    return ["--model", SPEC, "--model-options",
            json.dumps({"hold_at": hold_at, "gate": str(gate), "name": name, **options})]
