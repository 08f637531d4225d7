import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # models/ and datasets/ are used from the checkout
    sys.path.insert(0, str(ROOT))


def alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait up to timeout s for every pid to disappear; returns those still alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


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
