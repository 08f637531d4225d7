"""Which engine started this process, if any: torchrun, Kubeflow, a Slurm job step, MPI, SageMaker, SkyPilot.

These engines start the same command on every node and say who each process is through environment
variables. Train.py starts its own workers (one per GPU, or --cpu-workers), so it must run once per node. On
node 0 it becomes the parent; on every other node a node agent (harness/launch/agent.py) that finds
the parent at the rendezvous address (``rendezvous``) and starts that node's workers for it.

Detection goes in a fixed order, the first match wins, and it looks for what only a start by that
engine sets, so that none is mistaken for another (the peers' trackers show each of these mistakes):

1. torchrun: ``TORCHELASTIC_RUN_ID`` (also inside a Slurm step or a pod: the process is torchrun's).
2. Kubeflow Trainer v2: ``PET_NNODES`` and ``PET_NODE_RANK``.
3. Kubeflow PyTorchJob: ``KUBERNETES_SERVICE_HOST`` with ``MASTER_ADDR``, ``WORLD_SIZE`` and ``RANK``
   (the pod's index, not a process rank); ``KUBERNETES_PORT`` alone is any pod, not a start.
4. Slurm: ``SLURM_STEP_ID`` with ``SLURM_PROCID``: a task of a job step; an allocation without a
   step (``salloc``'s shell, the batch script itself, whichever step id Slurm gives them) is not a start.
5. MPI: Open MPI's ``OMPI_COMM_WORLD_SIZE``, or PMI's ``PMI_SIZE`` (MPICH, Intel MPI).
6. SageMaker: ``SM_HOSTS`` and ``SM_CURRENT_HOST``.
7. SkyPilot: ``SKYPILOT_NODE_RANK`` and ``SKYPILOT_NODE_IPS``.

``--cluster none`` turns detection off; ``--cluster NAME`` insists on that engine (and fails where its
variables are missing).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Mapping

from .launchers import expand_nodelist, slurm_node_address

# Slurm's step ids of a job's batch script, its interactive step and its external step (slurm.h's
# SLURM_BATCH_SCRIPT, SLURM_INTERACTIVE_STEP, SLURM_EXTERN_CONT): the job's own shell, not a task srun started.
SLURM_SPECIAL_STEPS = ("4294967294", "4294967291", "4294967295")
# Train.py's exit status when workers died more often than --max-restarts allows and an engine started it:
# >= 128, which engines' restart policies retry (a PyTorchJob's ExitCode policy, torchrun's --max-restarts),
# and above 128 + any signal's number. The restarted job resumes from its checkpoint by itself.
RETRY_EXIT = 200
ENGINES = ("torchrun", "kubeflow", "slurm", "mpi", "sagemaker", "skypilot")
CHOICES = ("auto", "none", *ENGINES)
# The port node 0's parent listens on for the other nodes' agents where the engine names none (Slurm,
# MPI, SageMaker, SkyPilot without MASTER_PORT); HARNESS_PORT overrides it under every engine.
DEFAULT_PORT = 29500
# torchrun's store listens on a port of the kernel's ephemeral range (Linux's default starts at 32768), where the port
# after it may be any connection's local port (one was: "Address already in use"). The parent's port beside it is
# folded below that range, into [BELOW_EPHEMERAL, EPHEMERAL), the same on every node.
EPHEMERAL, BELOW_EPHEMERAL = 32768, 20000


@dataclass(frozen=True)
class ClusterStart:
    """What an engine said about this process: ``node_rank`` of ``nodes``, how many processes it started
    on each node, and how often it has restarted the job."""
    engine: str
    node_rank: int
    nodes: int
    per_node: int = 1
    restart_count: int = 0

    def record(self) -> dict:
        """metrics.jsonl's "cluster" record."""
        return {"event": "cluster", "engine": self.engine, "node_rank": self.node_rank, "nodes": self.nodes,
                "restart_count": self.restart_count}

    def describe(self) -> str:
        return f"started by {self.engine}: node {self.node_rank} of {self.nodes}, restart {self.restart_count}"


def _int(env: Mapping[str, str], name: str, default: int = 0) -> int:
    return int(env.get(name, default))


