"""Where the workers run: launchers (this machine, ssh, Slurm's srun), hosts and hostfiles, GPU
placement (NVML, never CUDA, in the parent), a private NVIDIA MPS daemon, and the zygote that forks local
workers from an interpreter that has imported torch once.

Never imports torch, the control plane or training: it turns flags into hosts, slots and GPUs, and
(host, environment) into a process (only the zygote's own process imports torch and the child).
"""
from . import launchers, mps, placement, zygote
from .launchers import LAUNCHERS, Host, Launcher, Local, Slurm, Ssh, make_launcher

__all__ = ["LAUNCHERS", "Host", "Launcher", "Local", "Slurm", "Ssh", "make_launcher",
           "launchers", "mps", "placement", "zygote"]
