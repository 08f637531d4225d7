import os
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # models/ and datasets/ are used from the checkout
    sys.path.insert(0, str(ROOT))


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); [] once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait up to timeout s for every pid to disappear; returns those still alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their loader processes, ...), from /proc."""
    parents = {int(entry): int(fields[1]) for entry in os.listdir("/proc")
               if entry.isdigit() and (fields := _stat(entry))}
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


def harness_children(pids) -> list[int]:
    """Those of ``pids`` that are harness children (python -m harness.child), not loader processes."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"harness.child" in f.read():
                    found.append(pid)
        except FileNotFoundError:
            pass
    return found


def kill_quietly(pid: int, sig=signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def has_gpus(n: int = 1) -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.device_count() >= n
    except Exception:
        return False


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """3 classes of 8 training and 2 validation JPEGs (tests that break files work on a copy)."""
    from data_files import make_image_folder
    return make_image_folder(tmp_path_factory.mktemp("images"), classes=3, per_class=8, val_per_class=2)


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """train.bin of 12,000 and val.bin of 2,000 uint16 tokens below 64."""
    from data_files import make_token_files
    return make_token_files(tmp_path_factory.mktemp("tokens"), train_tokens=12_000, val_tokens=2_000, vocab=64)
