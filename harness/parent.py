"""The parent: forks child workers and talks to them. It never touches CUDA; it supervises.

``Parent`` owns the run (its signing key and private socket directory); ``Parent.fork`` starts a
group of ``Children`` (forked by a warm interpreter that imported their preloads once:
harness/launch/zygote.py; on other hosts by such a one in each host's session, started over ssh or
srun) and returns at once: the first exec waits for them to connect. The group's API reads like Lua's
``parallel``: exec, join, send, scatter, receive, wait. Every blocking call also watches the children: a child
that exits or stops sending heartbeats ends the call with ``ChildFailed`` in seconds, after the
others have been told to abort and have been stopped. Nothing hangs and nothing is left running.

This file holds the verbs; the machinery behind them is in harness/control/: starting children and
the warm spare (``spawn``), watching them, aborting and stopping (``supervise``), sorting what they
send (``mailbox``), healing (``replace``) and the signed socket they share (``link``, ``wire``).

Children may run on other hosts: ``fork(..., launcher=Ssh(hosts))`` or ``Slurm()`` (harness/launch/launchers.py)
forks them there through one session a host (harness/launch/session.py), and the group talks over TCP
(harness/control/endpoint.py). The parent then
also sends heartbeats, so that a child cut off from it exits by itself, and forwards signals as
messages; a failure names the child's host.

A group forked with ``heal=True`` is not stopped when a child fails: the call still raises
``ChildFailed``, the survivors are still told to abort their collectives, but they stay alive,
and ``replace(rank)`` puts a new child in the dead one's place, hands it the running exec and
tells the survivors (harness/child.py: ``await_heal``). The new child is the warm spare where there
is one. What the ranks do then is the running code's business (harness/resilience/heal.py is
Train.py's); the caller may instead ``stop()`` the group.
"""
from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import zmq

from .control import endpoint, spawn, wire
from .control.errors import ChildError, ChildFailed
from .control.link import Link
from .control.mailbox import Mailbox
from .control.replace import replace_rank, salvage
from .control.spawn import Starter
from .control.supervise import STOP_GRACE, Supervisor
from .launch import placement
from .launch.launchers import Launcher, Local, make_launcher

__all__ = ["Parent", "Children", "ChildHandle", "ChildError", "ChildFailed"]


class ChildHandle:
    """One child of a group: ``kids[1].send(x)``, ``kids[1].receive()``."""

    def __init__(self, group: "Children", rank: int):
        self._group, self.rank = group, rank

    @property
    def pid(self) -> int:
        return self._group._watch.children[self.rank].pid

    def send(self, obj: Any) -> None:
        self._group._send("data", [(self.rank, obj)])

    def receive(self) -> Any:
        return self._group._mail.take("data", [self.rank])[0]


