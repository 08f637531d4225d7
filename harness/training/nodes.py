"""A run an engine started on several nodes, as Train.py sees it: node 0 waits for the other nodes' agents
and uses them as its launcher (``nodes``); every other node serves node 0 as its agent (``serve_node``);
and every node ends with the exit status the run's end calls for (``exit_status``), which node 0 hands
the agents, so that the engine sees every node end alike (harness/launch/agents.py, agent.py).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from harness.control.errors import ChildFailed
from harness.launch import agent, trust
from harness.launch.agents import Agents, NodeLost
from harness.launch.cluster import lost_workers_exit, rendezvous
from harness.launch.launchers import Launcher
from harness.resilience.interrupt import Interrupted
from harness.resilience.recovery import GaveUp
from harness.training.checks import cluster_start
from harness.training.config import ConfigError, TrainConfig


def exit_status(error: BaseException, cluster: str = "none") -> int:
    """Train.py's exit status for a run that ended with ``error`` (see Train.main)."""
    if isinstance(error, ConfigError):
        return 2
    if isinstance(error, Interrupted):
        return 128 + error.signum
    if isinstance(error, (ChildFailed, GaveUp, NodeLost)):      # an engine that started us may start us again
        return lost_workers_exit(cluster, os.environ)
    return 1


def serve_node(config: TrainConfig) -> int | None:
    """On a node other than node 0 of a run an engine started on several: serve node 0's parent as this
    node's agent (harness/launch/agent.py) and return this process's exit status; None elsewhere."""
    start = cluster_start(config)
    if start is None or start.node_rank == 0:
        return None
    print(start.describe() + ": this node's agent serves node 0's parent", flush=True)
    try:
        slots, gpus = agent.node_slots(config.gpus, config.workers_per_gpu, config.cpu_workers)
        return agent.serve(start, slots, gpus, config.heartbeat_timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@contextlib.contextmanager
def nodes(config: TrainConfig) -> Iterator[Launcher | None]:
    """On node 0 of a run an engine started on several nodes: the launcher of every node's workers, once
    each node's agent has connected (harness/launch/agents.py); on its way out each agent is told the exit
    status. None for a run on one node."""
    start = cluster_start(config)
    if start is None or start.nodes == 1:
        yield None
        return
    try:
        slots, _ = agent.node_slots(config.gpus, config.workers_per_gpu, config.cpu_workers)
        launcher = Agents(start, rendezvous(start, os.environ), trust.preshared_key(os.environ), slots,
                          config.heartbeat_timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    trust.forget_key()
    try:
        yield launcher
    except BaseException as error:
        launcher.close(exit_status(error, config.cluster), str(error) if isinstance(error, ConfigError) else None)
        raise
    launcher.close(0)
