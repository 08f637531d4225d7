"""One run per output: a run holds a lock on what it writes (its checkpoint and its log folder) for
its whole life, so a second run pointed at the same paths is refused at start instead of
interleaving the log and overwriting the checkpoint.

The lock is ``fcntl.flock`` on a small file beside the output (``.model.pt.lock`` beside
``model.pt``, ``.lock`` in the log folder). The kernel drops a flock when its holder's last
descriptor closes, on every exit, SIGKILL included, so a dead run's lock is never stale: the file
may stay, the lock does not. The holder writes its pid into the file, which is how the refusal
names it. flock locks the open file, not the path: a lock file never deleted (we never delete it)
is the same file for every run.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


class InUse(RuntimeError):
    """Another live run holds the lock; the message names its pid and the flag to change."""


def lock_path(output: Path, folder: bool) -> Path:
    """The lock of a file (beside it, hidden) or of a folder (inside it)."""
    return output / ".lock" if folder else output.parent / f".{output.name}.lock"


@contextlib.contextmanager
def hold(files: dict[str, str | None], folders: dict[str, str | None]) -> Iterator[None]:
    """Hold the lock of every output for the duration; ``files`` and ``folders``: flag -> path (None:
    not written). Raises ``InUse`` naming the other run's pid and the flag when one is held by a live
    process."""
    with contextlib.ExitStack() as held:
        for outputs, folder in ((files, False), (folders, True)):
            for flag, path in outputs.items():
                if path:
                    held.enter_context(_locked(flag, lock_path(Path(path), folder), Path(path)))
        yield


@contextlib.contextmanager
def _locked(flag: str, path: Path, output: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise InUse(f"{flag} {output} is in use by another run (pid {holder}); wait for it to end or "
                        f"pass another {flag}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)        # closing drops the lock
