"""A host session: one process on each remote host, started over ssh or by srun, that forks its children.

The ssh and Slurm launchers (harness/launch/launchers.py) start one session (``COMMAND``) on each host
they place children on, the first time they place one there, and keep it for the launcher's life. It is a host's forker (harness/launch/remote.py): every child the parent asks for is forked
by the host's zygote, which imported torch once, so the host's children start in milliseconds, a heal's
replacement too, and the host's disk and cores serve one import instead of one a child.

The channel is the ssh client's (or srun's) stdin and stdout: one JSON line a message. ssh authenticates
and encrypts it, and only the parent's process holds its pipes, so the children's environments (the run's
key among them) travel on it, never in argv. The session's own stdout is that channel: its children's
stdout goes to the session's stderr, which the parent forwards as ``[host] line`` and quotes when the
session ends early (a host without the Python environment says so there).

Nothing is left running. The session ends, killing its children, when its stdin ends (the parent closed it,
its ssh client was killed, the parent died) or when it has heard nothing from the parent for the heartbeat
timeout (its host was cut off); every child also watches the session's zygote as its parent and the parent's
own heartbeats. It ignores SIGINT and SIGTERM, as the zygote does: Slurm signals every process of a step (a
time limit, scancel), and the workers, which get the signal too, stop at an update and save; were the
session to die of it, they would die with it. On the parent's side, a session that falls silent for the
heartbeat timeout (``FIRST_WORD`` s before it has said anything: a connection or a step may be slow to
start), or whose process ends, is lost: its children are reported dead, and the next child placed on that
host starts a new session there. What the parent sends is written by a thread of its own, so that no
caller (the supervisor killing a child, a heal starting one) ever waits on a host that does not read.
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from typing import Sequence

from . import zygote
from .remote import HEARTBEAT, NEWS, Channel, RemoteChild, Served

__all__ = ["Session", "main"]

TAIL = 5                    # lines of a session's stderr quoted when it ends early
CLOSE_GRACE = 5.0           # s a closed session gets to end its children and exit before it is killed
FIRST_WORD = 60.0           # s a new session may take to say anything (ssh's connection, srun's step, imports)
COMMAND = zygote.DEAF + "from harness.launch.session import main; main()"     # python -c COMMAND TIMEOUT
LOST_STATUS = 255           # a lost session's children's exit status: ssh's own, for a connection lost


def encode(message: tuple) -> bytes:
    """One JSON line; a stderr line's bytes as text that ``decode`` turns back into the same bytes."""
    kind, payload = message
    if kind == "stderr":
        payload = (payload[0], payload[1].decode("utf-8", "surrogateescape"))
    return json.dumps([kind, payload]).encode() + b"\n"


def decode(line: bytes) -> tuple:
    kind, payload = json.loads(line)
    if kind == "stderr":
        payload = (payload[0], payload[1].encode("utf-8", "surrogateescape"))
    return kind, payload


