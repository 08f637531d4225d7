"""Train.py in this process (``run_train``: the workers are still separate processes, and no
interpreter start or torch import is waited for) or as a command (``cli``), Test.py in this process
(``run_test_py``), and what the tests read from their checkpoints."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import Test
import Train
from harness.training import run
from harness.training.checks import check
from harness.training.driver import train
from harness.resilience.checkpoint import load_checkpoint
from tests.helpers import NO_PLOT, ROOT, TRAIN_PY


def run_train(tmp_path: Path, *flags: str, name: str = "run") -> tuple[list[dict], Path]:
    """Train with ``flags``, saving to tmp_path/NAME.pt and logging to tmp_path/NAME; returns (the
    workers' results, the checkpoint's path). No plot is drawn (``TRAIN_PY``)."""
    save = tmp_path / f"{name}.pt"
    gpus, config = check(Train.parse_args([*NO_PLOT, "--save", str(save), "--log-dir", str(tmp_path / name),
                                           *flags]))
    return train(config, gpus), save


def cli(script: str, *flags: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT FLAGS`` (Train.py as ``TRAIN_PY``, Test.py, a script) in a fresh interpreter, its output
    captured; in ``cwd``, by default the test's own folder (tests/conftest.py)."""
    command = TRAIN_PY if script == "Train.py" else (str(ROOT / script),)
    return subprocess.run([sys.executable, *command, *flags], capture_output=True, text=True,
                          timeout=240, cwd=cwd, env={**os.environ, **(env or {})})


def run_test_py(capsys: pytest.CaptureFixture, *flags: str) -> tuple[int, str, str]:
    """Test.py's ``main`` in this process, its workers forked by this process's warm zygote: (exit status, stdout,
    stderr). The command itself is tested in test_train.py (the README's two commands, a corrupt checkpoint)."""
    capsys.readouterr()
    status = Test.main(list(flags))
    out, err = capsys.readouterr()
    return status, out, err


def train_error(*flags: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """Train.py's ``main`` in this process (no interpreter and torch import to wait for), with no GPU
    visible: it must exit with status 2 and one line on stderr, which is returned. The command line
    itself is tested to say the same (test_corrupt_checkpoint_and_unwritable_save_path)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = Train.main(list(flags))
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    return lines[0]


def flat_params(path: Path) -> torch.Tensor:
    """A checkpoint's floating-point model state as one float64 vector."""
    return flat_state(load_checkpoint(path)["model"])


def optimizer_state(path: Path) -> torch.Tensor:
    """A checkpoint's elementwise optimizer state as one float64 vector, parameter by parameter."""
    state = load_checkpoint(path)["optimizer"]["state"]
    return torch.cat([v.flatten().double() for i in sorted(state) for k, v in sorted(state[i].items()) if v.dim()])


def flat_state(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """A model state dict's floating-point entries as one float64 vector."""
    return torch.cat([v.flatten().double() for v in state.values() if v.is_floating_point()])


def stop_and_resume(tmp_path: Path, flags: list[str], stop: int, total: int):
    """Train ``total`` steps straight, and ``stop`` steps then --resume to ``total``; returns the two final
    parameter vectors, the straight run's worker summaries and the stopped run's checkpoint."""
    results, straight = run_train(tmp_path, *flags, "--max-steps", str(total), name="straight")
    _, stopped = run_train(tmp_path, *flags, "--max-steps", str(stop), name="stopped")
    save = tmp_path / "resumed.pt"
    args = Train.parse_args([*flags, "--max-steps", str(total), "--resume", str(stopped), "--save", str(save),
                             "--log-dir", str(tmp_path / "resumed")])
    run(args)
    assert load_checkpoint(save)["step"] == total
    return flat_params(straight), flat_params(save), results, load_checkpoint(stopped)
