"""One run per output: a run holds a lock on what it writes (its checkpoint and its log folder) for
its whole life, so a second run pointed at the same paths is refused instead of interleaving the log and
overwriting the checkpoint: at its start where the first holds the lock already (``refuse_if_held``, which creates
nothing), else once its checks passed and it takes the lock itself (``hold``).

The lock is ``fcntl.flock`` on a small file beside the output (``.model.pt.lock`` beside
``model.pt``, ``.lock`` in the log folder). The kernel drops a flock when its holder's last
descriptor closes, on every exit, SIGKILL included, so a dead run's lock is never stale: the file
may stay, the lock does not. The holder writes its pid into the file, which is how the refusal
names it. flock locks the open file, not the path: a lock file never deleted (we never delete it)
is the same file for every run.

``check_writable`` proves a checkpoint's folder takes files before anything trains, without torch: the
parent probes it (its lock goes there; in async mode it writes the checkpoint) and so does rank 0, which
writes it in the other modes, from its own host (harness/training/checks.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar


PID_WIDTH = 10         # the pid is written at a fixed width in one write, over whatever an earlier holder left
HOLDER_WAIT = 2.0
T = TypeVar("T")


class InUse(RuntimeError):
    """Another live run holds the lock; the message names its pid (``holder``) and the flag to change."""

    def __init__(self, message: str, holder: str = "unknown"):
        super().__init__(message)
        self.holder = holder


class NotWritable(ValueError):
    """A checkpoint path that cannot be written; the message names the path and the fix."""


def lock_path(output: Path, folder: bool) -> Path:
    """The lock of a file (beside it, hidden) or of a folder (inside it)."""
    return output / ".lock" if folder else output.parent / f".{output.name}.lock"


@contextlib.contextmanager
def hold(files: dict[str, str | None], folders: dict[str, str | None]) -> Iterator[None]:
    """Hold the lock of every output for the duration; ``files`` and ``folders``: flag -> path (None:
    not written). Raises ``InUse`` naming the other run's pid and the flag when one is held by a live
    process."""
    with contextlib.ExitStack() as held:
        for flag, path, output in _locks(files, folders):
            held.enter_context(_locked(flag, path, output))
        yield


def refuse_if_held(files: dict[str, str | None], folders: dict[str, str | None]) -> None:
    """``InUse`` at once where a live run holds one of these locks, creating nothing: a run takes its own (``hold``)
    only once its checks passed, so that one they refuse leaves no folder, and this refuses the common case (a
    second run on a live one's outputs) before it starts anything; ``hold`` refuses one that came in between.
    The refusal names every output held, so that one change of flags gets past it."""
    held = []
    for flag, path, output in _locks(files, folders):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            _take(fd, flag, output)
        except InUse as e:
            held.append((flag, output, e.holder))
        finally:
            os.close(fd)
    if held:
        raise _in_use(held)


def _in_use(held: list[tuple[str, Path, str]]) -> InUse:
    """The refusal of the (flag, output, holder's pid) held by live runs, in one line."""
    return InUse(" and ".join(f"{flag} {output}" for flag, output, _ in held)
                 + f" {'is' if len(held) == 1 else 'are'} in use by another run (pid "
                 + ", ".join(dict.fromkeys(holder for _, _, holder in held)) + "); wait for it to end or pass "
                 + " and ".join(f"another {flag}" for flag, _, _ in held), held[0][2])


def _locks(files: dict[str, str | None], folders: dict[str, str | None]) -> Iterator[tuple[str, Path, Path]]:
    """(flag, lock file, output) of each output that is written."""
    for outputs, folder in ((files, False), (folders, True)):
        for flag, path in outputs.items():
            if path:
                yield flag, lock_path(Path(path), folder), Path(path)


def _take(fd: int, flag: str, output: Path) -> None:
    """flock the open lock file, or ``InUse`` naming its live holder."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use([(flag, output, _holder(fd))]) from None


@contextlib.contextmanager
def _locked(flag: str, path: Path, output: Path) -> Iterator[None]:
    fd = _made_in(path.parent, lambda: os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
    try:
        _take(fd, flag, output)
        os.pwrite(fd, f"{os.getpid():>{PID_WIDTH}}\n".encode(), 0)
        yield
    finally:
        os.close(fd)        # closing drops the lock


def _made_in(folder: Path, make: Callable[[], T], tries: int = 3) -> T:
    """``make()``, which creates a file in ``folder``, with the folder made where missing. Another run's probe
    (``check_writable``) may remove a folder it made between our mkdir and ``make``: then it is made again."""
    for _ in range(tries - 1):
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            return make()
    folder.mkdir(parents=True, exist_ok=True)
    return make()


def _holder(fd: int) -> str:
    """The live pid the lock file names. The holder writes its pid just after it takes the lock, so a run
    that comes in between reads nothing yet, or a dead run's pid: it reads again until a live one is
    there (microseconds after the lock, in practice), for at most HOLDER_WAIT s."""
    deadline = time.monotonic() + HOLDER_WAIT
    while True:
        text = os.pread(fd, PID_WIDTH + 1, 0).decode(errors="replace").strip()
        if text.isdigit() and alive(int(text)) or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether a process with this pid runs (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # another user's live process
        return True
    return True


def check_writable(path: str | os.PathLike) -> None:
    """Fail before training starts if a checkpoint could not be saved at path (a file path).

    Creates the directory if needed and writes a probe file, because permission bits lie (root ignores
    them) and only an actual write proves the directory accepts files. The folders it made are removed
    again: a run that its checks then refuse leaves nothing behind (its lock, taken once they passed, makes
    them for good).
    """
    path = Path(path)
    if path.is_dir():
        raise NotWritable(f"checkpoint path {path} is a directory; give a file path inside it")
    made = [folder for folder in path.parents if not folder.exists()]
    try:
        fd, probe = _made_in(path.parent, lambda: tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                                                   suffix=".probe"))
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise NotWritable(
            f"checkpoint directory {path.parent} cannot be created or written ({error}); "
            "choose a writable location"
        ) from error
    finally:
        for folder in made:         # innermost first; one that another process filled meanwhile stays
            with contextlib.suppress(OSError):
                folder.rmdir()
