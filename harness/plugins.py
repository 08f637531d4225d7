"""``package.module:factory`` names, the way users plug their own models and datasets in; registries'
factories imported at their first call; a child's preloads imported ahead of its work."""
from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import inspect
import os
from typing import Any, Callable, Iterable

from harness.spelling import did_you_mean

FIND_IT = "run from the folder that holds it, or add that folder to PYTHONPATH (PYTHONPATH=/path/to/folder python ...)"


def find_in_working_folder() -> None:
    """Put the folder Train.py or Test.py runs in last on sys.path, where ``python -m`` would put it first: a
    user's module in that folder is found by its name (``--model my_model:make``) wherever the script lives,
    and never shadows an installed package. The workers are handed this path (harness/control/spawn.py). The
    commands do it, not their ``main``: a process that calls ``main`` from folder after folder (a test session)
    would grow its path at each, and every new path is a new zygote (harness/launch/zygote.py: AT_IMPORT)."""
    import sys
    here = os.getcwd()
    if here not in [os.path.abspath(p or ".") for p in sys.path]:
        sys.path.append(here)


def import_factory(spec: str, what: str, signature: str) -> Callable[..., Any]:
    """The callable ``spec`` names; a ValueError that says how to fix the name otherwise."""
    _refuse_unnamed(spec, what)
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise _cannot_import(spec, what, e) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(_no_callable(module, attr, signature))
    return factory


def _refuse_unnamed(spec: str, what: str) -> None:
    """A ValueError where ``spec`` names no function after a colon: ``pkg.module.fn`` was imported as a module
    ``pkg.module.fn`` and refused with advice about the path, and ``pkg.module:`` as a missing callable ''."""
    module_name, colon, attr = spec.partition(":")
    if colon and attr:
        return
    head, dot, tail = module_name.rpartition(".")
    guess = f" (did you mean '{head}:{tail}'?)" if dot and not colon else ""
    raise ValueError(f"{what} {spec!r} names no function: give 'package.module:function', a colon before the "
                     f"function's name{guess}")


def check_call(factory: Callable[..., Any], what: str, signature: str, /, *args: Any, **kwargs: Any) -> None:
    """A ValueError naming ``what`` and the call the harness makes (``signature``) where ``factory`` cannot take
    these arguments: a factory of the wrong shape otherwise failed with Python's bare "takes 0 positional
    arguments but 2 were given", which names neither. One without a signature to read is left to its call."""
    try:
        shape = inspect.signature(factory)
    except ValueError:
        return
    try:
        shape.bind(*args, **kwargs)
    except TypeError as e:
        raise ValueError(f"{what} cannot be called as {signature}: {e}{_closest_option(kwargs, shape.parameters)}") \
            from None


def _closest_option(kwargs: dict[str, Any], taken: Iterable[str]) -> str:
    """' (did you mean 'width'?)' where an option the factory does not take is close to one it does."""
    for key in kwargs:
        guess = did_you_mean(key, taken) if key not in taken else ""
        if guess:
            return guess
    return ""


def _no_callable(module: Any, attr: str, signature: str) -> str:
    """Why ``module`` has no callable ``attr``, with the fix: a factory in the running script, another module of
    the same name found before the user's file, or simply a name missing from it."""
    name, where = module.__name__, getattr(module, "__file__", None)
    if name == "__main__":
        return (f"'__main__:{attr}' names the running script, which the workers do not run: put {attr} in a "
                f"module file (e.g. my_factories.py) and give 'my_factories:{attr}'")
    own = os.path.abspath(f"{name.replace('.', os.sep)}.py")
    if os.path.isfile(own) and where and os.path.abspath(where) != own:
        return (f"module '{name}' has no callable '{attr}': it is {where}, which comes before your {own} on the "
                f"path; rename your file (e.g. my_{name.rpartition('.')[2]}.py) and the name with it")
    return (f"module '{name}' has no callable '{attr}' ({where}); give 'package.module:factory' naming a "
            f"function {signature} there")


def check_findable(spec: str, what: str) -> None:
    """``import_factory``'s error where the module of ``spec`` cannot be found, found without importing it: Train.py's
    parent checks --loss so, and leaves the import (of torch, often) to rank 0's checks."""
    _refuse_unnamed(spec, what)
    module_name = spec.partition(":")[0]
    why = _not_found(module_name)
    if why is not None:
        raise _cannot_import(spec, what, why or f"No module named '{module_name}'")


def _cannot_import(spec: str, what: str, reason: object) -> ValueError:
    module = spec.partition(":")[0]
    if module.endswith(".py"):
        return ValueError(f"{what} '{spec}' names a file: give the module's name without .py, "
                          f"'{module.removesuffix('.py')}:{spec.partition(':')[2]}'")
    return ValueError(f"cannot import module '{module}' for {what} '{spec}': {reason}; {FIND_IT}")


def _not_found(module: str) -> str | None:
    """None when ``module`` can be found here (without importing it); else find_spec's error, or "" when it simply
    finds nothing."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:
        return str(e)
    return None if found is not None else ""


def unimportable(spec: str, what: str) -> str | None:
    """Why the module of a ``package.module:factory`` name cannot be imported here, with the fix; None
    when it can (or ``spec`` is a registry name). A checkpoint names its model's module: a run started
    elsewhere (another folder, another PYTHONPATH) may not see it."""
    if ":" not in spec:
        return None
    module = spec.partition(":")[0]
    why = _not_found(module)
    if why is None:
        return None
    reason = f" ({why})" if why else ""
    return f"the {what} '{spec}' comes from module '{module}', which cannot be imported here{reason}; {FIND_IT}"


def imported_on_call(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported at its first call. The model and dataset registries list their factories this
    way: checking a name imports nothing (Train.py's parent checks names and never imports torch)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call


def preload(modules: Iterable[str]) -> None:
    """Import ``modules`` ahead of the work that needs them, passing over any that fails (the work that needs it
    raises the error itself, to the parent).

    The garbage collector is paused meanwhile, then what exists is frozen out of its reach (``gc.freeze``): torch
    and its compiler make about a million objects that live as long as the process, and the collections that
    would walk them as they are made cost an eighth of the import's CPU. Frozen, they are never walked again,
    neither here nor in a child the zygote forks from here, whose memory pages they then leave shared."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        for module in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(module)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
