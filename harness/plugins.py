"""``package.module:factory`` names, the way users plug their own models and datasets in."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def import_factory(spec: str, what: str, signature: str) -> Callable[..., Any]:
    """The callable ``spec`` names; a ValueError that says how to fix the name otherwise."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module '{module_name}' for {what} '{spec}': {e}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"module '{module_name}' has no callable '{attr}'; give 'package.module:factory' "
                         f"naming a function {signature} there")
    return factory