class Children:
    """A group of child workers, ranks 0..n-1, and its verbs. Made by ``Parent.fork``.

    Behind the verbs: a ``Supervisor`` watches the children and holds the group's state, a ``Mailbox``
    sorts what they send, and ``replace_rank`` heals (harness/control/supervise.py, mailbox.py, replace.py)."""

    def __init__(self, n: int, key: bytes, socket: zmq.Socket, environments: list[dict[str, str]],
                 heartbeat_timeout: float, heal: bool = False, launcher: Launcher | None = None,
                 hosts: Sequence[str] = (), independent: bool = False):
        launcher = launcher or Local()
        self._hosts = list(hosts) or ["localhost"] * n
        starter = Starter(launcher, self._hosts, environments, keep_spare=heal and not launcher.remote)
        self._watch = Supervisor(starter, heartbeat_timeout, heal, launcher.remote, independent)
        self._mail = Mailbox(self._watch)
        self._link = Link(socket, key, self._mail.dispatch, self._watch.housekeeping)
        self._watch.start(self._link)

    def __len__(self) -> int:
        return len(self._watch.children)

    def __getitem__(self, rank: int) -> ChildHandle:
        if not 0 <= rank < len(self):
            raise IndexError(f"rank {rank} out of range: this group has ranks 0..{len(self) - 1}")
        return ChildHandle(self, rank)

    @property
    def pids(self) -> list[int]:
        """The children's process ids (a remote child's on its host)."""
        return [c.pid for c in self._watch.children]

    @property
    def remote(self) -> bool:
        """Whether the children run on other hosts (their ``pids`` are those hosts')."""
        return self._watch.remote

    @property
    def hosts(self) -> list[str]:
        """The hosts the group runs on, in rank order, each once."""
        return list(dict.fromkeys(self._hosts))

    def exec(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> None:
        """Run ``fn(ctx, *args, **kwargs)`` in every child (shipped with cloudpickle); returns at once. ``fn`` may
        be a ``"package.module:function"`` name the children import: the parent need not import its module."""
        self._watch.raise_if_failed()
        self._usable("exec", running=False)
        call = (fn, args, kwargs)
        # The socket thread handles messages under the link's lock: one of the last exec is then handled as the
        # last exec's, or dropped as old, never half of each.
        with self._link.lock:
            self._watch.begin(call)
            self._mail.forget_exchanges()
        self._send("exec", [(rank, call) for rank in range(len(self))])

    def serve(self, name: str, handler: Callable[[int, Any], list[tuple[int, Any]]]) -> None:
        """Answer ``ctx.request(name, payload)`` with ``handler(rank, payload)``: the (rank, answer) pairs due
        now (none: the child waits). It runs on the parent's socket thread and must not block."""
        self._mail.serve(name, handler)

    def join(self, msg: Any = None) -> list:
        """Wait until every child has called ``ctx.yield_``; hand each ``msg``; return the yielded values."""
        self._usable("join")
        values = self._mail.take("yield")
        self._send("join", [(rank, msg) for rank in range(len(self))])
        return values

    def send(self, obj: Any) -> None:
        """Send the same object to every child."""
        self._usable("send", running=False)
        self._send("data", [(rank, obj) for rank in range(len(self))])

    def scatter(self, objs: Sequence[Any]) -> None:
        """Send ``objs[r]`` to child r."""
        if len(objs) != len(self):
            raise ValueError(f"scatter needs one object per child: got {len(objs)} for {len(self)} children")
        self._usable("scatter", running=False)
        self._send("data", enumerate(objs))

    def receive(self) -> list:
        """The next object each child sent, in rank order."""
        self._usable("receive")
        return self._mail.take("data")

    def _usable(self, call: str, running: bool = True) -> None:
        """Refuse a call the group cannot answer, which would fail deep in ZeroMQ or wait for ever: any after
        ``stop()`` (or its Parent's close), and with ``running`` one that waits on the children's function before
        any was exec'd. A group stopped because a child died raises that death instead (``ChildFailed``)."""
        if self._watch.stopping and self._watch.failure is None:
            raise RuntimeError(f"{call}() on a group that was stopped (stop(), or its Parent closed); fork a new one")
        if running and self._watch.exec_id == 0:
            raise RuntimeError(f"{call}() called before exec(): nothing is running")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every child still running. Safe in a signal handler (it only calls
        ``os.kill``): that is how the parent forwards Ctrl-C and SIGTERM (harness/resilience/interrupt.py).
        Children on other hosts get it as a message, sent at the next housekeeping tick."""
        self._watch.signal(signum)

    def wait(self) -> list:
        """Wait for the function of the last ``exec`` to return in every child; its values in rank order."""
        self._usable("wait")
        self._watch.wait_for(lambda: all(c.outcome for c in self._watch.children) or None)
        return [c.outcome[2] for c in self._watch.children]

    def replace(self, rank: int) -> None:
        """Heal a group forked with ``heal=True`` after ``ChildFailed`` named ``rank``: start a new child
        as that rank (same GPU and environment), give it the running exec, and send the survivors
        the heal notice ({"generation", "replaced"}) they wait for in ``ctx.await_heal``. Raises
        ``ChildFailed`` (having stopped the group) if the new child does not connect, or if a survivor's
        exec has already ended: that group cannot be healed."""
        if not self._watch.heal:
            raise RuntimeError("replace() needs a group forked with heal=True")
        with self._link.lock:           # as in exec(): not while the socket thread is in an exchange
            self._mail.forget_exchanges()
        replace_rank(self._watch, rank)

    def salvage(self, rank: int, answered: Callable[[Any], bool], timeout: float = 120.0) -> list:
        """After ``replace(rank)`` raised ``HostLost``: the survivors learn that no heal is coming, and the lowest
        live rank among them saves what it holds (harness/control/replace.py); what it sent until
        ``answered(item)``, its death or ``timeout`` s."""
        return salvage(self._watch, rank, answered, timeout)

    def watch_silence(self, notify: Callable[[int, float | None], None]) -> None:
        """Call ``notify(rank, seconds)`` when a child has sent nothing for a third of the heartbeat
        timeout, and ``notify(rank, None)`` when it is heard again (from the housekeeping thread)."""
        self._watch.on_silent = notify

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every child (asking first, then SIGKILL after ``grace`` s), reap them, close the socket."""
        self._watch.stop(grace)

    def _send(self, kind: str, payloads: Iterable[tuple[int, Any]]) -> None:
        """Send (kind, the running exec's id, payload) to each rank of ``payloads``' (rank, payload) pairs."""
        self._watch.send_all([(rank, (kind, self._watch.exec_id, payload)) for rank, payload in payloads])


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
        self._launchers: list[Launcher] = []     # those fork made from a name: this parent releases them
        self._count = itertools.count()

    def fork(self, n: int, gpus: placement.GpuSpec = None, env: Mapping[str, str] | None = None,
             preload: Sequence[str] = (), heal: bool = False, launcher: Launcher | str | None = None,
             hosts: str | None = None, hostfile: str | None = None, address: str | None = None,
             encrypt: bool = False, independent: bool = False) -> Children:
        """Start ``n`` children. ``gpus``: None for CPU children, "all" or a list of GPU indices.
        ``preload``: modules each child imports while it waits for its first exec (torch, say), so
        that a fork made before the parent's own slow work overlaps it. ``heal``: a failed child does
        not stop the group; ``Children.replace`` starts another in its place. ``independent``: the children
        share no collective, so with ``heal`` a death does not abort the survivors' running function either (they
        learn of the heal from the running code's own messages: harness/collectives/server.py).
        ``launcher``: where they start (harness/launch/launchers.py: ``Local()``, the default, ``Ssh(hosts)``,
        ``Slurm()``, or by name as Train.py's flags say it: "local", "ssh" with ``hosts="node1:8,node2:8"``
        or ``hostfile``, "slurm"); on other hosts ``gpus`` names each host's GPUs ("all": one per child). Remote
        children reach the parent over TCP at ``address`` (default: this machine's address on the
        route to the first host); ``encrypt`` adds CurveZMQ to the signing (harness/control/endpoint.py)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n={n!r}): n must be a positive integer")
        if launcher is None or isinstance(launcher, str):
            launcher = make_launcher(launcher or "local", hosts, hostfile)
            self._launchers.append(launcher)
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
                         [host for host, _, _ in places], independent)
        self._groups.append(group)
        return group

    def close(self) -> None:
        """Stop every child of every group, end the remote hosts' sessions of the launchers ``fork`` made
        (one passed in is its maker's to release) and remove the socket directory."""
        try:
            for group in self._groups:
                group.stop()
        finally:
            for launcher in self._launchers:
                launcher.release()
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Parent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
