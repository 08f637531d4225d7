"""Supervision of a group: the parent's watch over its children, so that nothing hangs.

``Children`` (harness/parent.py) holds a ``Supervisor`` and keeps only the verbs. The supervisor
owns the group's state (its child records, the exec they run, the first error and the failure) and
the machinery every verb relies on:

* watching: each housekeeping tick (harness/control/link.py) looks for a child whose process ended
  or that went silent past the heartbeat timeout, and to children on other hosts forwards signals
  and sends heartbeats (a child cut off from the parent exits by itself);
* reporting: a death becomes ``ChildFailed``, a child's exception ``ChildError``, and the first of
  an exec's errors is the one reported (the rest are what the abort sent for it caused);
* aborting and stopping: when one child fails the others are told to abort their collectives, and
  a group not forked to heal is stopped (asked first, SIGKILL after a grace) before the call raises.
  Children forked ``independent`` share no collective (the asynchronous parameter server's workers): when
  one of a healing group dies, the others are not aborted and train on while it is replaced.

Every blocking wait goes through ``wait_for``, which checks all this first: that is why a call on
a group whose child died ends in seconds. Replacing a dead rank is harness/control/replace.py's job.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import time
from typing import Callable, Iterable, NoReturn, TypeVar

import zmq

from .errors import ChildError, ChildFailed
from .link import HEARTBEAT_INTERVAL, Link
from .spawn import ChildProcess, Starter, describe_exit

T = TypeVar("T")

START_TIMEOUT = 60.0       # seconds for a child to start its interpreter and connect
STOP_GRACE = 5.0           # seconds a stopped child gets to exit on its own before SIGKILL
DEATH_GRACE = 1.0          # seconds an error waits for a peer's death that may have caused it


class Supervisor:
    """A group's children and the exec they run, watched. The attributes are the group's state,
    shared with the mailbox (what arrives) and the replacement of a dead rank."""

    def __init__(self, starter: Starter, heartbeat_timeout: float, heal: bool, remote: bool,
                 independent: bool = False):
        self.starter = starter
        self.heartbeat_timeout = heartbeat_timeout
        self.heal = heal                # a failure leaves the survivors running, for replace() or stop()
        self.independent = independent  # the children share no collective: a death aborts no survivor (heal)
        self.remote = remote            # children on other hosts: heartbeats both ways, signals as messages
        self.children: list[ChildProcess] = []
        self.link: Link               # set by start()
        self.exec_id = 0                # the running exec's, 0 before the first
        self.call: tuple | None = None  # its (fn, args, kwargs), handed to a replacement
        self.generation = 0             # how many replacements this group has started
        self.first_error: int | None = None     # rank whose error began this exec's failure
        self.failure: ChildFailed | None = None
        self.stopping = False
        self._exec_ids = itertools.count(1)
        self._all_connected = False         # every child has said hello: sends may go
        self._signals: list[int] = []       # for remote children: sent by the housekeeping thread
        self._last_heartbeat = 0.0
        # Told (from the housekeeping thread) when a ready child has been silent for a third of the
        # heartbeat timeout, (rank, seconds), and when it is heard again, (rank, None): a stopped or
        # starved worker is named long before it is declared hung.
        self.on_silent: Callable[[int, float | None], None] | None = None
        self._silent: set[int] = set()

    def start(self, link: Link) -> None:
        """Start every child, then the link's housekeeping, and return at once: the first send waits for
        them to connect, so the parent's own work (its imports, its checks) overlaps their start. A child
        that has not connected START_TIMEOUT s after its start fails the group (``find_deaths``)."""
        self.link = link
        self.children = self.starter.start_group()
        link.start()

    def everyone(self) -> list[ChildProcess]:
        """The children, and the warm spare if there is one."""
        return self.children + ([self.starter.spare] if self.starter.spare is not None else [])

    def begin(self, call: tuple) -> int:
        """A new exec of ``call``: its id; nothing of the last exec's outcomes, inboxes or error is kept."""
        self.exec_id = next(self._exec_ids)
        self.call = call
        self.first_error = None
        for child in self.children:
            child.outcome = None
            for box in child.inbox.values():
                box.clear()
        return self.exec_id

    # -- sending and waiting -------------------------------------------------------------------

    def send_all(self, messages: Iterable[tuple[int, tuple]]) -> None:
        """Send each (rank, protocol message). Returns once every zero-copy buffer has left this
        process, so the caller may reuse the objects' memory."""
        self.raise_if_failed()
        if not self._all_connected:
            self._all_connected = bool(self.wait_for(lambda: all(c.connected for c in self.children) or None))
        trackers = []
        for rank, message in messages:
            try:
                trackers.append(self.link.send(message, to=self.children[rank].identity))
            except zmq.ZMQError as error:
                if error.errno != zmq.EHOSTUNREACH:
                    raise
                self.link.wait_for(lambda: self.check() or self.find_deaths() or self.failure,
                                   time.monotonic() + 5.0)
                self.raise_if_failed()
                raise ChildFailed(rank, "is not connected (its socket is gone)") from None
        for tracker in filter(None, trackers):
            self.wait_for(lambda: tracker.done or None)

    def send_if_alive(self, child: ChildProcess, message: tuple) -> None:
        try:
            self.link.send(message, to=child.identity)
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:     # the child is gone: nothing to tell it
                raise

    def wait_for(self, ready: Callable[[], T | None], deadline: float | None = None) -> T | None:
        """The link's ``wait_for`` that raises as soon as the group has failed (``check``)."""
        return self.link.wait_for(lambda: self.check() or ready(), deadline)

    # -- what went wrong -----------------------------------------------------------------------

    def check(self) -> None:
        """Raise what went wrong: a dead child first (the group is then stopped), else a child's error.
        Deaths are looked for before errors are reported: when a peer dies mid-collective, the
        survivors' "connection reset" errors can arrive before the death is noticed."""
        self.raise_if_failed()
        if self.first_error is not None:
            self._await_deaths(DEATH_GRACE)
            self.raise_if_failed()
            child = self.children[self.first_error]
            raise ChildError(child.rank, child.outcome[2])

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            if not self.heal:      # a healing group waits for replace() or stop()
                self.stop(grace=1.0)
            raise self.failure

    def give_up(self, failure: ChildFailed) -> NoReturn:
        self.failure = failure
        self.stop(grace=1.0)
        raise failure

    def record_error(self, child: ChildProcess, text: str, still_running: bool = False) -> None:
        """Keep the first error of this exec for each child, and report the exec's first one: the
        errors that follow (PeerFailed, mostly) are what the abort sent for it caused. An error the
        parent found (``still_running``) also aborts the child itself, which may be waiting."""
        if child.outcome and child.outcome[0] == self.exec_id and child.outcome[1] == "error":
            return
        child.outcome = (self.exec_id, "error", text)
        if self.first_error is None:
            self.first_error = child.rank
        self._abort_others(None if still_running else child.rank, f"child {child.rank} raised an exception")

    def _await_deaths(self, grace: float) -> None:
        """Look for a death among the children still running, for up to ``grace`` seconds. A SIGKILLed
        peer's sockets close (and its neighbours report "connection reset") a moment before the kernel
        lets us reap it; without this wait that error would hide the death that caused it."""
        deadline = time.monotonic() + grace
        while self.failure is None:
            self.find_deaths()
            running = [c for c in self.children if not (c.outcome and c.outcome[0] == self.exec_id)]
            if not running or time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def _fail(self, child: ChildProcess, reason: str) -> None:
        self.failure = ChildFailed(child.rank, reason, child.stderr_tail, child.host)
        if not (self.heal and self.independent):      # independent survivors run on while the dead one is replaced
            self._abort_others(child.rank, f"child {child.rank} {reason}")

    def _abort_others(self, rank: int | None, reason: str) -> None:
        for child in self.children:
            if child.rank != rank and child.connected:
                self.send_if_alive(child, ("abort", self.exec_id, reason))

    # -- watching ------------------------------------------------------------------------------

    def housekeeping(self) -> None:
        """Called by the link every tick, from whichever thread holds the socket."""
        if not self.stopping:
            self.find_deaths()
        if self.remote:
            self._talk_to_remote_children()

    def find_deaths(self) -> None:
        if self.failure is not None:
            return
        now = time.monotonic()
        for child in self.children:
            returncode = child.process.poll()
            if returncode is not None:
                child.reader.join(timeout=1.0)        # let the last stderr lines arrive
                self._fail(child, describe_exit(returncode, child.exit_notes))
                return
            # Importing torch can hold the GIL for seconds (the heartbeat thread cannot run), more so on
            # a busy machine: a child still starting or importing its preloads is given START_TIMEOUT.
            silent = now - child.last_seen
            if silent > (self.heartbeat_timeout if child.ready else START_TIMEOUT):
                child.process.kill()
                self._fail(child, f"stopped responding (no heartbeat for {silent:.1f} s; killed)" if child.connected
                           else f"did not connect within {START_TIMEOUT:.0f} s (killed)")
                return
            self._note_silence(child, silent)

    def _note_silence(self, child: ChildProcess, silent: float) -> None:
        if not (child.connected and child.ready):
            return      # still starting (a replacement on a host that may be cut off): not heard yet
        quiet = silent > self.heartbeat_timeout / 3
        if quiet == (child.rank in self._silent) or self.on_silent is None:
            return
        (self._silent.add if quiet else self._silent.discard)(child.rank)
        self.on_silent(child.rank, silent if quiet else None)

    def _talk_to_remote_children(self) -> None:
        """Forward the signals ``signal()`` noted, and send heartbeats: a child that hears nothing
        from the parent for the heartbeat timeout exits (its host may have been cut off from ours)."""
        signals, self._signals = self._signals, []
        messages = [("signal", None, signum) for signum in signals]
        if time.monotonic() - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = time.monotonic()
            messages.append(("heartbeat", None, None))
        for child in self.children:
            if child.connected and child.process.poll() is None:
                for message in messages:
                    self.send_if_alive(child, message)

    # -- signals and stopping ------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        """``os.kill`` each local child still running (safe in a signal handler); for remote
        children, note it for the next housekeeping tick."""
        if self.remote:
            self._signals.append(signum)
            return
        for child in self.children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Ask every child (and the spare) to stop, SIGKILL those still running after ``grace`` s (and
        at once those not yet connected, which could not be told), reap them all, close the socket.
        A second call, once all are reaped, does nothing."""
        everyone = self.everyone()
        if self.stopping and all(c.process.returncode is not None for c in everyone):
            return
        self.stopping = True
        for child in everyone:
            if child.process.poll() is None and child.connected:
                self.send_if_alive(child, ("stop", None, None))
            elif child.process.poll() is None:      # nothing was ever sent to it: nothing to finish
                child.process.kill()
        deadline = time.monotonic() + grace
        for child in everyone:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            child.reader.join(timeout=2.0)
        self.link.close()

