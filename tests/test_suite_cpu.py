"""scripts/suite_cpu.py, the plugin that says where CI's time goes, counts a test's CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

BUSY = '''
import time

def test_busy():
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    open("spent", "w").write(str(time.process_time() - start))

def test_idle():
    pass
'''


def test_each_test_s_cpu_and_wall_seconds_are_recorded_in_order(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
                           "scripts.suite_cpu", "test_busy.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SUITE_CPU_OUT": "rows.json", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [row[0] for row in rows] == ["test_busy.py::test_busy", "test_busy.py::test_idle"]
    spent = float((tmp_path / "spent").read_text())
    assert rows[0][1] >= spent - 0.05 and rows[0][2] >= spent - 0.05
