"""Model registry: every factory takes a datasets.DataInfo plus options and returns logits-producing nn.Module."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from harness.plugins import import_factory

from .cnn import cnn
from .gpt import gpt
from .huggingface import hf_causal_lm
from .mlp import mlp, oddeven
from .resnet import resnet18, resnet50

__all__ = ["MODELS", "build_model", "loss_fn", "model_names"]

MODELS: dict[str, Callable[..., torch.nn.Module]] = {
    "cnn": cnn,
    "gpt": gpt,
    "hf-causal-lm": hf_causal_lm,
    "mlp": mlp,
    "oddeven": oddeven,
    "resnet18": resnet18,
    "resnet50": resnet50,
}


def model_names() -> list[str]:
    return sorted(MODELS)


def build_model(name: str, info, **options) -> torch.nn.Module:
    """Build a registered model or a `package.module:factory`, so users plug in models without editing this file."""
    if name in MODELS:
        return MODELS[name](info, **options)
    if ":" in name:
        return import_factory(name, "model", "factory(info, **options)")(info, **options)
    raise ValueError(
        f"unknown model '{name}'; valid names: {', '.join(model_names())}, "
        f"or 'package.module:factory' for a factory(info, **options) of your own"
    )


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dim, so (N, C)/(N,) and (N, T, V)/(N, T) share one code path."""
    return F.cross_entropy(output.flatten(0, -2), target.flatten())