def _torchrun(env: Mapping[str, str]) -> ClusterStart | None:
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    per_node = _int(env, "LOCAL_WORLD_SIZE", 1)
    nodes = _int(env, "GROUP_WORLD_SIZE", 0) or _int(env, "WORLD_SIZE", per_node) // per_node
    return ClusterStart("torchrun", _int(env, "GROUP_RANK"), nodes, per_node, _int(env, "TORCHELASTIC_RESTART_COUNT"))


def _kubeflow(env: Mapping[str, str]) -> ClusterStart | None:
    if "PET_NNODES" in env and "PET_NODE_RANK" in env:        # Trainer v2 (and PyTorchJob's elastic mode)
        nodes = env["PET_NNODES"].split(":")[-1]               # "2" or an elastic "1:4"
        return ClusterStart("kubeflow", _int(env, "PET_NODE_RANK"), int(nodes), _int(env, "PET_NPROC_PER_NODE", 1))
    if "KUBERNETES_SERVICE_HOST" in env and all(k in env for k in ("MASTER_ADDR", "WORLD_SIZE", "RANK")):
        return ClusterStart("kubeflow", _int(env, "RANK"), _int(env, "WORLD_SIZE"))
    return None


def _slurm(env: Mapping[str, str]) -> ClusterStart | None:
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env or env["SLURM_STEP_ID"] in SLURM_SPECIAL_STEPS:
        return None
    nodes = _int(env, "SLURM_STEP_NUM_NODES", 0) or _int(env, "SLURM_NNODES", 1)
    tasks = _int(env, "SLURM_STEP_NUM_TASKS", 0) or _int(env, "SLURM_NTASKS", nodes)
    return ClusterStart("slurm", _int(env, "SLURM_NODEID"), nodes, -(-tasks // nodes), _int(env, "SLURM_RESTART_COUNT"))


def _mpi(env: Mapping[str, str]) -> ClusterStart | None:
    if "OMPI_COMM_WORLD_SIZE" in env:     # OMPI_COMM_WORLD_NODE_RANK is a rank on the node, not the node's
        per_node = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        return ClusterStart("mpi", _int(env, "OMPI_COMM_WORLD_RANK") // per_node,
                            _int(env, "OMPI_COMM_WORLD_SIZE") // per_node, per_node)
    if "PMI_SIZE" in env:
        per_node = _int(env, "MPI_LOCALNRANKS", 1)
        return ClusterStart("mpi", _int(env, "PMI_RANK") // per_node, _int(env, "PMI_SIZE") // per_node, per_node)
    return None


def _sagemaker(env: Mapping[str, str]) -> ClusterStart | None:
    if "SM_HOSTS" not in env or "SM_CURRENT_HOST" not in env:
        return None
    hosts = json.loads(env["SM_HOSTS"])
    return ClusterStart("sagemaker", hosts.index(env["SM_CURRENT_HOST"]), len(hosts))


def _skypilot(env: Mapping[str, str]) -> ClusterStart | None:
    if "SKYPILOT_NODE_RANK" not in env or "SKYPILOT_NODE_IPS" not in env:
        return None
    return ClusterStart("skypilot", _int(env, "SKYPILOT_NODE_RANK"), len(env["SKYPILOT_NODE_IPS"].split()))


DETECTORS: dict[str, Callable[[Mapping[str, str]], ClusterStart | None]] = {
    "torchrun": _torchrun, "kubeflow": _kubeflow, "slurm": _slurm, "mpi": _mpi, "sagemaker": _sagemaker,
    "skypilot": _skypilot}


def detect(env: Mapping[str, str], cluster: str = "auto") -> ClusterStart | None:
    """The engine that started this process (in the module's order), or None; ``cluster``: "auto", "none"
    or an engine's name, whose variables must then be there."""
    if cluster not in CHOICES:
        raise ValueError(f"--cluster {cluster}: choose one of {', '.join(CHOICES)}")
    if cluster == "none":
        return None
    if cluster != "auto":
        found = DETECTORS[cluster](env)
        if found is None:
            raise ValueError(f"--cluster {cluster}: this process was not started by {cluster} (its variables are "
                             "not set); use --cluster auto, or none for a plain start")
        return found
    return next((found for detector in DETECTORS.values() if (found := detector(env)) is not None), None)


def lost_workers_exit(cluster: str, env: Mapping[str, str]) -> int:
    """The exit status for a run whose workers died past --max-restarts: RETRY_EXIT where an engine started
    this process (it restarts the job, which resumes), else 1."""
    try:
        return RETRY_EXIT if detect(env, cluster) is not None else 1
    except ValueError:
        return 1


def check_start(start: ClusterStart | None) -> None:
    """What Train.py can do under an engine: one process per node (it starts the workers itself)."""
    if start is None:
        return
    if start.per_node > 1:
        raise ValueError(f"{start.engine} started {start.per_node} processes on this node; Train.py starts one worker "
                         f"per GPU itself, so start one process per node ({_one_per_node(start.engine)})")
    if not 0 <= start.node_rank < start.nodes:
        raise ValueError(f"{start.engine} says this is node {start.node_rank} of {start.nodes}: a node rank must be "
                         f"0..{start.nodes - 1}; check the job's node count")


def unbind_from_mpi(start: ClusterStart | None) -> str | None:
    """Open MPI binds each process it starts to a core by default (to a socket past two processes a node),
    which suits an MPI rank, but a node's Train.py starts all of that node's workers and their data loaders,
    and bound, they would share that core (measured: the first update 1.76x later than over ssh on the
    tests' namespaced hosts). Under MPI the calling thread, Train.py's main one, whose children inherit its
    mask, takes every CPU the node lets it have (a cpuset or a cgroup still limits it) before anything is
    started; returns the line saying so, or None where nothing changed."""
    if start is None or start.engine != "mpi" or not hasattr(os, "sched_setaffinity"):
        return None
    bound = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        return None
    widened = os.sched_getaffinity(0)
    if widened == bound:
        return None
    return (f"mpi bound this process to CPU{'s' * (len(bound) > 1)} {','.join(map(str, sorted(bound)))}; it runs "
            f"this node's workers, so it takes all {len(widened)} (mpirun --bind-to none says so itself)")


def rendezvous(start: ClusterStart, env: Mapping[str, str]) -> tuple[str, int]:
    """(host, port) where node 0's parent listens for the other nodes' agents: the engine's master address
    (MASTER_ADDR; Kubeflow's PET_MASTER_ADDR; the NodeAddr of the Slurm step's first node; SageMaker's first host;
    SkyPilot's first IP) and HARNESS_PORT, else MASTER_PORT, else DEFAULT_PORT. Under torchrun MASTER_PORT
    is torchrun's own store (its rank 0 agent's TCPStore, shared with the workers), so the parent takes the port
    after it (``beside_torchrun``). MPI names no first node: the user passes MASTER_ADDR
    (``mpirun -x MASTER_ADDR=...``)."""
    host = env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR") or _first_node(start, env)
    if not host:
        raise ValueError(f"{start.engine} does not say which node is node 0: set MASTER_ADDR to its address on "
                         "every node (e.g. mpirun -x MASTER_ADDR=node1 ...)")
    port = env.get("HARNESS_PORT") or env.get("MASTER_PORT") or env.get("PET_MASTER_PORT") or str(DEFAULT_PORT)
    if not port.isdigit() or not 0 < int(port) < 65535:
        raise ValueError(f"port {port!r} (HARNESS_PORT or MASTER_PORT) is not a TCP port; set HARNESS_PORT=29500")
    if start.engine == "torchrun" and "HARNESS_PORT" not in env:
        return host, beside_torchrun(int(port))
    return host, int(port)


def beside_torchrun(store: int) -> int:
    """The port after torchrun's store, or where that is an ephemeral port, one folded below them (EPHEMERAL)."""
    after = store + 1
    return after if after < EPHEMERAL else BELOW_EPHEMERAL + (after - EPHEMERAL) % (EPHEMERAL - BELOW_EPHEMERAL)


def _first_node(start: ClusterStart, env: Mapping[str, str]) -> str | None:
    if start.engine == "slurm":
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        return slurm_node_address(expand_nodelist(nodes)[0]) if nodes else None
    if start.engine == "sagemaker":
        return json.loads(env["SM_HOSTS"])[0]
    if start.engine == "skypilot":
        return env["SKYPILOT_NODE_IPS"].split()[0]
    return None


def _one_per_node(engine: str) -> str:
    return {"torchrun": "torchrun --nproc-per-node 1", "slurm": "srun --ntasks-per-node 1",
            "mpi": "mpirun --npernode 1 (Open MPI) or -ppn 1", "kubeflow": "nprocPerNode: 1"}.get(engine, "one per node")
