"""Starting a child's process: what its environment says, how it is launched, the record the parent
keeps of it, and the warm spare.

The group decides *when* a child starts (at fork: harness/control/supervise.py; in a dead rank's
place: harness/control/replace.py); this module knows *how*. A child is started by the group's
launcher (harness/launch/launchers.py: forked by the zygote on this machine, by its host's session
over ssh or srun) with everything it needs in its environment: the endpoint and key to reach the
parent, its rank, its GPU, the parent's ``sys.path``. Its stderr is read by a thread of its own,
forwarded with a ``[rank]`` prefix and its last lines kept for the error that reports its death.

A healing group on this machine keeps a **warm spare**: a child started ahead under an identity of
its own ("spare:N"), connected and with its preloads imported, which waits to be told which rank it
is. When a rank dies the spare takes its place at once and a new spare starts in the background. A
GPU group's spare sees every GPU of the group and touches none until it is told which rank, and so
which GPU, is its own (CUDA makes a context only on the device used), so one spare serves whichever
rank dies. Remote groups keep none (a spare would have to wait on the dead rank's host).
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.launch import placement
from harness.launch.launchers import Launcher
from .link import identity_of

STDERR_TAIL = 20           # lines of a failed child's stderr quoted in ChildFailed


def describe_exit(returncode: int, notes: Mapping[int, str] | None = None) -> str:
    """How a child's process ended, in the words of an error message; ``notes``: what its launcher's own exit
    statuses mean (a lost host session's 255)."""
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    note = (notes or {}).get(returncode)
    return f"exited with status {returncode}" + (f" ({note})" if note else "")


class ChildProcess:
    """The parent's record of one child process: its rank and identity, what it sent, when it was
    last heard from, the last lines of its stderr."""

    def __init__(self, rank: int, process: subprocess.Popen, identity: bytes, host: str | None = None,
                 exit_notes: Mapping[int, str] | None = None):
        self.rank, self.identity, self.host = rank, identity, host      # host: where a remote child runs
        self.exit_notes = exit_notes or {}      # what the launcher's own exit statuses mean (describe_exit)
        self.process = process
        self.connected = False
        self.ready = False      # its preloads imported: from then on, silence means a hang
        self.last_seen = time.monotonic()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.inbox: dict[str, collections.deque] = {k: collections.deque() for k in ("yield", "data")}
        self.outcome: tuple[int, str, Any] | None = None    # (exec id, "result" | "error", value)
        self.reader = threading.Thread(target=self._forward_stderr, name=f"harness-stderr-{rank}", daemon=True)
        self.reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _forward_stderr(self) -> None:
        for raw in iter(self.process.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.stderr_tail.append(line)
            sys.stderr.write(f"[{self.rank}] {line}\n")
        self.process.stderr.close()


def environment(rank: int, n: int, gpu: int | None, place: tuple[str, int, int], remote: bool,
                run: Mapping[str, str], heartbeat_timeout: float) -> dict[str, str]:
    """Child ``rank``'s environment: the parent's, its GPU, thread count and (on a GPU) the caching
    allocator's settings (placement.allocator_environment), the ``run``'s settings
    (endpoint, key, preloads, the user's extra variables) and its place among the ``n``. A remote child
    (``place`` = host, index on host, children on host) watches the parent's heartbeats; a local one
    watches the parent's pid."""
    harness_root = str(Path(__file__).resolve().parent.parent)
    host, _, on_host = place
    env = dict(os.environ)
    env.update(placement.child_environment(None if remote else gpu, max(1, (os.cpu_count() or 1) // on_host)))
    if remote:      # this machine cannot see the host's GPUs: the index is the host's own
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
    if gpu is not None:
        env.update(placement.allocator_environment(env))
    env.update(run)
    env.update({
        "HARNESS_RANK": str(rank),
        "HARNESS_WORLD_SIZE": str(n),
        "HARNESS_GPU": env["CUDA_VISIBLE_DEVICES"] if gpu is not None else "",
        "HARNESS_HOST": host,
        "HARNESS_SYS_PATH": json.dumps([p or os.getcwd() for p in sys.path]),
        "PYTHONPATH": os.pathsep.join(filter(None, [harness_root, os.environ.get("PYTHONPATH")])),
    })
    if remote:      # its parent process is its host session's zygote: it watches for our heartbeats too
        env["HARNESS_HEARTBEAT_TIMEOUT"] = str(heartbeat_timeout)
        env.pop("HARNESS_ON_PARENT_MACHINE", None)
    else:           # and it may share memory with us (harness/collectives/shared.py)
        env.update({"HARNESS_PARENT_PID": str(os.getpid()), "HARNESS_ON_PARENT_MACHINE": "1"})
    return env


class Starter:
    """Starts a group's child processes through its launcher, and keeps its warm spare if asked to."""

    def __init__(self, launcher: Launcher, hosts: Sequence[str], environments: Sequence[Mapping[str, str]],
                 keep_spare: bool):
        self._launcher, self._hosts, self._environments = launcher, list(hosts), list(environments)
        self._keep_spare = keep_spare
        self._spares = itertools.count()
        self.spare: ChildProcess | None = None

    def start_group(self) -> list[ChildProcess]:
        """Every rank's process, then the spare's: the ranks get the machine first."""
        children = [self.start(rank) for rank in range(len(self._environments))]
        if self._keep_spare:
            self.spare = self._start_spare()
        return children

    def start(self, rank: int, generation: int = 0) -> ChildProcess:
        """The process of ``rank``; a replacement is started in a later ``generation``."""
        env = {**self._environments[rank], "HARNESS_GENERATION": str(generation)}
        process = self._launcher.start(self._hosts[rank], env)
        return ChildProcess(rank, process, identity_of(rank, generation),
                            self._hosts[rank] if self._launcher.remote else None, self._launcher.exit_notes)

    def take_spare(self, rank: int) -> ChildProcess | None:
        """The spare, renamed ``rank`` (the caller tells it so, once it is connected: an "assume" message
        with ``gpu_of(rank)``); a new spare starts meanwhile. A spare still importing is taken too: it
        started before any new process could, so it is ready sooner. None if there is no live spare.
        The caller holds the link's lock until the new spare is recorded, so that its hello finds it."""
        spare = self.spare
        if spare is None or spare.process.poll() is not None:
            return None
        spare.rank = rank
        self.spare = self._start_spare()
        return spare

    def gpu_of(self, rank: int) -> str:
        """``rank``'s GPU as its environment names it ("" for a CPU child)."""
        return self._environments[rank]["HARNESS_GPU"]

    def _start_spare(self) -> ChildProcess:
        """A child with rank 0's environment, but every GPU of the group, under an identity of its own."""
        identity = f"spare:{next(self._spares)}"
        env = {**self._environments[0], "HARNESS_IDENTITY": identity}
        gpus = list(dict.fromkeys(e["HARNESS_GPU"] for e in self._environments if e["HARNESS_GPU"]))
        if gpus:
            env.update({"CUDA_VISIBLE_DEVICES": ",".join(gpus), "HARNESS_GPU": ""})
        process = self._launcher.start(self._hosts[0], env)
        return ChildProcess(-1, process, identity.encode())
