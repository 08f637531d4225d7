"""Where the workers run: launchers (this machine, ssh, Slurm's srun), hosts and hostfiles, GPU
placement (NVML, never CUDA, in the parent), a private NVIDIA MPS daemon, the zygote that forks
workers from an interpreter that has imported torch once, the process on each remote host that forks
its workers from a zygote of its own (``remote``: the parent's view of such a child and the host's side;
``session``: started over ssh or srun), and runs a cluster engine started: which engine (``cluster``),
the key every node shares (``trust``), node 0's launcher of the other nodes' agents (``agents``) and
the agent itself (``agent``).

Never imports torch or training, and of the control plane only its framing (harness/control/wire.py),
which signs the node agents' link as it signs the children's: it turns flags into hosts, slots and GPUs,
and (host, environment) into a process (only the zygote's own process imports torch and the child).
``agents`` and ``agent`` are imported by name (harness.launch.agents), not from here.
"""
from . import launchers, mps, placement, remote, session, zygote
from .launchers import LAUNCHERS, Host, HostSessions, Launcher, Local, Slurm, Ssh, make_launcher

__all__ = ["LAUNCHERS", "Host", "HostSessions", "Launcher", "Local", "Slurm", "Ssh", "make_launcher",
           "launchers", "mps", "placement", "remote", "session", "zygote"]
