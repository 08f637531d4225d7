"""The parent's side of node agents: a launcher whose hosts are the nodes an engine started Train.py on.

Under torchrun, Kubeflow, a Slurm step, mpirun, SageMaker or SkyPilot the same ``python Train.py ...``
runs on every node. On node 0 it is the parent; on each other node a node agent
(harness/launch/agent.py) connects to it at the rendezvous address (harness/launch/cluster.py:
``rendezvous``), says which node it is, its address and how many workers it runs (its slots), and from
then on starts, signals and reports the children the parent asks it for. ``Agents`` is that parent's
launcher: node 0's own children are forked by the zygote here, as ``Local`` forks them, and every other
node's child is a ``RemoteChild`` (harness/launch/remote.py), as an ssh run's are. The rest is the run
an ``Ssh`` launcher makes: the children reach the parent over TCP and watch its
heartbeats, NCCL or gloo spans the nodes, a dead child is healed in place.

The link (one ROUTER here, one DEALER on each agent) is encrypted and signed with keys made from the key
every node shares (harness/launch/trust.py). Messages are (kind, payload):
agent -> parent: ("hello", {"node_rank", "nodes", "engine", "restart_count", "address", "slots", "gpus",
"host"}); parent -> agent: ("welcome", node_rank) or ("refused", reason) in answer to a hello; then the
messages of every host's forker (harness/launch/remote.py).

The job's restart count is the largest any node reports: torchrun counts a restart only on the node whose
process failed (the others restart theirs because the rendezvous changed), an agent that lost a parent
and found a new one counts that (a re-created pod has no count of its own), and the parent must resume
however its own node counts (``cluster``).

A node whose agent falls silent for the heartbeat timeout (or says hello again: it lost us) is lost:
its children are reported dead, and starting one there raises ``NodeLost``. Train.py then ends with an
exit status the engine retries (harness/launch/cluster.py: RETRY_EXIT); the restarted job resumes from
its checkpoint. One link thread owns the socket; other threads hand it messages through a queue.
"""
from __future__ import annotations

import errno
import functools
import itertools
import logging
import queue
import socket as sockets
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

import zmq

from harness.control import wire
from harness.control.errors import HostLost
from . import trust, zygote
from .cluster import ClusterStart
from .launchers import Host, Launcher, address_toward, remote_environment
from .placement import on_this_node
from .remote import HEARTBEAT, NEWS, POLL_MS, RemoteChild

log = logging.getLogger("harness")

WAIT_FOR_AGENTS = 300.0     # s node 0 waits for every other node's agent to connect
SAY_EVERY = 10.0            # s between the parent's lines saying which nodes it still waits for
NODE_0 = "the engine's master address (MASTER_ADDR) must name node 0, the machine this is"


class NodeLost(HostLost):
    """A node's agent is gone (its node died, or the network to it): the run cannot go on there."""


@dataclass
class Node:
    rank: int
    identity: bytes     # its ZeroMQ identity on the link
    address: str        # its address on the route to the parent: the host name of its children
    slots: int
    restart_count: int  # the engine's count of restarts on that node
    heard: float
    lost: str | None = None


