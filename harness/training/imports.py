"""Imports a process will need soon, made in a thread while it does something else first.

Python holds the GIL while it imports, but torch's kernels let go of it: an import overlaps a model
built on the CPU, or a parent that only waits for its workers. Where the other thread imports the same
modules meanwhile (a worker's optimizer imports torch._dynamo, which Inductor imports too), it waits for
them rather than importing them twice. The thread is not a daemon: an exit waits for the import to end
rather than tearing the interpreter down under it. Start it after the process has forked what it forks
(a child forked mid-import inherits the import's locks held).
"""
from __future__ import annotations

import importlib
import threading


def import_meanwhile(modules: tuple[str, ...], name: str) -> threading.Thread:
    """Start importing ``modules`` in a thread called ``name``; ``join()`` it before their first use, which
    raises what an import raised (the thread keeps quiet about it)."""
    thread = threading.Thread(target=_import, args=(modules,), name=name)
    thread.start()
    return thread


def _import(modules: tuple[str, ...]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:       # the first real use imports it again and raises, in its own thread
            return
