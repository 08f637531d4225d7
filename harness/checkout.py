"""The checkout's own top-level packages, ``datasets/`` and ``models/``, as ``harness.checkout.*``.

Only ``harness`` is installed; ``models/`` and ``datasets/`` live beside it in the checkout (the
layout is fixed by the design). Importing them by their bare names would put our ``datasets`` in
the place of Hugging Face's package of that name, which is how most users get their data. So the
harness never uses the bare names: this module is a package whose ``__path__`` is the checkout,
and ``harness.checkout.datasets`` is our registry, whatever else is installed.

The bare names still belong to the user. ``install()`` (run when ``harness`` is imported, in the
parent and in every child) puts one finder in front of ``sys.meta_path`` for the two names
``datasets`` and ``models``: it looks everywhere on ``sys.path`` except the checkout, so a user's
factory module that says ``from datasets import load_dataset`` gets Hugging Face's package when it is
installed, and ``--model models:make`` a ``models.py`` of the user's own in the working folder. When
no other exists, the finder steps aside and the checkout's is found as before.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Makes harness.checkout.datasets and harness.checkout.models importable, from the checkout only: a
# harness installed without its checkout (pip install . rather than -e) would otherwise find
# site-packages' datasets, Hugging Face's, under our name.
__path__ = [str(ROOT)] if (ROOT / "datasets" / "sharding.py").is_file() else []

SHADOWED = ("datasets", "models")


class _PreferTheUsers(importlib.abc.MetaPathFinder):
    """Finds the bare ``datasets`` and ``models`` anywhere but the checkout; None (so the usual search runs) if
    absent."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in SHADOWED:
            return None
        elsewhere = [p for p in sys.path if _resolved(p) != ROOT]
        return importlib.machinery.PathFinder.find_spec(fullname, elsewhere)


def _resolved(entry: str) -> Path:
    try:
        return Path(entry or os.getcwd()).resolve()
    except OSError:
        return Path(entry)


def install() -> None:
    if not any(isinstance(finder, _PreferTheUsers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PreferTheUsers())
