"""Model registry: every factory takes a datasets.DataInfo plus options and returns logits-producing nn.Module.
Each is imported (with torch) at its first call: the registry's names cost nothing to check."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.plugins import check_call, import_factory, imported_on_call
from harness.spelling import did_you_mean

if TYPE_CHECKING:
    import torch

__all__ = ["MODELS", "build_model", "loss_fn", "model_names"]

MODELS: dict[str, Callable[..., torch.nn.Module]] = {
    "cnn": imported_on_call(f"{__name__}.cnn", "cnn"),
    "gpt": imported_on_call(f"{__name__}.gpt", "gpt"),
    "hf-causal-lm": imported_on_call(f"{__name__}.huggingface", "hf_causal_lm"),
    "mlp": imported_on_call(f"{__name__}.mlp", "mlp"),
    "oddeven": imported_on_call(f"{__name__}.mlp", "oddeven"),
    "resnet18": imported_on_call(f"{__name__}.resnet", "resnet18"),
    "resnet50": imported_on_call(f"{__name__}.resnet", "resnet50"),
}


def model_names() -> list[str]:
    return sorted(MODELS)


def build_model(name: str, info, /, **options) -> torch.nn.Module:
    """Build a registered model or a `package.module:factory`, so users plug in models without editing this file."""
    if name in MODELS:
        return MODELS[name](info, **options)
    if ":" in name:
        import torch
        factory = import_factory(name, "model", "factory(info, **options)")
        check_call(factory, f"--model {name}", "factory(info, **options)", info, **options)
        model = factory(info, **options)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"the factory returned a {type(model).__name__}, not a torch.nn.Module")
        return model
    raise ValueError(unknown(name))


def unknown(name: str) -> str:
    """Why ``name`` names no model, with the closest that it may have meant."""
    return (f"unknown model '{name}'{did_you_mean(name, MODELS)}; valid names: {', '.join(model_names())}, "
            f"or 'package.module:factory' for a factory(info, **options) of your own")


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dim, so (N, C)/(N,) and (N, T, V)/(N, T) share one code path."""
    import torch.nn.functional as F
    return F.cross_entropy(output.flatten(0, -2), target.flatten())
