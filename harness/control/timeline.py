"""Start-up timelines: when each process of a run reached each phase of its start.

A run's first step waits for the slowest of many serial-looking things: the parent's interpreter
and imports, its checks, each child's interpreter and imports, the data, the model, the
communicator (NCCL's rendezvous) and the first step itself. Each process marks wall-clock times
(``time.time()``, comparable across processes on one host) into a plain dict; the worker returns
its marks, the parent writes them all as one ``startup`` record in metrics.jsonl, and
``scripts/startup_timeline.py`` prints them side by side.
"""
from __future__ import annotations

import os
import time


def process_started_at(pid: int | str = "self") -> float | None:
    """When a process was created (its interpreter's start), from /proc; None where that is unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])        # field 22: start time since boot
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)   # /proc/stat's btime is whole seconds
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return None


def start(phase: str) -> dict[str, float | None]:
    """A process's marks: its creation, and ``phase`` reached now."""
    return {"process": process_started_at(), phase: time.time()}


def mark(marks: dict, phase: str) -> None:
    marks[phase] = time.time()
