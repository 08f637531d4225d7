"""Children forked on another host by a process of ours there: the host's forker.

A child on another host is forked there, by the host's zygote (harness/launch/zygote.py), on the parent's
request: the host imports torch once, not once a child, and a heal's replacement starts in milliseconds.
Two kinds of process serve such requests, each over a channel of its own:

* a node agent (harness/launch/agent.py), under an engine that started Train.py on every node: a signed,
  encrypted ZeroMQ link to node 0's parent (harness/launch/agents.py);
* a host session (harness/launch/session.py), which the ssh and Slurm launchers start on each host: the
  ssh client's or srun's stdin and stdout.

Both speak the same messages, (kind, payload):
parent -> host: ("start", (child, environment)), ("signal", (child, signum)), ("heartbeat", None),
("end", exit status, or (exit status, why node 0 refused the run));
host -> parent: ("started", (child, pid)), ("stderr", (child, line)), ("exited", (child, status)),
("heartbeat", None).

``Served`` is the host's side: it forks each child asked for and reports its pid, every stderr line and its
exit status, until the parent ends the run, the channel closes, or the parent falls silent for the heartbeat
timeout (then every child it forked is killed). ``RemoteChild`` is the parent's side of one such child: the
process its supervision watches (harness/control/supervise.py), as it watches a local child.
"""
from __future__ import annotations

import abc
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable

from . import zygote
from .placement import on_this_node

__all__ = ["Channel", "RemoteChild", "Served"]

POLL_MS = 20                # the longest wait for a message; news from the children waits at most this
HEARTBEAT = 1.0             # s between heartbeats each way


class Channel(abc.ABC):
    """A host's end of its link to the parent: one whole message at a time."""

    @abc.abstractmethod
    def poll(self, timeout_ms: int) -> bool:
        """Whether a message (or the channel's end) can be read now, waiting up to ``timeout_ms``."""

    @abc.abstractmethod
    def receive(self) -> tuple | None:
        """The next message; None for one to drop (not authentic); EOFError once the parent's end closed."""

    @abc.abstractmethod
    def send(self, message: tuple) -> None:
        """Send ``message`` to the parent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close this end."""


NEWS = ("started", "stderr", "exited")     # the host's messages about one child: (kind, (child, value))


class RemoteChild(zygote.Forked):
    """A child a host's forker started, as the supervisor sees a process: its pid, exit status and stderr
    lines come from the host; a signal or a kill goes to it as a message through ``post``."""

    def __init__(self, post: Callable[[tuple], None], number: int):
        read, self._write = os.pipe()
        super().__init__(os.fdopen(read, "rb"))
        self._post, self.number = post, number
        self._pipe = threading.Lock()       # its stderr's write end: the host's news and a lost host's end race

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            self._post(("signal", (self.number, signum)))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def news(self, kind: str, value: Any) -> None:
        """What its host said of it: "started" (its pid), "stderr" (a line) or "exited" (its status)."""
        if kind == "started":
            self._set(pid=value)
        elif kind == "stderr":
            self.line(value)
        else:
            self.ended(value)

    def line(self, text: bytes) -> None:
        with self._pipe:
            if self._write >= 0:
                os.write(self._write, text)

    def ended(self, returncode: int, why: str = "") -> None:
        """Its exit status (``why``: last stderr lines, such as the host being lost), then the end of stderr; once."""
        with self._pipe:
            if self._write < 0:
                return
            if why:
                os.write(self._write, why.encode(errors="replace") + b"\n")
            os.close(self._write)
            self._write = -1
        self._set(pid=0 if self._pid is None else None, returncode=returncode)


def _ended(payload: int | tuple[int, str]) -> int:
    """The exit status an "end" carries, saying on stderr why node 0 refused the run where it says."""
    if isinstance(payload, int):
        return payload
    status, why = payload
    print(f"harness: node 0 refused the run: {why}", file=sys.stderr, flush=True)
    return status


class Served:
    """One run served on a host: the parent's requests in, the children's news out, until "end", the
    channel's end or the parent's silence for ``heartbeat_timeout`` s."""

    def __init__(self, channel: Channel, heartbeat_timeout: float):
        self._channel, self._timeout = channel, heartbeat_timeout
        self._children: dict[int, zygote.Forked] = {}
        self._news: queue.Queue = queue.Queue()      # from the children's watcher threads
        self._base = dict(os.environ)                 # a node agent's pre-shared key is gone from it already

    def run(self) -> int | None:
        """The parent's exit status once it ends the run; None when it fell silent or its end closed (the
        children killed)."""
        heard = sent = time.monotonic()
        try:
            while True:
                if self._channel.poll(POLL_MS):
                    try:
                        message = self._channel.receive()
                    except EOFError:
                        return None
                    if message is not None:
                        heard = time.monotonic()
                        if message[0] == "end":
                            return _ended(message[1])
                        self._do(*message)
                while not self._news.empty():
                    self._channel.send(self._news.get())
                if time.monotonic() - sent >= HEARTBEAT:
                    sent = time.monotonic()
                    self._channel.send(("heartbeat", None))
                if time.monotonic() - heard > self._timeout:
                    return None
        finally:
            self._end_children()
            self._channel.close()

    def _do(self, kind: str, payload: Any) -> None:
        if kind == "start":
            number, env = payload
            try:
                env = on_this_node({**self._base, **env})
                child = self._children[number] = zygote.for_environment(env).fork(env)
            except Exception as error:      # this child cannot start here; the host's others go on
                self._news.put(("stderr", (number, f"harness: the host could not start this worker: {error!r}\n"
                                           .encode())))
                self._news.put(("exited", (number, 1)))
                return
            threading.Thread(target=self._watch, args=(number, child), name=f"harness-served-{number}",
                             daemon=True).start()
        elif kind == "signal" and payload[0] in self._children:
            child = self._children[payload[0]]
            if payload[1] == signal.SIGKILL:
                child.kill()        # also one the zygote has not forked yet
            else:
                child.send_signal(payload[1])

    def _watch(self, number: int, child: zygote.Forked) -> None:
        """Report the child's pid, each stderr line and its exit status, in that order."""
        self._news.put(("started", (number, child.pid)))
        for line in iter(child.stderr.readline, b""):
            self._news.put(("stderr", (number, line)))
        child.stderr.close()
        self._news.put(("exited", (number, child.wait())))

    def _end_children(self) -> None:
        for child in self._children.values():
            if child.poll() is None:
                child.kill()
        for child in self._children.values():
            child.wait()
