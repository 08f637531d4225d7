"""The run configuration a checkpoint holds, read without torch: what ``Train.py --resume`` needs before it forks.

A checkpoint is a ``torch.save`` zip archive whose pickle (``<archive>/data.pkl``) holds every tensor as a
reference to a storage record beside it. The parent needs only the ``config`` entry, which the writer keeps to
plain values (harness/resilience/checkpoint.py: ``_check_plain``), so it reads that pickle alone, with an
unpickler that resolves no global: torch's classes and functions, and anything else, become inert
``Opaque`` stand-ins and storages become None. Nothing in the file is imported or called, and no tensor is read.
Importing torch would cost the parent 2 s or more before the workers' start; the workers' loading of the
whole file (rank 0's checks) still finds what this cannot, such as a truncated storage.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

__all__ = ["CheckpointError", "read_config"]


class CheckpointError(ValueError):
    """A checkpoint path that cannot be read or written; the message names the path and the problem."""


class Opaque:
    """Whatever a global of the pickle stood for (a tensor, a dtype, a storage class): taken, never used."""

    def __init__(self, *args: object, **kwargs: object):
        pass

    def __setstate__(self, state: object) -> None:
        pass


class Mapping(dict):
    """An OrderedDict of the file (a state dict), which may carry attributes (torch's ``_metadata``)."""


PLAIN = {("collections", "OrderedDict"): Mapping, ("builtins", "set"): set, ("builtins", "frozenset"): frozenset}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) == ("_codecs", "encode"):      # how protocol 2 writes bytes
            return lambda text, encoding="latin1": text.encode(encoding)
        return PLAIN.get((module, name), Opaque)

    def persistent_load(self, pid: object) -> None:
        return None


def read_config(path: str | os.PathLike) -> dict:
    """The ``config`` dict of the checkpoint at ``path``; CheckpointError names the path and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a file; check the path")
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = next((n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if pickled is None:
                raise ValueError("no data.pkl in the archive")
            with archive.open(pickled) as stream:
                state = _Unpickler(stream).load()
    except Exception as error:          # a zip that is not one, a pickle cut short or of another shape
        raise CheckpointError(f"checkpoint {path} is not a readable checkpoint: {error}") from error
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise CheckpointError(f"checkpoint {path} holds no run configuration; was it written by Train.py?")
    return state["config"]
