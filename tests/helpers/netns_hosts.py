"""Several "hosts" on one machine, for the launcher tests: Linux network namespaces on one bridge,
each with its own address and its own real sshd (Debian's openssh-server), with keys made per run,
and on demand a real Slurm cluster over them (Debian's munge, slurmctld and slurmd: one slurmd per
namespace as node0, node1, ..., the controller on the bridge's address).

The processes share the filesystem, so every host has the same Python at the same path, as a
cluster's shared home gives. ``Hosts.ssh`` is the ssh command (an ssh_config of our own) that the
launcher takes from $HARNESS_SSH; ``Hosts.start_slurm()`` returns the environment (SLURM_CONF) in
which salloc and srun use that cluster. Nothing outside the namespaces, the bridge and the run's own
directory is touched: every daemon's configuration, key, socket, state and log lives there.
"""
from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# Each Hosts of a process gets names of its own: a namespace's veth pair outlives ``ip netns del`` for a
# moment (the kernel tears namespaces down in the background), so the next module's hosts must not reuse them;
# and a test that seeds ``random`` must not make two draws alike.
NUMBERS = itertools.count()
DRAWS = random.SystemRandom()
SLURM = ("munged", "slurmctld", "slurmd", "salloc", "srun", "nsenter")


def why_not() -> str | None:
    """Why namespaces with sshd cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    name = f"hxprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def why_no_slurm() -> str | None:
    """Why a Slurm cluster cannot be made over the namespaces here, or None."""
    missing = [tool for tool in SLURM if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")]
    return f"{', '.join(missing)} not installed (apt-get install munge slurmctld slurmd slurm-client)" if missing else None


def run(*command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


class Hosts:
    def __init__(self, directory: Path, count: int = 3):
        self.dir, tag = directory, f"{os.getpid() % 100000}n{next(NUMBERS)}"
        self.subnet = f"10.{DRAWS.randrange(100, 250)}.{DRAWS.randrange(1, 250)}"
        self.bridge = f"hxbr{tag}"
        self.namespaces = [f"hx{tag}h{i}" for i in range(count)]
        self.addresses = [f"{self.subnet}.{i + 2}" for i in range(count)]
        self.parent_address = f"{self.subnet}.1"
        self.daemon_pids: list[int] = []        # sshd and slurmd in the namespaces
        self.pid_files: list[Path] = []         # every daemon's, for close()
        try:
            self._network()
            self._sshd()
        except BaseException:
            self.close()
            raise
        self.ssh = f"ssh -F {self.dir / 'ssh_config'}"

    def _network(self) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.parent_address}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            outside, inside = f"{self.bridge}v{i}", f"{self.bridge}p{i}"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            run("ip", "link", "set", inside, "netns", ns)
            run("ip", "link", "set", outside, "master", self.bridge)
            run("ip", "link", "set", outside, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inside)
            run("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")

    def _sshd(self) -> None:
        d = self.dir
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client"))
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host"))
        (d / "authorized_keys").write_text((d / "client.pub").read_text())
        (d / "ssh_config").write_text(
            f"Host *\n  User root\n  IdentityFile {d / 'client'}\n  IdentitiesOnly yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 5\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)      # sshd's privilege-separation directory
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            config = d / f"sshd-{i}.conf"
            config.write_text(
                f"ListenAddress {address}\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
                f"PidFile {d / f'sshd-{i}.pid'}\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel ERROR\n")
            run("ip", "netns", "exec", ns, SSHD, "-f", str(config), "-E", str(d / f"sshd-{i}.log"))
        self.daemon_pids += self._await_pids([d / f"sshd-{i}.pid" for i in range(len(self.namespaces))])

    def _await_pids(self, pid_files: list[Path]) -> list[int]:
        self.pid_files += pid_files
        deadline = time.monotonic() + 10
        for pid_file in pid_files:
            while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.05)
        return [int(pid_file.read_text()) for pid_file in pid_files]

    def start_slurm(self) -> dict[str, str]:
        """A Slurm cluster of one node per namespace (node0, node1, ...: 2 CPUs each, a partition of them
        all): munged and slurmctld here, on the bridge's address, each slurmd in its namespace (nsenter
        changes the network namespace only; ``ip netns exec`` would remount /sys, and slurmd needs its
        cgroup hierarchy). A requeued job runs again once its launch credential expires and the scheduler
        next looks (``cred_expire``: 120 s by default, 5 here; ``sched_interval``: 60 s, here 1).
        Returns the environment for salloc and srun."""
        d = self.dir / "slurm"
        (d / "state").mkdir(parents=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        run("munged", "--force", f"--socket={d / 'munge.sock'}", f"--key-file={key}", f"--log-file={d / 'munged.log'}",
            f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}")
        self.nodes = [f"node{i}" for i in range(len(self.namespaces))]
        port = DRAWS.randrange(20000, 30000, 2)
        config = d / "slurm.conf"
        config.write_text(
            f"ClusterName=harness\nSlurmctldHost={socket.gethostname()}({self.parent_address})\n"
            f"SlurmctldPort={port}\nSlurmdPort={port + 1}\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d / 'munge.sock'},cred_expire=5\n"
            f"StateSaveLocation={d / 'state'}\nSlurmdSpoolDir={d}/spool-%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\nSlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\nSlurmdLogFile={d}/slurmd-%n.log\n"
            "SlurmdParameters=config_overrides\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\nReturnToService=2\n"
            "SchedulerParameters=sched_interval=1,bf_interval=1\n"
            + "".join(f"NodeName={node} NodeAddr={address} CPUs=2 State=UNKNOWN\n"
                      for node, address in zip(self.nodes, self.addresses))
            + "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
        env = {**os.environ, "SLURM_CONF": str(config)}
        self._await_pids([d / "munged.pid"])
        run("slurmctld", "-f", str(config), env=env)
        self._await_pids([d / "slurmctld.pid"])
        for node, ns in zip(self.nodes, self.namespaces):
            run("nsenter", f"--net=/run/netns/{ns}", "slurmd", "-N", node, "-f", str(config), env=env)
        self.daemon_pids += self._await_pids([d / f"slurmd-{node}.pid" for node in self.nodes])
        deadline = time.monotonic() + 30
        while run("sinfo", "-h", "-o", "%t", env=env).split() != ["idle"] and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"SLURM_CONF": str(config)}

    def slurm_log(self, daemon: str) -> str:
        """The log of a Slurm daemon: "slurmctld" or "slurmd-node1"."""
        return (self.dir / "slurm" / f"{daemon}.log").read_text()

    def processes(self, namespace: str) -> list[int]:
        """The processes in a namespace, its daemons left out (the children, their sessions, their
        Slurm job steps)."""
        pids = [int(p) for p in run("ip", "netns", "pids", namespace).split()]
        return [p for p in pids if p not in self.daemon_pids]

    def link(self, index: int, up: bool) -> None:
        """Take host ``index``'s network link down (or up): as if its cable were pulled."""
        run("ip", "link", "set", f"{self.bridge}v{index}", "up" if up else "down")

    def shape(self, index: int, mbit: float, delay_ms: float = 0) -> None:
        """Limit host ``index``'s link to ``mbit`` Mbit/s each way, as a slow network between hosts: a
        token bucket (tbf) on both ends of its veth pair, the bridge's end (what the host receives)
        and the namespace's (what it sends). ``delay_ms`` adds netem's delay under each bucket (kernels
        without netem refuse it). The qdiscs go with the veth pair when close() deletes the namespace."""
        for prefix, device in (((), f"{self.bridge}v{index}"),
                               (("ip", "netns", "exec", self.namespaces[index]), f"{self.bridge}p{index}")):
            run(*prefix, "tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "tbf",
                "rate", f"{mbit:g}mbit", "burst", "32kb", "latency", "100ms")
            if delay_ms:
                run(*prefix, "tc", "qdisc", "replace", "dev", device, "parent", "1:1", "handle", "10:", "netem",
                    "delay", f"{delay_ms:g}ms")

    def close(self) -> None:
        for pid_file in self.pid_files:         # the daemons outside the namespaces (munged, slurmctld)
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
