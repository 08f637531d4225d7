"""Cluster engines: the variables each sets for the process it starts (``RECORDED``), and engines over
the namespaced hosts of tests/helpers/netns_hosts.py, with a key file every node shares: torchrun from the
installed torch started in each namespace (``ip netns exec``), as a job script starts it on each node,
with the c10d rendezvous on node 0 (told so: the namespaces share the machine's host name, by which
torchrun would look for itself); pods as Kubeflow's PyTorchJob makes them, each with the variables the
operator sets and a hosts file of its own, in which the test makes the master's name resolvable when it
likes (``ip netns exec`` mounts /etc/netns/NAME/hosts over /etc/hosts); Debian's Open MPI ``mpirun``
over the namespaces' sshd (``mpirun``); and an sbatch job (``Job``) on the Slurm cluster over the same
namespaces."""
from __future__ import annotations

import json
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.launch.cluster import ClusterStart
from tests.helpers import TRAIN_PY
from tests.helpers.netns_hosts import Hosts

# What each engine sets for the process it starts, as its source sets it (trimmed to what matters):
# torch/distributed/elastic/agent/server/local_elastic_agent.py, kubeflow/trainer (v1 PyTorchJob's
# SetPodEnv, v2's torch plugin: PET_*), Slurm's srun, Open MPI's and MPICH's launchers, SageMaker, SkyPilot.
RECORDED = {
    "torchrun": ({"TORCHELASTIC_RUN_ID": "none", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                  "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                  "TORCHELASTIC_RESTART_COUNT": "2"}, ClusterStart("torchrun", 0, 1, 1, 2)),
    "pytorchjob": ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                    "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
                    "PYTHONUNBUFFERED": "1"}, ClusterStart("kubeflow", 2, 3)),
    "trainjob": ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
                  "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"},
                 ClusterStart("kubeflow", 1, 2)),
    "slurm": ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
               "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NODELIST": "node[0-1]"},
              ClusterStart("slurm", 1, 2)),
    # Open MPI 4.1.4's mpirun, --map-by node on two hosts (node 1's process): OMPI_COMM_WORLD_NODE_RANK
    # is its rank among the job's processes on its node, 0 on every node here, not the node's index.
    "openmpi": ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_NODE_RANK": "0", "PMIX_RANK": "1"},
                ClusterStart("mpi", 1, 2)),
    "openmpi-2-a-node": ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_NODE_RANK": "1"},
                         ClusterStart("mpi", 1, 2, 2)),
    "mpich": ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1", "MPI_LOCALRANKID": "0"},
              ClusterStart("mpi", 1, 2)),
    "sagemaker": ({"SM_HOSTS": json.dumps(["algo-1", "algo-2"]), "SM_CURRENT_HOST": "algo-2"},
                  ClusterStart("sagemaker", 1, 2)),
    "skypilot": ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2\n10.0.0.3", "SKYPILOT_NUM_NODES": "3"},
                 ClusterStart("skypilot", 0, 3)),
}


def key_file(directory: Path) -> Path:
    """A pre-shared key, as the docs say to make one."""
    path = directory / "harness.key"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


