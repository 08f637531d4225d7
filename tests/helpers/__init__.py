"""What several test modules share; no test module imports another ``test_*`` module.

- ``processes``: processes from /proc (alive, gone, descendants, harness children), killing them.
- ``gpus``: whether CUDA GPUs are here (the GPU tests' skip).
- ``ci``: a missing prerequisite skips a test, and fails it in CI (``CI=true``).
- ``collectives``: the collectives matrix shared by gloo, NCCL and shared-device groups, a dead
  peer, and a recording wrapper around a real communicator.
- ``data_files``: small JPEG folders and token files made on the spot.
- ``netns_hosts``: several "hosts" as network namespaces with sshd and Slurm (also used by
  ``scripts/bench/hosts.py``).
- ``training``: Train.py in this process or as a command: ``run_train``, ``cli``, ``flat_params``.
- ``runs``: Train.py as a live process to signal: start it, wait for a record, finish it.
- ``slow_model``: a model whose steps take a set time, so that signals land mid-training.
- ``soak``: the heal soak (kill workers again and again); ``scripts/soak_heal.py`` is its CLI.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent      # the checkout: Train.py, Test.py, scripts/
# Train.py as the tests start it, without its plot (a second of CPU a run, and CI is CPU-bound): the README's
# commands draw it (test_train.py), and test_metrics.py checks what it draws.
NO_PLOT = ("--no-plot",)
TRAIN_PY = (str(ROOT / "Train.py"), *NO_PLOT)
