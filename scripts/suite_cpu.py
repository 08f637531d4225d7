"""A pytest plugin that records what each test costs the whole machine: CPU seconds of every process
(from /proc/stat, so a test's subprocesses, zygotes and remote "hosts" count too) and wall seconds.

CI's time is the suite's CPU over two cores (the tests start hundreds of interpreters), so this is what
to measure before cutting it. Run the suite in one process on an otherwise idle machine:

    SUITE_CPU_OUT=cpu.json python -m pytest -q -n 0 -p scripts.suite_cpu

and read ``cpu.json``: a list of [test id, CPU s, wall s] in the order the tests ran.
"""
from __future__ import annotations

import json
import os
import time
from typing import Iterator

import pytest

_rows: list[list] = []


def machine_cpu_seconds() -> float:
    """User, nice, system, irq and softirq time of every CPU since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = machine_cpu_seconds(), time.monotonic()
    yield
    _rows.append([item.nodeid, round(machine_cpu_seconds() - cpu, 2), round(time.monotonic() - wall, 2)])


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("SUITE_CPU_OUT", "suite_cpu.json")
    with open(path, "w") as out:
        out.write("[\n" + ",\n".join(json.dumps(row) for row in _rows) + "\n]\n")