class Session:
    """The parent's end of one host's session: the ssh client or srun that runs it (``command``), the children
    it forked, and the heartbeats each way. ``name``: the host, as the parent's stderr shows it."""

    def __init__(self, command: Sequence[str], name: str, heartbeat_timeout: float):
        self.name, self._timeout = name, heartbeat_timeout
        self.process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
        self.lost: str | None = None
        self._status = LOST_STATUS          # its children's, once it is lost: its process's own where that says more
        self._lock = threading.Lock()       # the children
        self._children: dict[int, RemoteChild] = {}
        self._numbers = itertools.count()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()       # to stdin, by the writer thread: never blocks
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self._heard: float | None = None      # when the host last said anything (None: not yet)
        self._started = time.monotonic()
        self._done = threading.Event()        # closed here, or its process ended
        threads = [threading.Thread(target=target, name=f"harness-session-{what}-{name}", daemon=True) for target, what
                   in ((self._read_stderr, "stderr"), (self._read_news, "news"), (self._keep_alive, "alive"),
                       (self._write, "write"))]
        self._stderr_reader = threads[0]
        for thread in threads:
            thread.start()

    def start(self, env: dict[str, str]) -> RemoteChild:
        """A child forked on the host with ``env`` over the session's own environment."""
        with self._lock:
            child = RemoteChild(self.post, next(self._numbers))
            self._children[child.number] = child
        if self.lost:
            child.ended(self._status, self._why())
        else:
            self.post(("start", (child.number, env)))
        return child

    def post(self, message: tuple) -> None:
        """Send ``message`` to the host, from any thread and at once: the writer thread writes it (a host that does
        not read, cut off or still connecting, holds that thread alone); a session that ended drops it."""
        self._outbox.put(encode(message))

    def end(self) -> None:
        """Ask the session to end (its stdin closes: it kills its children and exits), without waiting for it."""
        self._done.set()
        self._outbox.put(None)

    def close(self) -> None:
        """End the session and wait for it."""
        self.end()
        self._reap()

    def _reap(self) -> int:
        """The session's process's exit status, once it has exited (killed after CLOSE_GRACE s)."""
        try:
            return self.process.wait(CLOSE_GRACE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def _write(self) -> None:
        """Write what ``post`` queued to the session's stdin, until ``close`` (None), then close it."""
        for line in iter(self._outbox.get, None):
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
            except (OSError, ValueError):       # the pipe is broken: the session's end is seen by _read_news
                break
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def _read_news(self) -> None:
        try:
            for line in iter(self.process.stdout.readline, b""):
                self._heard = time.monotonic()
                try:
                    kind, payload = decode(line)
                except (ValueError, TypeError):
                    self._tail.append(line.decode(errors="replace").rstrip("\n"))
                    continue
                if kind in NEWS and payload[0] in self._children:
                    self._children[payload[0]].news(kind, payload[1])
        finally:
            self._ended()

    def _read_stderr(self) -> None:
        for raw in iter(self.process.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")       # ssh's own lines end in \r\n
            self._tail.append(line)
            sys.stderr.write(f"[{self.name}] {line}\n")

    def _keep_alive(self) -> None:
        """Heartbeats to the host; a host silent for the heartbeat timeout (a new one: FIRST_WORD s) is lost, its
        ssh client or srun killed."""
        while not self._done.wait(HEARTBEAT):
            silent = time.monotonic() - (self._heard or self._started)
            if silent > (self._timeout if self._heard is not None else max(self._timeout, FIRST_WORD)):
                self.lost = f"no heartbeat from its session for {silent:.1f} s"
                self.process.kill()
                return
            self.post(("heartbeat", None))

    def _ended(self) -> None:
        """The session's process ended (or was killed): every child it had not reported ended ends with it."""
        self.end()
        status = self._reap()
        self._stderr_reader.join(timeout=2.0)      # its last words (a host without Python says so) are the why
        if self.lost is None:
            self._status = status if status > 0 else LOST_STATUS
            how = f"killed by signal {-status}" if status < 0 else f"status {status}"
            self.lost = f"its session ended ({how})"
        with self._lock:
            children = [c for c in self._children.values() if c.returncode is None]
        for child in children:
            child.ended(self._status, self._why())

    def _why(self) -> str:
        tail = [line for line in self._tail if line]
        return "\n".join([*tail, f"harness: host {self.name} is lost: {self.lost}"])


# -- the host's side ------------------------------------------------------------------------------

class Pipes(Channel):
    """The session's end of its channel: JSON lines on stdin from the parent, on ``out`` to it."""

    def __init__(self, out: int):
        self._in, self._out, self._buffer = sys.stdin.fileno(), out, b""

    def poll(self, timeout_ms: int) -> bool:
        return b"\n" in self._buffer or bool(select.select([self._in], [], [], timeout_ms / 1000)[0])

    def receive(self) -> tuple | None:
        if b"\n" not in self._buffer:
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        if b"\n" not in self._buffer:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return decode(line)

    def send(self, message: tuple) -> None:
        data = encode(message)
        while data:
            data = data[os.write(self._out, data):]

    def close(self) -> None:
        os.close(self._out)


def main() -> None:
    """The session's process (``python -c COMMAND TIMEOUT``, deaf to SIGINT and SIGTERM before its first import:
    Slurm signals a step's every process, and the workers decide): serve the parent on stdin and stdout until it
    ends the session; the children's stdout goes to this process's stderr."""
    out = os.dup(1)
    os.dup2(2, 1)
    try:
        Served(Pipes(out), float(sys.argv[1])).run()
    except BrokenPipeError:     # the parent is gone
        pass