class Agents(Launcher):
    """Node 0's launcher under an engine: waits for every other node's agent (``WAIT_FOR_AGENTS`` s), then
    its hosts are this node (``slots`` workers) and each agent's address, in node order."""

    remote = True

    def __init__(self, start: ClusterStart, where: tuple[str, int], key: bytes, slots: int,
                 heartbeat_timeout: float, wait: float = WAIT_FOR_AGENTS):
        self.cluster, self.heartbeat_timeout = start, heartbeat_timeout
        self._key = trust.derive(key, "sign")
        self._socket = trust.link_socket(zmq.Context.instance(), key, "parent")
        self._bind(*where)
        self._nodes: dict[int, Node] = {}
        self._children: dict[int, tuple[Node, RemoteChild]] = {}
        self._numbers = itertools.count()
        self._outbox: queue.Queue = queue.Queue()
        self._joined, self._closed = threading.Event(), threading.Event()
        self._error: str | None = None
        self._status: int | tuple[int, str] = 1
        self._thread = threading.Thread(target=self._serve, name="harness-agents", daemon=True)
        self._thread.start()
        self._await(wait)
        nodes = [self._nodes[rank] for rank in sorted(self._nodes)]
        hosts = [Host(address_toward(nodes[0].address), slots)] + [Host(n.address, n.slots) for n in nodes]
        if len({h.name for h in hosts}) < len(hosts):
            why = ("two nodes have the same address (" + ", ".join(h.name for h in hosts) + "): run one Train.py per "
                   "node, each on a machine of its own")
            self.close(1, why)
            raise ValueError(why)
        super().__init__(hosts)
        self._by_host = {n.address: n for n in nodes}
        self.cluster = replace(start, restart_count=max(start.restart_count, *(n.restart_count for n in nodes)))

    def _bind(self, host: str, port: int) -> None:
        """Listen on the rendezvous address as this node resolves it, or on every interface where it
        resolves to a loopback address (as /etc/hosts often maps a host's own name): the link is encrypted."""
        try:
            address = sockets.gethostbyname(host)
        except OSError as error:
            self._socket.close()
            raise ValueError(f"node 0 cannot listen for the other nodes on {host}:{port}: the name {host} does not "
                             f"resolve here ({error}); {NODE_0}") from None
        try:
            self._socket.bind(f"tcp://{'*' if address.startswith('127.') else address}:{port}")
        except (OSError, zmq.ZMQError) as error:
            self._socket.close()
            fix = (f"{host} ({address}) is not an address of this machine; {NODE_0}"
                   if error.errno == errno.EADDRNOTAVAIL else "set HARNESS_PORT to a free port on every node")
            raise ValueError(f"node 0 cannot listen for the other nodes on {host}:{port} ({error}); {fix}") from None

    def _await(self, wait: float) -> None:
        """Until every other node's agent has said hello; a ValueError naming those missing after ``wait`` s."""
        deadline = time.monotonic() + wait
        while True:
            joined = self._joined.wait(min(SAY_EVERY, max(0.0, deadline - time.monotonic())))
            missing = ", ".join(str(r) for r in range(1, self.cluster.nodes) if r not in self._nodes)
            if self._error or (not joined and time.monotonic() >= deadline):
                why = self._error or (f"nodes {missing} did not connect within {wait:.0f} s: check that they run "
                                      "Train.py with the same flags and the same key (HARNESS_KEY_FILE or "
                                      "HARNESS_KEY), and reach this node")
                self.close(1, why)
                raise ValueError(why)
            if joined:
                break
            print(f"node 0: waiting for node(s) {missing} to connect", flush=True)
        print("node 0: every node connected: " + ", ".join(f"node {n.rank} at {n.address} ({n.slots} slots)"
                                                          for n in sorted(self._nodes.values(), key=lambda n: n.rank)),
              flush=True)

    # -- the launcher --------------------------------------------------------------------------

    def start(self, host: str, env: Mapping[str, str]) -> zygote.Forked:
        if host == self.hosts[0].name:
            env = on_this_node(env)
            return zygote.for_environment(env).fork(env)
        node = self._by_host[host]
        if node.lost:
            raise NodeLost(f"node {node.rank} ({host}) is lost: {node.lost}")
        child = RemoteChild(functools.partial(self.post, node), next(self._numbers))
        self._children[child.number] = (node, child)
        self.post(node, ("start", (child.number, remote_environment(env))))
        return child

    def post(self, node: Node, message: tuple) -> None:
        """Send ``message`` to ``node``'s agent (from any thread: the link thread sends it)."""
        self._outbox.put((node.identity, message))

    def close(self, status: int = 0, why: str | None = None) -> None:
        """Tell every agent the run ended with exit status ``status`` (theirs too), and ``why`` where node 0 refused
        it (its agents' logs would otherwise say nothing of the reason), and close the link."""
        if not self._closed.is_set():
            self._status = (status, why) if why else status
            self._closed.set()
            self._thread.join()

    # -- the link thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        last_heartbeat = 0.0
        try:
            while not self._closed.is_set():
                if self._socket.poll(POLL_MS):
                    try:
                        self._receive(self._socket.recv_multipart(copy=False))
                    except (KeyError, TypeError, ValueError):      # authentic, but not what this version sends
                        log.exception("dropped a message on the node link that this harness cannot read")
                self._send_queued()
                if time.monotonic() - last_heartbeat >= HEARTBEAT:
                    last_heartbeat = time.monotonic()
                    for node in self._live():
                        self._send(node.identity, ("heartbeat", None))
                self._find_lost()
            self._send_queued()
            for node in self._live():
                self._send(node.identity, ("end", self._status))
        finally:
            self._socket.close(linger=2000)

    def _send(self, identity: bytes, message: tuple) -> None:
        try:
            self._socket.send_multipart([identity, *wire.pack(self._key, message)])
        except zmq.ZMQError as error:       # EHOSTUNREACH: the agent is gone; its silence will tell
            if message[0] != "heartbeat":
                log.warning("could not send %s to a node agent: %s", message[0], error)

    def _send_queued(self) -> None:
        while True:
            try:
                self._send(*self._outbox.get_nowait())
            except queue.Empty:
                return

    def _live(self) -> list[Node]:
        return [n for n in self._nodes.values() if not n.lost]

    def _receive(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            kind, payload = wire.unpack(self._key, [f.buffer for f in frames[1:]])
        except wire.BadSignature as error:
            log.warning("dropped a message on the node link from %r: %s (not unpickled)", identity, error)
            return
        node = next((n for n in self._nodes.values() if n.identity == identity), None)
        if kind == "hello":
            return self._hello(identity, payload)
        if node is None or node.lost:
            return
        node.heard = time.monotonic()
        if kind in NEWS and payload[0] in self._children:
            self._children[payload[0]][1].news(kind, payload[1])

    def _hello(self, identity: bytes, hello: dict[str, Any]) -> None:
        """A node's agent: welcomed while nodes are awaited; a node that says hello again later has lost us
        (its children are gone with the link)."""
        nodes, rank = self.cluster.nodes, hello["node_rank"]
        if hello["nodes"] != nodes or not 0 < rank < nodes:
            refused = (f"node {rank} at {hello['address']} was started for a job of {hello['nodes']} nodes, but node 0 "
                       f"for one of {nodes}: every node must be started by the same job (check --nnodes, the "
                       "job's replicas or node count)")
            self._send(identity, ("refused", refused))
            self._error = self._error or refused
            self._joined.set()      # wakes the wait, which raises the error
            return
        if rank in self._nodes and self._joined.is_set():
            self._lose(self._nodes[rank], "its agent lost the link and connected again")
            self._send(identity, ("refused", "the run it served is gone; wait for the engine to restart the job"))
            return
        self._nodes[rank] = Node(rank, identity, hello["address"], hello["slots"], hello["restart_count"],
                                 time.monotonic())
        self._send(identity, ("welcome", rank))
        if len(self._nodes) == nodes - 1:
            self._joined.set()

    def _find_lost(self) -> None:
        now = time.monotonic()
        for node in self._live():
            if self._joined.is_set() and now - node.heard > self.heartbeat_timeout:
                self._lose(node, f"no heartbeat from its agent for {now - node.heard:.1f} s")

    def _lose(self, node: Node, why: str) -> None:
        node.lost = why
        log.warning("node %d (%s) is lost: %s", node.rank, node.address, why)
        for where, child in list(self._children.values()):
            if where is node and child.returncode is None:
                child.ended(1, f"harness: node {node.rank} ({node.address}) is lost: {why}")