class Torchrun:
    """``python -m torch.distributed.run --nnodes N --nproc-per-node 1 ... Train.py FLAGS`` on each of the
    first ``nodes`` hosts, node i's output in directory/node{i}.out and .err. ``env``: added to every node's."""

    def __init__(self, hosts: Hosts, directory: Path, *flags: str, nodes: int = 2, max_restarts: int = 0,
                 env: dict[str, str] | None = None):
        self.dir, self.nodes = directory, nodes
        env = {**os.environ, "HARNESS_KEY_FILE": str(key_file(directory)), "PYTHONUNBUFFERED": "1", **(env or {})}
        # Below the kernel's ephemeral ports (32768 up), which a connection may hold; torchrun's store for the workers
        # (MASTER_PORT) is another port, its own pick (node 0's parent listens beside it: harness/launch/cluster.py).
        endpoint = f"{hosts.addresses[0]}:{random.randrange(10000, 20000)}"
        self.processes = []
        for i in range(nodes):
            command = ["ip", "netns", "exec", hosts.namespaces[i], sys.executable, "-m", "torch.distributed.run",
                       "--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       endpoint, "--rdzv-id", "harness-test", "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", hosts.addresses[i], "--max-restarts",
                       str(max_restarts), "--monitor-interval", "0.5", *TRAIN_PY, *flags]
            with open(directory / f"node{i}.out", "w") as out, open(directory / f"node{i}.err", "w") as err:
                self.processes.append(subprocess.Popen(command, env=env, cwd=directory, stdout=out, stderr=err,
                                                       start_new_session=True))

    def output(self, node: int) -> str:
        return (self.dir / f"node{node}.out").read_text() + (self.dir / f"node{node}.err").read_text()

    def running(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def tail(self) -> str:
        return "\n".join(f"--- node {i}:\n{self.output(i)[-3000:]}" for i in range(self.nodes))

    def wait(self, timeout: float = 180.0) -> list[int]:
        """Every node's exit status (torchrun's); the processes are killed if they outlast ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(max(0.1, deadline - time.monotonic())) for p in self.processes]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchrun still running after {timeout} s:\n{self.tail()}") from None
        finally:
            self.kill()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()


def mpirun(hosts: Hosts, directory: Path, *flags: str, nodes: int = 2) -> subprocess.CompletedProcess:
    """``mpirun --map-by node`` of ``python Train.py FLAGS`` on the first ``nodes`` hosts, started over their
    sshd (as root, which Open MPI must be told is meant), with MASTER_ADDR and the key file passed on as
    the docs say (``-x``)."""
    key = key_file(directory)
    command = ["mpirun", "--allow-run-as-root", "-np", str(nodes), "--map-by", "node", "--host",
               ",".join(hosts.addresses[:nodes]), "--mca", "plm_rsh_agent", hosts.ssh, "--mca", "oob_tcp_if_include",
               f"{hosts.subnet}.0/24", "-x", f"MASTER_ADDR={hosts.addresses[0]}", "-x", f"HARNESS_KEY_FILE={key}",
               "-x", "PYTHONUNBUFFERED=1", sys.executable, *TRAIN_PY, *flags]
    return subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=180)


class PyTorchJob:
    """A PyTorchJob named ``name`` of a master and ``workers`` workers over the first hosts, pod i in
    namespace i, as the training operator (kubeflow/trainer, pytorch SetPodEnv) and the kubelet set them up:
    MASTER_ADDR is the master's service name, RANK the pod's index, WORLD_SIZE the number of pods. Only the
    master's pod resolves the name at first (``resolve`` makes a worker's pod resolve it too); ``start(i)``
    starts (or, once it ended, re-creates) pod i's ``python Train.py FLAGS``, its output in
    directory/pod{i}.out and .err (appended to). ``env``: added to every pod's."""

    PORT = 23456        # the operator's default pytorchjob-port

    def __init__(self, hosts: Hosts, directory: Path, *flags: str, name: str = "mnist", workers: int = 1,
                 env: dict[str, str] | None = None):
        self.hosts, self.dir, self.flags, self.pods = hosts, directory, flags, workers + 1
        self.master = f"{name}-master-0"
        self.env = {**os.environ, "HARNESS_KEY_FILE": str(key_file(directory)), "PYTHONUNBUFFERED": "1",
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                    "MASTER_ADDR": self.master, "MASTER_PORT": str(self.PORT), "WORLD_SIZE": str(self.pods),
                    **(env or {})}
        self.processes: dict[int, subprocess.Popen] = {}
        for i in range(self.pods):
            folder = Path("/etc/netns") / hosts.namespaces[i]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("127.0.0.1 localhost\n")
        self.resolve(0)

    def resolve(self, pod: int) -> None:
        """Make the master's name resolve in pod ``pod`` (appended in place: the mount shows the same file)."""
        with open(Path("/etc/netns") / self.hosts.namespaces[pod] / "hosts", "a") as hosts:
            hosts.write(f"{self.hosts.addresses[0]} {self.master}\n")

    def start(self, pod: int) -> None:
        command = ["ip", "netns", "exec", self.hosts.namespaces[pod], sys.executable, *TRAIN_PY,
                   *self.flags]
        with open(self.dir / f"pod{pod}.out", "a") as out, open(self.dir / f"pod{pod}.err", "a") as err:
            self.processes[pod] = subprocess.Popen(command, env={**self.env, "RANK": str(pod)}, cwd=self.dir,
                                                   stdout=out, stderr=err, start_new_session=True)

    def output(self, pod: int) -> str:
        return (self.dir / f"pod{pod}.out").read_text() + (self.dir / f"pod{pod}.err").read_text()

    def running(self) -> bool:
        return all(p.poll() is None for p in self.processes.values())

    def tail(self) -> str:
        return "\n".join(f"--- pod {i}:\n{self.output(i)[-3000:]}" for i in range(self.pods))

    def await_output(self, pod: int, text: str, timeout: float = 60.0) -> None:
        await_text(lambda: self.output(pod), text, lambda: self.processes[pod].poll() is None, f"pod {pod}", timeout)

    def wait(self, timeout: float = 180.0) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [self.processes[i].wait(max(0.1, deadline - time.monotonic())) for i in range(self.pods)]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the pods still run:\n{self.tail()}") from None

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
        for i in range(self.pods):
            shutil.rmtree(Path("/etc/netns") / self.hosts.namespaces[i], ignore_errors=True)
        try:
            Path("/etc/netns").rmdir()      # only if no other namespace has files there
        except OSError:
            pass


