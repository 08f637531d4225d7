"""Training: a run's configuration (``config``: the TrainConfig dataclass; ``flags``: Train.py's
argparse groups over it; ``checks``: every check, before any worker trains), the parent's side
(``driver``: start the workers, train, recover; ``progress``: the bar and the log) and the worker's
(``loop``: the epoch loop, with ``loop_save`` and ``loop_heal``, a rank's part in checkpoints and heals; ``build``: data, model, optimizer, synchroniser; ``step``: eager, graphed
or compiled; ``optim``, ``ccnesterov``, ``schedule``; ``evaluation``: validation and Test.py).

From Python, ``run(TrainConfig(...))`` does what Train.py does and returns the workers' summaries; to continue a
saved run, ``run(TrainConfig.resuming(PATH, **changes))``, as ``--resume`` does.

Imports the collectives, the data pipeline and resilience; never the control plane's internals
(a worker talks to the parent through its ``Context``). Importing this front does not import torch:
Train.py's parent never does (rank 0 checks what needs it).
"""
from .config import ConfigError, TrainConfig
from .driver import run

__all__ = ["ConfigError", "TrainConfig", "run"]
