"""A linear model whose forward pass takes ``delay`` seconds, so that signals land mid-training: the
tests of signals, restarts and healing, and the heal soak. Train.py takes it as ``--model SPEC``
(its workers import it from the checkout, which is on their ``sys.path``)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch

from tests.helpers import held_model

SPEC = f"{__name__}:model"
# The job the heal and restart tests run: 60 updates of 30 ms on three CPU workers. How often it
# saves and how it fails do not change its arithmetic, so every such run must end with the
# parameters of its uninterrupted run (the ``slow_straight`` fixture). Its heartbeat timeout is long
# enough that a worker slowed by a busy machine (tests run on several xdist workers) never counts as
# hung; a test that hangs a worker on purpose passes HANG_FLAGS after these.
DELAY = 0.03
FLAGS = ["--model", SPEC, "--model-options", json.dumps({"delay": DELAY}), "--batch-size", "8", "--cpu-workers", "3",
         "--max-steps", "60", "--heartbeat-timeout", "10"]
HANG_FLAGS = ["--heartbeat-timeout", "5"]     # only the hung one counts as hung, however loaded the machine
_trained_here = 0       # training forwards of this process, over all its models (see Slow's gate)


class Slow(torch.nn.Linear):
    """``ballast``: that many floats of an unused buffer, which make its checkpoints slow to write; ``term_at``:
    at that training forward, SIGTERM to this process's group (Train.py and its workers, as Ctrl-C does);
    ``kill_at``: at that training forward, SIGKILL to this worker alone; ``gate``: a path that every training
    forward of a process but its first waits for. Rank 0's first is its check of the inputs, which comes before a
    run takes its outputs' lock: a run that took it holds it, training, until the test lets it go on."""

    def __init__(self, inputs: int, outputs: int, delay: float, ballast: int = 0, term_at: int | None = None,
                 kill_at: int | None = None, gate: str | None = None):
        super().__init__(inputs, outputs)
        self.delay, self.term_at, self.kill_at, self.gate, self.forwards = delay, term_at, kill_at, gate, 0
        if ballast:
            self.register_buffer("ballast", torch.zeros(ballast))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global _trained_here
        _trained_here += self.training
        while self.training and self.gate is not None and _trained_here > 1 and not os.path.exists(self.gate):
            time.sleep(0.05)
        time.sleep(self.delay)
        self.forwards += self.training
        if self.training and self.forwards == self.term_at:
            os.killpg(0, signal.SIGTERM)
        if self.training and self.forwards == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x.flatten(1))


def model(info, delay: float = 0.25, ballast: int = 0, rank: int | None = None, term_at: int | None = None,
          kill: tuple[int, int] | None = None, die_once: str | None = None, gate: str | None = None) -> Slow:
    """``rank``: only that worker is slow (a host of unequal speed, for --mode async); the others take no delay.
    ``term_at``: rank 0 sends the SIGTERM (see Slow). ``kill``: (rank, forward): that rank's first worker SIGKILLs
    itself at that training forward, a death at a known point of its run however loaded the machine is (its
    replacement, of a later generation, does not). ``die_once``: a path; the first process to build the model
    (rank 0, checking the inputs) creates that file and SIGKILLs itself; the file there, builds go on. ``gate``: see
    Slow."""
    if die_once is not None and not os.path.exists(die_once):
        open(die_once, "x").close()
        os.kill(os.getpid(), signal.SIGKILL)
    mine = os.environ.get("HARNESS_RANK")
    slow = rank is None or mine is not None and int(mine) == rank
    first = os.environ.get("HARNESS_GENERATION", "0") == "0"
    kill_at = kill[1] if kill and mine == str(kill[0]) and first else None
    return Slow(64, info.num_classes, delay if slow else 0.0, ballast, term_at if mine == "0" else None, kill_at, gate)


def held(gate: Path, at: int) -> list[str]:
    """FLAGS' model, held at each worker's training forward ``at`` until ``gate`` exists (tests/helpers/held_model.py),
    as flags to put after FLAGS: a test that kills a worker once update 20 is saved opens the gate after the kill,
    which then lands before update ``at`` however loaded the machine is."""
    return held_model.flags(gate, at, SPEC, delay=DELAY)