class Job:
    """Train.py with ``flags`` submitted with sbatch on ``nodes`` nodes, ``per_node`` tasks each: the
    batch script, and so the parent, runs on node0 with ``--launcher slurm``; or with ``step``, the
    script's srun starts Train.py itself, ``per_node`` tasks on each node. Its output goes to
    ``directory``/slurm.out, which every run of the job appends to. ``requeue``: submitted with
    ``--requeue``, as a job that ``requeue()`` may end and Slurm runs again. ``env``: added to the job's
    environment.
    (Polled with scontrol: ``sbatch --wait`` sleeps up to half a minute between its own polls.)"""

    def __init__(self, slurm: dict[str, str], directory, *flags: str, per_node: int = 2, nodes: int = 3,
                 step: bool = False, requeue: bool = False, env: dict[str, str] | None = None):
        self.env, self.output = {**os.environ, **slurm, **(env or {})}, directory / "slurm.out"
        train = [sys.executable, *TRAIN_PY, *([] if step else ["--launcher", "slurm"]), *flags]
        command = shlex.join((["srun", f"--ntasks-per-node={per_node}"] if step else []) + train)   # --wrap's shell
        self.id = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
                                  *(["--requeue"] if requeue else []), "--open-mode=append",
                                  f"--output={self.output}", f"--chdir={directory}", f"--wrap={command}"],
                                 env=self.env, capture_output=True, text=True, check=True).stdout.strip()

    def requeue(self) -> None:
        """``scontrol requeue``: Slurm ends the running job (SIGTERM to its steps' tasks, SIGKILL after
        KillWait) and, once its launch credential has expired (netns_hosts' ``cred_expire``), runs its
        script again with SLURM_RESTART_COUNT one higher."""
        subprocess.run(["scontrol", "requeue", self.id], env=self.env, capture_output=True, text=True, check=True)

    # the states of a job that has not ended: REQUEUED while a requeued job's first run ends
    ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED")

    def state(self) -> tuple[str, int]:
        """The job's state and its script's exit status."""
        shown = subprocess.run(["scontrol", "show", "job", "--oneliner", self.id], env=self.env,
                               capture_output=True, text=True, check=True).stdout
        return shown.split("JobState=")[1].split()[0], int(shown.split("ExitCode=")[1].split(":")[0])

    def running(self) -> bool:
        """Whether the job has not ended yet (a requeued one that waits to run again has not)."""
        return self.state()[0] in self.ACTIVE

    def text(self) -> str:
        """The job's output so far. srun passes its tasks' output on in chunks, which may split a
        character of one task's line (tqdm's bar) around another's: such bytes read as U+FFFD."""
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def tail(self) -> str:
        return self.text()[-6000:]

    def await_text(self, text: str, timeout: float = 60.0) -> None:
        await_text(self.text, text, lambda: True, f"job {self.id}", timeout)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (state := self.state())[0] in self.ACTIVE:
            assert time.monotonic() < deadline, f"job {self.id} still {state[0]} after {timeout} s:\n{self.tail()}"
            time.sleep(0.2)
        return state[1]


def await_text(read: Callable[[], str], text: str, running: Callable[[], bool], who: str, timeout: float) -> None:
    """Until ``read()`` holds ``text``; fails, quoting what was read, after ``timeout`` s or once ``running()`` is
    false."""
    deadline = time.monotonic() + timeout
    while text not in (said := read()):
        assert time.monotonic() < deadline and running(), f"{who} did not say {text!r}:\n{said[-3000:]}"
        time.sleep(0.1)
