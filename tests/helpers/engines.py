"""Cluster engines over the namespaced hosts of tests/helpers/netns_hosts.py, and a key file every node
shares: torchrun from the installed torch started in each namespace (``ip netns exec``), as a job script
starts it on each node, with the c10d rendezvous on node 0 (told so: the namespaces share the machine's
host name, by which torchrun would look for itself); and pods as Kubeflow's PyTorchJob makes them, each
with the variables the operator sets and a hosts file of its own, in which the test makes the master's
name resolvable when it likes (``ip netns exec`` mounts /etc/netns/NAME/hosts over /etc/hosts)."""
from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT
from tests.helpers.netns_hosts import Hosts


def key_file(directory: Path) -> Path:
    """A pre-shared key, as the docs say to make one."""
    path = directory / "harness.key"
    path.write_text(secrets.token_hex(32) + "\n")
    return path


class Torchrun:
    """``python -m torch.distributed.run --nnodes N --nproc-per-node 1 ... Train.py FLAGS`` on each of the
    first ``nodes`` hosts, node i's output in directory/node{i}.out and .err. ``env``: added to every node's."""

    def __init__(self, hosts: Hosts, directory: Path, *flags: str, nodes: int = 2, max_restarts: int = 0,
                 env: dict[str, str] | None = None):
        self.dir, self.nodes = directory, nodes
        env = {**os.environ, "HARNESS_KEY_FILE": str(key_file(directory)), "PYTHONUNBUFFERED": "1", **(env or {})}
        endpoint = f"{hosts.addresses[0]}:{random.randrange(30000, 40000)}"
        self.processes = []
        for i in range(nodes):
            command = ["ip", "netns", "exec", hosts.namespaces[i], sys.executable, "-m", "torch.distributed.run",
                       "--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       endpoint, "--rdzv-id", "harness-test", "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", hosts.addresses[i], "--max-restarts",
                       str(max_restarts), "--monitor-interval", "0.5", str(ROOT / "Train.py"), *flags]
            with open(directory / f"node{i}.out", "w") as out, open(directory / f"node{i}.err", "w") as err:
                self.processes.append(subprocess.Popen(command, env=env, cwd=directory, stdout=out, stderr=err,
                                                       start_new_session=True))

    def output(self, node: int) -> str:
        return (self.dir / f"node{node}.out").read_text() + (self.dir / f"node{node}.err").read_text()

    def wait(self, timeout: float = 180.0) -> list[int]:
        """Every node's exit status (torchrun's); the processes are killed if they outlast ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(max(0.1, deadline - time.monotonic())) for p in self.processes]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchrun still running after {timeout} s:\n" + "\n".join(
                f"--- node {i}:\n{self.output(i)[-3000:]}" for i in range(self.nodes))) from None
        finally:
            self.kill()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()


class PyTorchJob:
    """A PyTorchJob named ``name`` of a master and ``workers`` workers over the first hosts, pod i in
    namespace i, as the training operator (kubeflow/trainer, pytorch SetPodEnv) and the kubelet set them up:
    MASTER_ADDR is the master's service name, RANK the pod's index, WORLD_SIZE the number of pods. Only the
    master's pod resolves the name at first (``resolve`` makes a worker's pod resolve it too); ``start(i)``
    starts pod i's ``python Train.py FLAGS``, its output in directory/pod{i}.out and .err."""

    PORT = 23456        # the operator's default pytorchjob-port

    def __init__(self, hosts: Hosts, directory: Path, *flags: str, name: str = "mnist", workers: int = 1):
        self.hosts, self.dir, self.flags, self.pods = hosts, directory, flags, workers + 1
        self.master = f"{name}-master-0"
        self.env = {**os.environ, "HARNESS_KEY_FILE": str(key_file(directory)), "PYTHONUNBUFFERED": "1",
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                    "MASTER_ADDR": self.master, "MASTER_PORT": str(self.PORT), "WORLD_SIZE": str(self.pods)}
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
        command = ["ip", "netns", "exec", self.hosts.namespaces[pod], sys.executable, str(ROOT / "Train.py"),
                   *self.flags]
        with open(self.dir / f"pod{pod}.out", "w") as out, open(self.dir / f"pod{pod}.err", "w") as err:
            self.processes[pod] = subprocess.Popen(command, env={**self.env, "RANK": str(pod)}, cwd=self.dir,
                                                   stdout=out, stderr=err, start_new_session=True)

    def output(self, pod: int) -> str:
        return (self.dir / f"pod{pod}.out").read_text() + (self.dir / f"pod{pod}.err").read_text()

    def await_output(self, pod: int, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(pod):
            assert time.monotonic() < deadline and self.processes[pod].poll() is None, \
                f"pod {pod} did not say {text!r}:\n{self.output(pod)[-3000:]}"
            time.sleep(0.1)

    def wait(self, timeout: float = 180.0) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [self.processes[i].wait(max(0.1, deadline - time.monotonic())) for i in range(self.pods)]
        except subprocess.TimeoutExpired:
            raise AssertionError("the pods still run:\n" + "\n".join(
                f"--- pod {i}:\n{self.output(i)[-3000:]}" for i in range(self.pods))) from None

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
