"""Several "hosts" on one machine, for the launcher tests: Linux network namespaces on one bridge,
each with its own address and its own real sshd (Debian's openssh-server), with keys made per run.

The processes share the filesystem, so every host has the same Python at the same path, as a
cluster's shared home gives. ``Hosts.ssh`` is the ssh command (an ssh_config of our own) that the
launcher takes from $HARNESS_SSH. Nothing outside the namespaces and the bridge is touched.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


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


def run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


class Hosts:
    def __init__(self, directory: Path, count: int = 3):
        self.dir, tag = directory, f"{os.getpid() % 10000}{random.randrange(100)}"
        self.subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"hxbr{tag}"
        self.namespaces = [f"hx{tag}h{i}" for i in range(count)]
        self.addresses = [f"{self.subnet}.{i + 2}" for i in range(count)]
        self.parent_address = f"{self.subnet}.1"
        self.sshd_pids: list[int] = []
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
        deadline = time.monotonic() + 10
        for i in range(len(self.namespaces)):
            pid_file = d / f"sshd-{i}.pid"
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.sshd_pids.append(int(pid_file.read_text()))

    def processes(self, namespace: str) -> list[int]:
        """The processes in a namespace, its sshd left out (the children and their sessions)."""
        pids = [int(p) for p in run("ip", "netns", "pids", namespace).split()]
        return [p for p in pids if p not in self.sshd_pids]

    def link(self, index: int, up: bool) -> None:
        """Take host ``index``'s network link down (or up): as if its cable were pulled."""
        run("ip", "link", "set", f"{self.bridge}v{index}", "up" if up else "down")

    def close(self) -> None:
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
