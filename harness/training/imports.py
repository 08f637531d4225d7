"""Imports a process will need soon, made in a thread while it does something else first.

Python holds the GIL while it imports, but torch's kernels let go of it: an import overlaps a model
built on the CPU, or a parent that only waits for its workers. The thread is not a daemon: an exit
waits for the import to end rather than tearing the interpreter down under it. Start it after the
process has forked what it forks (a child forked mid-import inherits the import's locks held).
"""
from __future__ import annotations

import importlib
import threading


def import_meanwhile(modules: tuple[str, ...], name: str) -> threading.Thread:
    """Start importing ``modules`` in a thread called ``name``; ``join()`` it before their first use."""
    thread = threading.Thread(target=lambda: [importlib.import_module(m) for m in modules], name=name)
    thread.start()
    return thread
