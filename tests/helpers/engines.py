"""Cluster engines over the namespaced hosts of tests/helpers/netns_hosts.py: torchrun from the installed
torch started in each namespace (``ip netns exec``), as a job script starts it on each node, with the
c10d rendezvous on node 0 (told so: the namespaces share the machine's host name, by which torchrun
would look for itself), and a key file every node shares."""
from __future__ import annotations

import os
import random
import secrets
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
