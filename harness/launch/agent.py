"""A node agent: what Train.py becomes on every node but node 0 when an engine started it on several.

It finds the parent (node 0's Train.py) at the rendezvous address (harness/launch/cluster.py), retrying
name resolution and connection until ``FIND_TIMEOUT`` and saying what it waits for: on Kubernetes the
master's name resolves only once its pod is up, and it refuses connections for seconds more. It says
hello (its node rank, the job's node count, its address, GPUs and slots), then serves the parent as every
host's forker does (harness/launch/remote.py: ``Served``): each child the parent asks for is forked here
by the zygote with the environment the parent made for it, and its pid, stderr lines and exit status go
back; signals and kills come as messages. The hello is harness/launch/agents.py's.

When the parent ends the run, the agent exits with the parent's exit status, so that the engine sees
every node end alike. An agent that hears nothing from the parent for the heartbeat timeout kills its
children and waits ``GRACE`` s for a parent at the same address (a re-created pod of the same name);
a parent that comes back starts a new run, told that the job restarted (the hello's restart count
counts the parents this agent lost), so that it resumes from its checkpoint as after an engine's
restart; else the agent exits RETRY_EXIT and the engine restarts the job, which resumes likewise.

SIGINT and SIGTERM: the engines signal every node at once (torchrun stopping a job to restart it, Slurm
cancelling a step), node 0 included, whose parent stops the whole run at one update and saves. So an
agent that gets one keeps serving until the parent ends the run (a second one ends it at once), and
exits at once if the parent falls silent meanwhile. It does not pass the signal on: node 0's own would
then count as a second one, which stops the run without saving.
"""
from __future__ import annotations

import os
import signal
import socket as sockets
import sys
import time
from dataclasses import replace
from typing import Any, Mapping

import zmq

from harness.control import wire
from . import trust
from .cluster import RETRY_EXIT, ClusterStart, rendezvous
from .launchers import address_toward
from .placement import resolve_gpus, visible_gpus
from .remote import Channel, Served

FIND_TIMEOUT = 300.0    # s an agent looks for the parent when the job starts
GRACE = 60.0            # s an agent that lost the parent waits for it to come back
ANSWER_WAIT = 5.0       # s an agent waits for the parent's answer to its hello before it tries again
SAY_EVERY = 5.0         # s between the lines saying what it waits for


class Refused(ValueError):
    """The parent refused this node: another job's node count, or a run this node no longer serves."""


def node_slots(gpus: str | None, workers_per_gpu: int, cpu_workers: int) -> tuple[int, int]:
    """(workers this node runs, its GPUs): ``workers_per_gpu`` on each GPU ``gpus`` names (default: every
    visible one), or ``cpu_workers`` where there is none."""
    found = resolve_gpus(gpus if gpus is not None else ("all" if visible_gpus() else None))
    return (len(found) * workers_per_gpu or cpu_workers), len(found)


def serve(start: ClusterStart, slots: int, gpus: int, heartbeat_timeout: float,
          env: Mapping[str, str] = os.environ, find_timeout: float = FIND_TIMEOUT) -> int:
    """Serve node 0's parent until it ends the run; returns the exit status for this node's Train.py.
    Raises ValueError (a one-line error) for a missing key, an unreachable parent or a refusal."""
    key = trust.preshared_key(env)
    trust.forget_key()
    host, port = rendezvous(start, env)
    deadline, served = time.monotonic() + find_timeout, 0
    with Signals() as signals:
        while True:
            # a parent found after one was lost runs the job again: a restart, whatever the engine counts
            hello = hello_of(replace(start, restart_count=start.restart_count + served), slots, gpus)
            try:
                socket = find_parent(host, port, key, hello, deadline)
            except (TimeoutError, Refused) as error:
                if not served:
                    raise ValueError(str(error)) from None
                print(f"node {start.node_rank}: {error}; exiting {RETRY_EXIT} for the engine to restart the job",
                      file=sys.stderr, flush=True)
                return RETRY_EXIT
            print(f"node {start.node_rank}: connected to the parent at {host}:{port}", flush=True)
            signals.serving = True
            status = Served(SignedLink(socket, key), heartbeat_timeout).run()
            signals.serving = False
            if status is not None:
                return status
            if signals.caught:      # this node was told to stop, and the parent is gone: nothing to wait for
                return 128 + signals.caught
            served += 1
            deadline = time.monotonic() + GRACE
            print(f"node {start.node_rank}: lost the parent; waiting up to {GRACE:.0f} s for it to come back",
                  file=sys.stderr, flush=True)


