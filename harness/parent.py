"""The parent: forks child workers and talks to them. It never touches CUDA; it supervises.

``Parent`` owns the run (its signing key and private socket directory); ``Parent.fork`` starts a
group of ``Children`` as fresh interpreters (``python -m harness.child``) and returns at once
after they have connected. The group's API reads like Lua's ``parallel``: exec, join, send,
scatter, receive, wait. Every blocking call also watches the children: a child that exits or
stops sending heartbeats ends the call with ``ChildFailed`` in seconds, after the others have
been told to abort and have been stopped. Nothing hangs and nothing is left running.

Children may run on other hosts: ``fork(..., launcher=Ssh(hosts))`` or ``Slurm()`` (harness/launch/launchers.py)
starts each through ssh or srun, and the group talks over TCP (harness/control/endpoint.py). The parent then
also sends heartbeats, so that a child cut off from it exits by itself, and forwards signals as
messages; a failure names the child's host.

A group forked with ``heal=True`` is not stopped when a child fails: the call still raises
``ChildFailed``, the survivors are still told to abort their collectives, but they stay alive,
and ``replace(rank)`` puts a new child in the dead one's place, hands it the running exec and
tells the survivors (harness/child.py: ``await_heal``). The new child is the warm spare where there
is one (harness/control/spawn.py, which also starts every child and says what its environment holds). What the
ranks do then is the running code's business (harness/resilience/heal.py is Train.py's); the caller may instead
``stop()`` the group.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import zmq

from .control import endpoint

from .launch import placement

from .control import spawn

from .control import wire
from .launch.launchers import Launcher, Local, make_launcher
from .control.link import HEARTBEAT_INTERVAL, Link
from .control.spawn import ChildProcess, Starter, describe_exit

log = logging.getLogger("harness")

START_TIMEOUT = 60.0       # seconds for a child to start its interpreter and connect
STOP_GRACE = 5.0           # seconds a stopped child gets to exit on its own before SIGKILL
DEATH_GRACE = 1.0          # seconds an error waits for a peer's death that may have caused it


class ChildError(RuntimeError):
    """An exception raised by the code a child ran; carries the rank and the child's traceback."""

    def __init__(self, rank: int, traceback_text: str):
        self.rank, self.traceback = rank, traceback_text
        last = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "unknown error"
        super().__init__(f"child {rank} raised {last}\n--- child {rank} traceback ---\n{traceback_text.rstrip()}")


class ChildFailed(RuntimeError):
    """A child died or stopped responding; the rest of its group has been stopped."""

    def __init__(self, rank: int, reason: str, stderr_tail: Sequence[str] = (), host: str | None = None):
        self.rank, self.reason, self.stderr_tail, self.host = rank, reason, list(stderr_tail), host
        tail = "".join(f"\n  | {line}" for line in self.stderr_tail) or "\n  (no stderr output)"
        where = f" on host {host}" if host else ""
        super().__init__(f"child {rank}{where} {reason}; last lines of its stderr:{tail}")


class ChildHandle:
    """One child of a group: ``kids[1].send(x)``, ``kids[1].receive()``."""

    def __init__(self, group: "Children", rank: int):
        self._group, self.rank = group, rank

    @property
    def pid(self) -> int:
        return self._group._children[self.rank].pid

    def send(self, obj: Any) -> None:
        self._group._send_all([(self.rank, obj)])

    def receive(self) -> Any:
        return self._group._take("data", [self.rank])[0]


