"""Where the workers run: launchers (this machine, ssh, Slurm's srun), hosts and hostfiles, GPU
placement (NVML, never CUDA, in the parent) and a private NVIDIA MPS daemon.

Never imports torch, the control plane or training: it turns flags into hosts, slots and GPUs, and
(host, environment) into a process.
"""
from . import launchers, mps, placement
from .launchers import LAUNCHERS, Host, Launcher, Local, Slurm, Ssh, make_launcher

__all__ = ["LAUNCHERS", "Host", "Launcher", "Local", "Slurm", "Ssh", "make_launcher",
           "launchers", "mps", "placement"]
