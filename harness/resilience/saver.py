"""Checkpoints written in the background, so that saving every few hundred updates costs nothing.

``save(path, state)`` takes a snapshot of every tensor in ``state`` and returns: on a GPU the
snapshot is an asynchronous copy into pinned host buffers, kept from one save to the next; on the
CPU, a clone (none with ``copy=False``: the caller gives ``state`` away). A thread then waits for the copy, writes the file (harness/resilience/checkpoint.py: temporary
file, fsync, atomic rename, so a crash mid-write leaves the previous checkpoint whole) and calls
``done``. Never two writes at once: a save waits for the one before it, which also makes reusing
the host buffers safe. ``wait()`` returns once the last write is on disk and raises its error.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import torch

from .checkpoint import save_checkpoint


class BackgroundSaver:
    def __init__(self, copy: bool = True) -> None:
        self.copy = copy
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pinned: dict[tuple, torch.Tensor] = {}      # host buffers of GPU tensors, by their place in the state

    def save(self, path: str | os.PathLike, state: dict, done: Callable[[], None] = lambda: None,
             given: tuple[str, ...] = ()) -> None:
        """Snapshot ``state`` and write it in the background. ``given``: keys of ``state`` whose values the caller
        gives away (host copies made for this save, which nothing else changes): written as they are, not copied."""
        self.wait()
        copied = torch.cuda.Event() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        snapshot = {k: v if k in given else self._snapshot(v, (k,)) for k, v in state.items()} if self.copy else state
        if copied is not None:
            copied.record()
        self._thread = threading.Thread(target=self._write, args=(path, snapshot, copied, done),
                                        name="harness-saver", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    close = wait

    def _snapshot(self, value: Any, place: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type != "cuda":
                return value.detach().clone()
            host = self._pinned.get(place)
            if host is None or host.shape != value.shape or host.dtype != value.dtype:
                host = self._pinned[place] = torch.empty_like(value, device="cpu", pin_memory=True)
            return host.copy_(value.detach(), non_blocking=True)
        if isinstance(value, dict):
            return {k: self._snapshot(v, (*place, k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._snapshot(v, (*place, i)) for i, v in enumerate(value))
        return value

    def _write(self, path: str | os.PathLike, snapshot: dict, copied: Any, done: Callable[[], None]) -> None:
        try:
            if copied is not None:
                copied.synchronize()
            save_checkpoint(path, snapshot)
            done()
        except BaseException as error:       # raised in the training thread by the next save or wait()
            self._error = error
