"""Processes seen through /proc: whether one is alive, waiting for some to be gone, what runs below
a process, and which of those are harness children. The tests' proof that nothing is left behind."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, session, ...); [] once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait up to timeout s for every pid to disappear; returns those still alive."""
    pids = list(pids)
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


def in_session(session: int) -> list[int]:
    """The live processes of ``session`` but its leader (zombies aside: dead, they wait only for a
    parent to reap them, which a container's first process may never do)."""
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and int(entry) != session and (fields := _stat(entry))
            and len(fields) > 3 and int(fields[3]) == session and fields[0] != "Z"]


def harness_children(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that are harness children, not loader processes nor zygotes: forked by a
    zygote (a remote host's session's too), a child names itself "harness.child" (/proc/PID/comm); a fresh
    one is ``python -m harness.child`` (its command line)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", "rb") as comm, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if comm.read().strip() == b"harness.child" or b"-m\0harness.child" in cmdline.read():
                    found.append(pid)
        except FileNotFoundError:
            pass
    return found


def harness_children_below(pid: int) -> list[int]:
    """The harness children among every live process below ``pid``: its workers, not zygotes or loaders."""
    return harness_children(descendants(pid))


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` (a negative pid: its process group), which may be gone already."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_session(leader: int) -> list[int]:
    """SIGKILL a process started in a session of its own and everything still in that session (its
    workers, their loaders); returns the pids killed besides the leader."""
    left = in_session(leader)
    kill_quietly(-leader)
    for pid in left:
        kill_quietly(pid)
    return left
