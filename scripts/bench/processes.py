"""The processes of a benchmarked command, read from /proc: its tree, their memory, and ending them.

scripts/bench/data.py samples a running command's workers' memory and ends a command that runs past
its time limit, with every descendant: torchrun puts its workers in sessions of their own, so
signalling the process group alone would miss them.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def proc(pid: int, name: str) -> str:
    """/proc/PID/NAME, or '' once the process is gone."""
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (1: parent pid, 19: start time)."""
    return proc(pid, "stat").rsplit(")", 1)[-1].split()


def process_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        if fields := stat(pid):
            children.setdefault(int(fields[1]), []).append(pid)
    return children


def subtree(pid: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], [pid]
    while stack:
        found.append(stack.pop())
        stack += children.get(found[-1], [])
    return found


def pss_kb(pid: int) -> tuple[int, int]:
    """(Pss, Pss_File) of a process in kB, from /proc/PID/smaps_rollup; zeros once it is gone."""
    fields = dict(line.split()[:2] for line in proc(pid, "smaps_rollup").splitlines() if line.startswith("Pss"))
    return int(fields.get("Pss:", 0)), int(fields.get("Pss_File:", 0))


def worker_pss_mb(root: int, marker: str) -> tuple[float, float]:
    """The largest worker's PSS with its descendants (its data-loader processes), and the part of it
    that is file pages (a memory-mapped file: page cache, not copies). Workers are the topmost
    processes below `root` whose command line holds `marker` (forked loaders inherit it)."""
    children = process_children()
    workers, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if marker in proc(pid, "cmdline").replace("\0", " "):
            workers.append(pid)
        else:
            stack += children.get(pid, [])
    totals = [tuple(map(sum, zip(*(pss_kb(p) for p in subtree(w, children))))) for w in workers]
    return tuple(kb / 1024 for kb in max(totals, default=(0, 0)))


def kill_tree(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s, to the process group and every descendant (torchrun puts
    its workers in sessions of their own, so the group alone would miss them). A descendant is
    signalled only while its start time is the one seen first, so a reused pid is left alone."""
    started = {pid: stat(pid)[19:20] for pid in subtree(process.pid, process_children())}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        for pid in (pid for pid, start in started.items() if start and stat(pid)[19:20] == start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
