"""How children start: on this machine, over ssh, or by Slurm's srun, behind one small interface.

A launcher places ranks on hosts (``Host(name, slots)`` in order, each host's slots filled in
turn) and turns (host, environment) into a local object that stands for the child as a process: the
child itself (``Local``: forked by the zygote, harness/launch/zygote.py), or a ``RemoteChild`` that the
host's session forked (``Ssh``, ``Slurm``: harness/launch/session.py). A session is one process a host,
started by the ``ssh`` client or an ``srun`` step the first time a child is placed there, which forks
that host's children from a zygote of its own; its stdin and stdout carry the parent's requests and the
children's pids, stderr lines and exit statuses. The parent watches a remote child as it watches a local
one: its exit is the child's death, a kill ends it, and a session that ends or falls silent is lost with
its children. We start children through what the cluster already has and keep our own control plane
and collectives; we do not manage the cluster.

The run's secrets (the signing key, the CurveZMQ keys) travel in the children's environments, never
in argv, which every user of a host can read with ``ps``: to a remote child, in the request on its
session's stdin. Sessions start in their own process session, so that the terminal's Ctrl-C reaches
the parent alone, which forwards it as a message (harness/resilience/interrupt.py).

Every host needs the same Python environment at the same path (``sys.executable``) and the same
checkout; a host without it fails at once, with a line naming the host and the path.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from harness import checkout
from harness.spelling import did_you_mean

from . import session, zygote
from .remote import RemoteChild

if TYPE_CHECKING:
    from .cluster import ClusterStart

LAUNCHERS = ("local", "ssh", "slurm")
# The parent's own variables a remote child also gets (beside those the parent sets for it).
FORWARDED = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "OMP_", "MKL_", "PYTHON", "HARNESS_")
ROOT = str(checkout.ROOT)      # the checkout, which holds harness/ and models/: a remote session's PYTHONPATH


@dataclass(frozen=True)
class Host:
    name: str       # what ssh or srun is given
    slots: int      # how many children it runs


class Launcher:
    """Starts children. ``remote``: they run on other hosts, so the control plane is TCP. ``cluster``: what
    the engine that started every node's process said of the whole job (node agents' launcher only)."""

    remote = False
    cluster: ClusterStart | None = None
    exit_notes: dict[int, str] = {}     # what the launcher's own exit statuses mean, for error messages

    def __init__(self, hosts: Sequence[Host]):
        if not hosts:
            raise ValueError("no hosts to start children on")
        self.hosts = list(hosts)

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    def place(self, n: int) -> list[tuple[str, int, int]]:
        """(host, index among the host's children, the host's number of children) for ranks 0..n-1."""
        if n > self.slots:
            raise ValueError(f"{n} children do not fit the hosts' {self.slots} slots "
                             f"({', '.join(f'{h.name}:{h.slots}' for h in self.hosts)})")
        places, left = [], n
        for host in self.hosts:
            here = min(host.slots, left)
            places += [(host.name, i, here) for i in range(here)]
            left -= here
        return places

    def start(self, host: str, env: Mapping[str, str]) -> subprocess.Popen:
        raise NotImplementedError

    def address_of(self, host: str) -> str:
        """The name or address by which this machine reaches ``host``: the route to it picks the
        address the parent listens on (harness/control/endpoint.py)."""
        return host

    def release(self) -> None:
        """End what the launcher keeps for its children (the remote hosts' sessions); a later start makes it
        again. Nothing on this machine: the zygotes are kept for the process (harness/launch/zygote.py)."""


class Local(Launcher):
    """Children on this machine (the default), forked by a warm interpreter that has imported their
    preloads once (harness/launch/zygote.py)."""

    def __init__(self) -> None:
        super().__init__([Host("localhost", sys.maxsize)])

    def start(self, host: str, env: Mapping[str, str]) -> zygote.Forked:
        return zygote.for_environment(env).fork(env)


class HostSessions(Launcher):
    """Children on other hosts, forked by a session on each (harness/launch/session.py): the first child
    placed on a host starts its session, which the launcher keeps until ``release`` (or this process's end)
    and starts again where one was lost. Subclasses say how a session starts (``session_command``)."""

    remote = True
    exit_notes = {session.LOST_STATUS: "its host's session was lost: the connection failed or dropped, or the "
                                       "host died"}

    def __init__(self, hosts: Sequence[Host]):
        super().__init__(hosts)
        self._sessions: dict[tuple[str, float], session.Session] = {}     # by host and heartbeat timeout
        self._lock = threading.Lock()

    def session_command(self, host: str, heartbeat_timeout: float) -> list[str]:
        raise NotImplementedError

    def start(self, host: str, env: Mapping[str, str]) -> RemoteChild:
        timeout = float(env["HARNESS_HEARTBEAT_TIMEOUT"])       # a remote child's environment has it (spawn.py)
        with self._lock:
            live = self._sessions.get((host, timeout))
            if live is None or live.lost:
                live = self._sessions[host, timeout] = session.Session(self.session_command(host, timeout), host,
                                                                       timeout)
        return live.start(remote_environment(env))

    def release(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for each in sessions:       # every host told first: a cut-off one's grace is not added to the others'
            each.end()
        for each in sessions:
            each.close()


class Ssh(HostSessions):
    """Children on other hosts over OpenSSH: the user's own config, keys and agent. ``command``: the
    ssh client and its options (default: $HARNESS_SSH, else ``ssh``), e.g. ``ssh -F cluster.conf``."""

    def __init__(self, hosts: Sequence[Host], command: str | None = None):
        super().__init__(hosts)
        self.command = shlex.split(command or os.environ.get("HARNESS_SSH") or "ssh")
        if not shutil.which(self.command[0]):
            raise ValueError(f"the ssh client '{self.command[0]}' is not installed here; install OpenSSH's "
                             "client (e.g. apt-get install openssh-client) or set HARNESS_SSH")

    def session_command(self, host: str, heartbeat_timeout: float) -> list[str]:
        python, here = shlex.quote(sys.executable), shlex.quote(os.getcwd())
        missing = shlex.quote(f"harness: {sys.executable} is missing on {host}: every host needs the same "
                              "Python environment at the same path")
        script = (f"test -x {python} || {{ echo {missing} >&2; exit 127; }}; cd {here} 2>/dev/null; "
                  f"PYTHONPATH={shlex.quote(ROOT)} exec {python} -c {shlex.quote(session.COMMAND)} {heartbeat_timeout}")
        return [*self.command, "-T", "-o", "BatchMode=yes", host, script]


class Slurm(HostSessions):
    """Children on the nodes of the Slurm allocation this runs in (salloc or sbatch): one ``srun`` job step
    a node runs its session. The parent runs on the first node, the allocation's tasks per node are the slots."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        super().__init__(slurm_hosts(environ))
        if not shutil.which("srun"):
            raise ValueError("--launcher slurm: srun is not on PATH; run inside a Slurm allocation (salloc/sbatch)")

    def session_command(self, host: str, heartbeat_timeout: float) -> list[str]:
        """One task holds the node's workers: it asks for the CPUs of all of them (the allocation's
        SLURM_CPUS_PER_TASK each), which a cgroup would otherwise hold to one task's."""
        slots = next(h.slots for h in self.hosts if h.name == host)
        cpus = slots * int(os.environ.get("SLURM_CPUS_PER_TASK") or 1)
        path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
        return ["srun", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}", f"--nodelist={host}", "--overlap",
                "--kill-on-bad-exit=1", "--export=ALL", "--quiet", "env", f"PYTHONPATH={path}", sys.executable, "-c",
                session.COMMAND, str(heartbeat_timeout)]

    def address_of(self, host: str) -> str:
        return slurm_node_address(host)


def slurm_node_address(node: str) -> str:
    """A Slurm node's NodeAddr, as Slurm itself reaches it (a node's name need not resolve in DNS); the
    name where scontrol cannot say."""
    try:
        shown = subprocess.run(["scontrol", "show", "node", "--oneliner", node], capture_output=True,
                               text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return node
    match = re.search(r"\bNodeAddr=(\S+)", shown)
    return match[1] if match else node


def remote_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What a remote child needs of its environment: what the parent set for it, and the parent's
    own settings for NCCL, gloo, threads and Python (the rest, PATH and HOME, is the host's)."""
    return {k: v for k, v in env.items() if os.environ.get(k) != v or k.startswith(FORWARDED)}


def make_launcher(name: str, hosts: str | None = None, hostfile: str | None = None) -> Launcher:
    """The launcher Train.py's ``--launcher``, ``--hosts`` and ``--hostfile`` name."""
    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher '{name}'{did_you_mean(name, LAUNCHERS)}; valid names: "
                         f"{', '.join(LAUNCHERS)}")
    if name == "ssh":
        if bool(hosts) == bool(hostfile):
            raise ValueError("--launcher ssh needs the hosts: --hosts node1:8,node2:8 or --hostfile PATH (one of them)")
        return Ssh(parse_hosts(hosts) if hosts else read_hostfile(hostfile))
    if hosts or hostfile:
        raise ValueError(f"--hosts and --hostfile go with --launcher ssh, not {name}"
                         + (" (Slurm's allocation names the hosts)" if name == "slurm" else ""))
    return Slurm() if name == "slurm" else Local()


def parse_hosts(text: str) -> list[Host]:
    """``node1:8,node2:8`` (host:slots; a host without ``:slots`` has one)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"--hosts: '{item}' is not host:slots with slots >= 1 (e.g. node1:8)")
        hosts.append(Host(name, int(slots)))
    if not hosts:
        raise ValueError(f"--hosts '{text}' names no host; use e.g. node1:8,node2:8")
    return hosts


def read_hostfile(path: str) -> list[Host]:
    """One host per line, as ``node1:8``, ``node1 slots=8`` (MPI's form) or ``node1``; # comments."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ValueError(f"--hostfile {path}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        item = f"{match[1]}:{match[2]}" if match else line
        if (" " in item or "\t" in item or "," in item) or not _one_host(item):
            raise ValueError(f"--hostfile {path} line {number}: {line!r} is not 'node1', 'node1:8' or "
                             "'node1 slots=8' (slots a whole number >= 1)")
        hosts += parse_hosts(item)
    if not hosts:
        raise ValueError(f"--hostfile {path} names no host")
    return hosts


def _one_host(item: str) -> bool:
    try:
        return len(parse_hosts(item)) == 1
    except ValueError:
        return False


def slurm_hosts(environ: Mapping[str, str]) -> list[Host]:
    """The allocation's nodes and tasks per node, from SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE."""
    nodes, tasks = environ.get("SLURM_JOB_NODELIST"), environ.get("SLURM_TASKS_PER_NODE")
    if not nodes or not tasks:
        raise ValueError("--launcher slurm: SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE are not set; run inside a "
                         "Slurm allocation (salloc or sbatch, with --ntasks-per-node = workers per node)")
    names, counts = expand_nodelist(nodes), expand_counts(tasks)
    if len(names) != len(counts):
        raise ValueError(f"SLURM_JOB_NODELIST={nodes} has {len(names)} nodes but SLURM_TASKS_PER_NODE={tasks} "
                         f"{len(counts)}")
    return [Host(name, count) for name, count in zip(names, counts)]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list: ``node[01-03,7],gpu-a1`` -> node01, node02, node03, node7, gpu-a1."""
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        match = re.search(r"\[([^\]]*)\]", item)
        if match is None:
            names.append(item)
            continue
        head, tail = item[:match.start()], item[match.end():]
        for part in match[1].split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names += expand_nodelist(f"{head}{number:0{len(low)}d}{tail}")
    return names


def expand_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"SLURM_TASKS_PER_NODE part '{part}' is not N or N(xM)")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def address_toward(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent: a UDP socket's connect
    only picks the route)."""
    try:
        target = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve host '{host}' ({error.strerror}) to find the address children reach "
                         "the parent on; pass it with --control-address") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))
        return probe.getsockname()[0]