def hello_of(start: ClusterStart, slots: int, gpus: int) -> dict[str, Any]:
    """What an agent tells the parent of its node (``find_parent`` adds its address)."""
    return {"node_rank": start.node_rank, "nodes": start.nodes, "engine": start.engine,
            "restart_count": start.restart_count, "slots": slots, "gpus": gpus, "host": sockets.gethostname()}


def find_parent(host: str, port: int, key: bytes, hello: dict[str, Any], deadline: float) -> zmq.Socket:
    """A socket connected to the parent that welcomed ``hello``; TimeoutError at ``deadline`` saying what
    was waited for, Refused if the parent refused this node."""
    said = 0.0
    while True:
        address, why = reachable(host, port)
        if address is not None:
            socket = trust.link_socket(zmq.Context.instance(), key, "agent")
            socket.connect(f"tcp://{address}:{port}")
            socket.send_multipart(wire.pack(trust.derive(key, "sign"), ("hello", {**hello,
                                                                               "address": address_toward(address)})))
            answer = _answer(socket, key)
            if answer == "welcome":
                return socket
            socket.close()
            why = (f"{host}:{port} accepts connections but does not answer: it is not the parent yet, or it has "
                   "another key (HARNESS_KEY_FILE or HARNESS_KEY must hold the same key on every node)")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"found no parent at {host}:{port}: {why}")
        if time.monotonic() - said >= SAY_EVERY:
            said = time.monotonic()
            print(f"node {hello['node_rank']}: waiting for the parent: {why}", file=sys.stderr, flush=True)
        time.sleep(0.5)


def reachable(host: str, port: int) -> tuple[str | None, str]:
    """(the parent's address, "") once ``host`` resolves and its ``port`` accepts connections, else
    (None, what is missing)."""
    try:
        address = sockets.gethostbyname(host)
    except OSError as error:
        return None, (f"the name {host} does not resolve yet ({error}); a master's name on Kubernetes resolves once "
                      "its pod starts, elsewhere look for a typo in MASTER_ADDR")
    try:
        sockets.create_connection((address, port), timeout=2.0).close()
    except OSError as error:
        return None, f"{host}:{port} ({address}) does not accept connections yet ({error.strerror or error})"
    return address, ""


def _answer(socket: zmq.Socket, key: bytes) -> str | None:
    """"welcome", None (no answer within ANSWER_WAIT s); Refused if the parent refused this node."""
    deadline = time.monotonic() + ANSWER_WAIT
    while (left := deadline - time.monotonic()) > 0:
        if not socket.poll(int(left * 1000)):
            return None
        try:
            kind, payload = wire.unpack(trust.derive(key, "sign"), socket.recv_multipart())
        except wire.BadSignature:
            continue
        if kind == "refused":
            socket.close()
            raise Refused(payload)
        if kind == "welcome":
            return kind
    return None


class Signals:
    """SIGINT and SIGTERM: while the agent serves a run the first is noted (``caught``: node 0 got it too,
    and its parent stops the run) and a second ends the agent at once; while it looks for the parent,
    the first ends it."""

    def __init__(self) -> None:
        self.serving = False
        self.caught: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.caught or not self.serving:
            os.write(2, f"{name}: the node agent stops at once\n".encode())
            os._exit(128 + signum)
        self.caught = signum
        os.write(2, f"{name}: node 0's parent stops the run (again to stop this node at once)\n".encode())

    def __enter__(self) -> "Signals":
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


class SignedLink(Channel):
    """The agent's end of the node link: a ZeroMQ DEALER, every frame signed (harness/control/wire.py)."""

    def __init__(self, socket: zmq.Socket, key: bytes):
        self._socket, self._key = socket, trust.derive(key, "sign")

    def poll(self, timeout_ms: int) -> bool:
        return bool(self._socket.poll(timeout_ms))

    def receive(self) -> tuple | None:
        try:
            return wire.unpack(self._key, self._socket.recv_multipart())
        except wire.BadSignature:
            return None

    def send(self, message: tuple) -> None:
        self._socket.send_multipart(wire.pack(self._key, message))

    def close(self) -> None:
        self._socket.close()
