"""NVIDIA MPS (Multi-Process Service) for runs that put several workers on one GPU.

Several processes on one GPU normally time-slice: each gets the whole GPU for a slice, and their
kernels never overlap. Under MPS the processes' work goes through one MPS server, so kernels from
different processes run concurrently. That pays for small models, whose kernels leave most of the
GPU idle; a model that already fills the GPU gains little. MPS works in the DEFAULT compute mode,
so a run can start a private control daemon (its own pipe and log directories, no root) without
changing the GPUs' settings; clients find it through CUDA_MPS_PIPE_DIRECTORY.

MPS renumbers the GPUs it serves from 0, and a client's CUDA_VISIBLE_DEVICES counts among the
daemon's GPUs. The private daemon is therefore started without CUDA_VISIBLE_DEVICES: it serves
every GPU, so the machine-wide GPU ids the parent hands its children stay right.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping

log = logging.getLogger("harness")

CONTROL = "nvidia-cuda-mps-control"
ENV_VARS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
MAX_SOCKET_PATH = 100      # bytes; a unix socket's path (sun_path) holds at most 107 and a NUL
START_TIMEOUT = 5.0        # seconds for a started daemon to answer
STOP_TIMEOUT = 10.0        # seconds for a stopped daemon to go
LOG_TAIL = 20              # lines of control.log quoted when the daemon does not come up


def _send(command: str, env: Mapping[str, str], timeout: float = 5.0) -> int:
    """Send one command to the daemon that env points at; its exit status (1 if it could not run)."""
    try:
        return subprocess.run([CONTROL], input=command + "\n", text=True, env=dict(env), timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class MpsDaemon:
    """A private MPS control daemon for one run."""

    def __init__(self, pipe_dir: Path, log_dir: Path):
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self._stopped = False

    @property
    def env(self) -> dict[str, str]:
        """The variables that point a client (a child process) at this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def answers(self) -> bool:
        """True while the daemon has its control socket and answers a query."""
        return (self.pipe_dir / "control").exists() and _send("get_server_list", {**os.environ, **self.env}) == 0

    def stop(self) -> None:
        """Tell the daemon to quit and wait (bounded) for it to go; does nothing the second time."""
        if self._stopped:
            return
        self._stopped = True
        if (self.pipe_dir / "control").exists():
            _send("quit", {**os.environ, **self.env}, timeout=STOP_TIMEOUT)
        if not _wait(lambda: not self.answers(), STOP_TIMEOUT):
            log.warning("the MPS control daemon on %s still answers %g s after quit (MPS waits for its "
                        "clients: is a CUDA process still running?); see %s", self.pipe_dir, STOP_TIMEOUT,
                        self.log_dir / "control.log")

    def __enter__(self) -> MpsDaemon:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL:]
    except OSError:
        lines = []
    return "".join(f"\n  | {line}" for line in lines) or f"\n  ({path} is missing or empty)"


def start_mps(directory: Path, timeout: float = START_TIMEOUT) -> MpsDaemon:
    """Start a private MPS control daemon with its pipe and log directories under directory."""
    directory = Path(directory).absolute()
    daemon = MpsDaemon(directory / "mps-pipe", directory / "mps-log")
    control = daemon.pipe_dir / "control"
    if len(os.fsencode(control)) > MAX_SOCKET_PATH:
        raise ValueError(f"the log dir path is too long for MPS: its control socket {control} would take "
                         f"{len(os.fsencode(control))} bytes, over the {MAX_SOCKET_PATH} a unix socket path "
                         f"allows; use a shorter --log-dir")
    if shutil.which(CONTROL) is None:
        raise RuntimeError(f"{CONTROL} was not found on PATH; install the NVIDIA driver utilities, "
                           f"or run without --mps")
    daemon.pipe_dir.mkdir(parents=True, exist_ok=True)
    daemon.log_dir.mkdir(parents=True, exist_ok=True)
    if daemon.answers():
        raise RuntimeError(f"an MPS control daemon already answers on {daemon.pipe_dir} (left by an earlier run?); "
                           f"stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir} {CONTROL}")
    with tempfile.TemporaryFile() as output:     # a file, not a pipe: the daemon may keep it open
        try:
            everywhere = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            status = subprocess.run([CONTROL, "-d"], env={**everywhere, **daemon.env}, stdin=subprocess.DEVNULL,
                                    stdout=output, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            status = None
        output.seek(0)
        said = output.read().decode(errors="replace").strip()
    if status == 0 and _wait(daemon.answers, timeout):
        return daemon
    daemon.stop()                                # in case it is half up
    how = "timed out" if status is None else f"exited with status {status}" if status else "started but never answered"
    raise RuntimeError(
        f"the MPS control daemon did not come up within {timeout:g} s ({CONTROL} -d {how})"
        f"{': ' + said if said else ''}; last lines of {daemon.log_dir / 'control.log'}:"
        f"{_log_tail(daemon.log_dir / 'control.log')}\nhint: check that nvidia-smi sees the GPUs and that their "
        f"compute mode is not PROHIBITED, and that the log dir is on a local filesystem; or run without --mps")


def active_mps_env(environ: Mapping[str, str] = os.environ) -> dict[str, str] | None:
    """The CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY the user already set, or None."""
    found = {name: environ[name] for name in ENV_VARS if environ.get(name)}
    return found or None