class Children:
    """A group of child workers, ranks 0..n-1. Made by ``Parent.fork``."""

    def __init__(self, n: int, key: bytes, socket: zmq.Socket, environments: list[dict[str, str]],
                 heartbeat_timeout: float, heal: bool = False, launcher: Launcher | None = None,
                 hosts: Sequence[str] = ()):
        self._key = key
        self._launcher = launcher or Local()
        self._hosts = list(hosts) or ["localhost"] * n
        self._signals: list[int] = []       # for remote children: sent by the housekeeping thread
        self._last_heartbeat = 0.0
        self._heartbeat_timeout = heartbeat_timeout
        self._heal = heal
        self._environments = environments
        self._generation = 0
        self._exec_ids = itertools.count(1)
        self._exec_id = 0
        self._call: tuple | None = None
        self._exchanges: dict[str, tuple[list[int], dict[int, Any]]] = {}
        self._first_error: int | None = None     # rank whose error began this exec's failure
        self._failure: ChildFailed | None = None
        self._stopping = False
        self._link = Link(socket, key, self._dispatch, self._housekeeping)
        self._starter = Starter(self._launcher, self._hosts, environments, keep_spare=heal and not
                                self._launcher.remote)
        self._children: list[ChildProcess] = self._starter.start_group()
        self._link.start()
        self._await_connections()

    # -- public API ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, rank: int) -> ChildHandle:
        if not 0 <= rank < len(self):
            raise IndexError(f"rank {rank} out of range: this group has ranks 0..{len(self) - 1}")
        return ChildHandle(self, rank)

    @property
    def pids(self) -> list[int]:
        """The local processes: the children, or for remote children their ssh or srun clients."""
        return [c.pid for c in self._children]

    @property
    def hosts(self) -> list[str]:
        """The hosts the group runs on, in rank order, each once."""
        return list(dict.fromkeys(self._hosts))

    def exec(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``fn(ctx, *args, **kwargs)`` in every child (shipped with cloudpickle); returns at once."""
        self._raise_if_failed()
        self._exec_id = next(self._exec_ids)
        self._call = (fn, args, kwargs)
        self._exchanges.clear()
        self._first_error = None
        for child in self._children:
            child.outcome = None
            for box in child.inbox.values():
                box.clear()
        self._send_all([(c.rank, ("exec", self._exec_id, (fn, args, kwargs))) for c in self._children], raw=True)

    def join(self, msg: Any = None) -> list:
        """Wait until every child has called ``ctx.yield_``; hand each ``msg``; return the yielded values."""
        values = self._take("yield")
        self._send_all([(c.rank, ("join", self._exec_id, msg)) for c in self._children], raw=True)
        return values

    def send(self, obj: Any) -> None:
        """Send the same object to every child."""
        self._send_all([(c.rank, obj) for c in self._children])

    def scatter(self, objs: Sequence[Any]) -> None:
        """Send ``objs[r]`` to child r."""
        if len(objs) != len(self):
            raise ValueError(f"scatter needs one object per child: got {len(objs)} for {len(self)} children")
        self._send_all(list(enumerate(objs)))

    def receive(self) -> list:
        """The next object each child sent, in rank order."""
        return self._take("data")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every child still running. Safe in a signal handler (it only calls
        ``os.kill``): that is how the parent forwards Ctrl-C and SIGTERM (harness/resilience/interrupt.py).
        Children on other hosts get it as a message, sent at the next housekeeping tick."""
        if self._launcher.remote:
            self._signals.append(signum)
            return
        for child in self._children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def wait(self) -> list:
        """Wait for the function of the last ``exec`` to return in every child; its values in rank order."""
        if self._exec_id == 0:
            raise RuntimeError("wait() called before exec(): nothing is running")
        self._link.wait_for(lambda: self._check() or (all(c.outcome for c in self._children) or None))
        return [c.outcome[2] for c in self._children]

    def replace(self, rank: int) -> None:
        """Heal a group forked with ``heal=True`` after ``ChildFailed`` named ``rank``: start a new child
        as that rank (same GPU and environment), give it the running exec, and send the survivors
        the heal notice ({"generation", "replaced"}) they wait for in ``ctx.await_heal``. Raises
        ``ChildFailed`` (having stopped the group) if the new child does not connect, or if a survivor's
        exec has already ended: that group cannot be healed."""
        if not self._heal:
            raise RuntimeError("replace() needs a group forked with heal=True")
        old = self._children[rank]
        if old.process.poll() is None:
            old.process.kill()
        old.process.wait()
        old.reader.join(timeout=1.0)
        ended = [c.rank for c in self._children if c.rank != rank and c.outcome and c.outcome[0] == self._exec_id]
        if ended:
            reason = self._failure.reason if self._failure is not None and self._failure.rank == rank else "failed"
            self._give_up(ChildFailed(rank, f"{reason}, and could not be healed: rank {ended[0]}'s function had "
                                            f"already ended", old.stderr_tail))
        self._generation += 1
        spare = self._starter.take_spare(rank)
        child = spare or self._starter.start(rank, self._generation)
        child.inbox["data"] = old.inbox["data"]      # what the dead child sent is still to be read
        self._children[rank] = child
        self._failure, self._first_error = None, None
        self._exchanges.clear()
        deadline = time.monotonic() + START_TIMEOUT
        if self._link.wait_for(lambda: self._check() or (child.connected or None), deadline) is None:
            self._give_up(ChildFailed(rank, f"was replaced, but the new child did not connect within "
                                            f"{START_TIMEOUT:.0f} s", child.stderr_tail, child.host))
        if spare is not None:
            self._send_if_alive(child, ("assume", None, {"rank": rank, "generation": self._generation,
                                                         "gpu": self._starter.gpu_of(rank)}))
        if self._exec_id:       # running on every survivor (checked above): the replacement joins it
            self._send_if_alive(child, ("exec", self._exec_id, self._call))
            notice = {"generation": self._generation, "replaced": rank}
            for survivor in self._children:
                if survivor is not child:
                    self._send_if_alive(survivor, ("heal", self._exec_id, notice))

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every child (asking first, then SIGKILL after ``grace`` s), reap them, close the socket."""
        everyone = self._everyone()
        if self._stopping and all(c.process.returncode is not None for c in everyone):
            return
        self._stopping = True
        for child in everyone:
            if child.process.poll() is None and child.connected:
                self._send_if_alive(child, ("stop", None, None))
        deadline = time.monotonic() + grace
        for child in everyone:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            child.reader.join(timeout=2.0)
        self._link.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _send_all(self, items: Iterable[tuple[int, Any]], raw: bool = False) -> None:
        """Send each (rank, object); ``raw`` objects are already protocol messages. Returns once every
        zero-copy buffer has left this process, so the caller may reuse the objects' memory."""
        self._raise_if_failed()
        trackers = []
        for rank, obj in items:
            message = obj if raw else ("data", self._exec_id, obj)
            try:
                trackers.append(self._link.send(message, to=self._children[rank].identity))
            except zmq.ZMQError as error:
                if error.errno != zmq.EHOSTUNREACH:
                    raise
                self._link.wait_for(lambda: self._check() or self._find_deaths() or self._failure,
                                    time.monotonic() + 5.0)
                self._raise_if_failed()
                raise ChildFailed(rank, "is not connected (its socket is gone)") from None
        for tracker in filter(None, trackers):
            self._link.wait_for(lambda: self._check() or (tracker.done or None))

    def _take(self, box: str, ranks: Sequence[int] | None = None) -> list:
        children = [self._children[r] for r in ranks] if ranks is not None else self._children

        def ready():
            self._check()
            for child in children:
                if not child.inbox[box] and child.outcome is not None:   # it returned: nothing more will come
                    what = "yield_" if box == "yield" else "send"
                    raise RuntimeError(f"child {child.rank}'s function returned without calling ctx.{what}() "
                                       f"(or not as often as the parent waits for it); nothing will arrive")
            return all(c.inbox[box] for c in children) or None
        self._link.wait_for(ready)
        return [c.inbox[box].popleft() for c in children]

    def _check(self) -> None:
        """Raise what went wrong: a dead child first (the group is then stopped), else a child's error.
        Deaths are looked for before errors are reported: when a peer dies mid-collective, the
        survivors' "connection reset" errors can arrive before the death is noticed."""
        self._raise_if_failed()
        if self._first_error is not None:
            self._await_deaths(DEATH_GRACE)
            self._raise_if_failed()
            child = self._children[self._first_error]
            raise ChildError(child.rank, child.outcome[2])

    def _await_deaths(self, grace: float) -> None:
        """Look for a death among the children still running, for up to ``grace`` seconds. A SIGKILLed
        peer's sockets close (and its neighbours report "connection reset") a moment before the kernel
        lets us reap it; without this wait that error would hide the death that caused it."""
        deadline = time.monotonic() + grace
        while self._failure is None:
            self._find_deaths()
            running = [c for c in self._children if not (c.outcome and c.outcome[0] == self._exec_id)]
            if not running or time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            if not self._heal:      # a healing group waits for replace() or stop()
                self.stop(grace=1.0)
            raise self._failure

    def _give_up(self, failure: ChildFailed) -> None:
        self._failure = failure
        self.stop(grace=1.0)
        raise failure

    def _everyone(self) -> list[ChildProcess]:
        """The children, and the warm spare if there is one."""
        return self._children + ([self._starter.spare] if self._starter.spare is not None else [])

    def _dispatch(self, sender: bytes | None, message: tuple) -> None:
        # By current identity: a replaced child's old one is nobody's.
        child = next((c for c in self._everyone() if c.identity == sender), None)
        if child is None:
            log.warning("dropped a message from unknown peer %r", sender)
            return
        child.last_seen = time.monotonic()
        kind, ident, payload = message
        rank = child.rank
        if kind == "hello":
            child.connected, child.ready = True, bool(payload)
        elif kind == "ready":
            child.ready = True
        elif child is self._starter.spare:      # it runs nothing until it takes a dead rank's place
            return
        elif kind == "print":
            print(f"[{rank}] {payload}", flush=True)
        elif kind in ("yield", "data") and ident == self._exec_id:      # what older execs left is moot
            child.inbox[kind].append(payload)
        elif kind == "undecodable":
            self._record_error(child, "the parent could not decode a message from this child:\n" + payload,
                               still_running=True)
        elif kind == "error" and ident in (None, self._exec_id):        # None: the exec never decoded
            self._record_error(child, payload)
        elif kind == "result" and ident == self._exec_id and child.outcome is None:   # not after an error
            child.outcome = (ident, kind, payload)
        elif kind == "exchange":
            self._exchange(rank, ident, payload)

    def _record_error(self, child: ChildProcess, text: str, still_running: bool = False) -> None:
        """Keep the first error of this exec for each child, and report the exec's first one: the
        errors that follow (PeerFailed, mostly) are what the abort sent for it caused. An error the
        parent found (``still_running``) also aborts the child itself, which may be waiting."""
        if child.outcome and child.outcome[0] == self._exec_id and child.outcome[1] == "error":
            return
        child.outcome = (self._exec_id, "error", text)
        if self._first_error is None:
            self._first_error = child.rank
        self._abort_others(None if still_running else child.rank, f"child {child.rank} raised an exception")

    def _exchange(self, rank: int, tag: str, payload: tuple[list[int] | None, Any]) -> None:
        ranks, value = payload
        ranks = list(range(len(self._children))) if ranks is None else ranks
        expected, values = self._exchanges.setdefault(tag, (ranks, {}))
        if ranks != expected:
            self._record_error(self._children[rank], f"exchange {tag!r}: this child lists ranks {ranks}, "
                                                     f"another listed {expected}; every member must pass the same",
                               still_running=True)
            return
        values[rank] = value
        if all(r in values for r in ranks):
            del self._exchanges[tag]
            gathered = [values[r] for r in ranks]
            for r in ranks:
                self._send_if_alive(self._children[r], ("exchange", tag, gathered))

    def _abort_others(self, rank: int | None, reason: str) -> None:
        for child in self._children:
            if child.rank != rank and child.connected:
                self._send_if_alive(child, ("abort", self._exec_id, reason))

    def _send_if_alive(self, child: ChildProcess, message: tuple) -> None:
        try:
            self._link.send(message, to=child.identity)
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:     # the child is gone: nothing to tell it
                raise

    def _housekeeping(self) -> None:
        if not self._stopping:
            self._find_deaths()
        if self._launcher.remote:
            self._talk_to_remote_children()

    def _talk_to_remote_children(self) -> None:
        """Forward the signals ``signal()`` noted, and send heartbeats: a child that hears nothing
        from the parent for the heartbeat timeout exits (its host may have been cut off from ours)."""
        signals, self._signals = self._signals, []
        messages = [("signal", None, signum) for signum in signals]
        if time.monotonic() - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = time.monotonic()
            messages.append(("heartbeat", None, None))
        for child in self._children:
            if child.connected and child.process.poll() is None:
                for message in messages:
                    self._send_if_alive(child, message)

    def _find_deaths(self) -> None:
        if self._failure is not None:
            return
        now = time.monotonic()
        for child in self._children:
            returncode = child.process.poll()
            if returncode is not None:
                child.reader.join(timeout=1.0)        # let the last stderr lines arrive
                self._fail(child, describe_exit(returncode))
                return
            # Importing torch can hold the GIL for seconds (the heartbeat thread cannot run), more so on
            # a busy machine: a child still importing its preloads is given START_TIMEOUT.
            silent = now - child.last_seen
            if child.connected and silent > (self._heartbeat_timeout if child.ready else START_TIMEOUT):
                child.process.kill()
                self._fail(child, f"stopped responding (no heartbeat for {silent:.1f} s; killed)")
                return

    def _fail(self, child: ChildProcess, reason: str) -> None:
        self._failure = ChildFailed(child.rank, reason, child.stderr_tail, child.host)
        self._abort_others(child.rank, f"child {child.rank} {reason}")

    def _await_connections(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        done = self._link.wait_for(lambda: self._check() or (all(c.connected for c in self._children) or None),
                                   deadline)
        if done is None:
            late = [c for c in self._children if not c.connected]
            self.stop(grace=1.0)
            raise ChildFailed(late[0].rank, f"did not connect within {START_TIMEOUT:.0f} s (ranks "
                                            f"{[c.rank for c in late]})", late[0].stderr_tail, late[0].host)


class Parent:
    """Owns a run: its signing key, its private socket directory, and every group it forked.

    ``with Parent() as parent:`` guarantees that on exit every child is stopped and reaped."""

    def __init__(self, heartbeat_timeout: float = 30.0):
        if heartbeat_timeout <= 0:
            raise ValueError(f"heartbeat_timeout={heartbeat_timeout}: must be a positive number of seconds")
        self.heartbeat_timeout = heartbeat_timeout
        self._key = wire.new_key()
        self._dir = Path(tempfile.mkdtemp(prefix="harness-"))     # mode 0700: other users cannot connect
        self._context = zmq.Context.instance()
        self._groups: list[Children] = []
        self._count = itertools.count()

    def fork(self, n: int, gpus: placement.GpuSpec = None, env: Mapping[str, str] | None = None,
             preload: Sequence[str] = (), heal: bool = False, launcher: Launcher | str | None = None,
             hosts: str | None = None, hostfile: str | None = None, address: str | None = None,
             encrypt: bool = False) -> Children:
        """Start ``n`` children. ``gpus``: None for CPU children, "all" or a list of GPU indices.
        ``preload``: modules each child imports while it waits for its first exec (torch, say), so
        that a fork made before the parent's own slow work overlaps it. ``heal``: a failed child does
        not stop the group; ``Children.replace`` starts another in its place.
        ``launcher``: where they start (harness/launch/launchers.py: ``Local()``, the default, ``Ssh(hosts)``,
        ``Slurm()``, or by name as Train.py's flags say it: "local", "ssh" with ``hosts="node1:8,node2:8"``
        or ``hostfile``, "slurm"); on other hosts ``gpus`` names each host's GPUs ("all": one per child). Remote
        children reach the parent over TCP at ``address`` (default: this machine's address on the
        route to the first host); ``encrypt`` adds CurveZMQ to the signing (harness/control/endpoint.py)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n={n!r}): n must be a positive integer")
        if launcher is None or isinstance(launcher, str):
            launcher = make_launcher(launcher or "local", hosts, hostfile)
        places = launcher.place(n)
        if launcher.remote:
            assigned = placement.assign_on_hosts([(index, count) for _, index, count in places], gpus)
        else:
            assigned = placement.assign(n, placement.resolve_gpus(gpus))
        socket, where, secrets = endpoint.bind(self._context, launcher, self._dir, f"group-{next(self._count)}",
                                               address, encrypt)
        run = {**(env or {}), **secrets, "HARNESS_PRELOAD": ",".join(preload),
               "HARNESS_ENDPOINT": where, "HARNESS_KEY": self._key.hex()}
        environments = [spawn.environment(rank, n, gpu, place, launcher.remote, run, self.heartbeat_timeout)
                        for rank, (gpu, place) in enumerate(zip(assigned, places))]
        group = Children(n, self._key, socket, environments, self.heartbeat_timeout, heal, launcher,
                         [host for host, _, _ in places])
        self._groups.append(group)
        return group

    def close(self) -> None:
        """Stop every child of every group and remove the socket directory."""
        try:
            for group in self._groups:
                group.stop()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Parent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
