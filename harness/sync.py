"""Keeping replicas in step: gradient averaging and parameter averaging (the seed's two modes).

Both act on FlatParameters' few contiguous buffers, so each synchronisation is one collective
per buffer, issued in the same order on every rank (out-of-order collectives deadlock NCCL).

* ``GradientAveraging`` (--mode grad): after backward, all-reduce the flat gradients with "avg";
  every replica then takes the same optimizer step, so replicas stay identical.
* ``ParameterAveraging`` (--mode param --avg-every K): replicas step on their own gradients and
  every K updates (and at the end) average their flat parameters and floating-point buffers
  (BatchNorm statistics), and optionally the optimizer's state.
"""
from __future__ import annotations

import torch

from .comm import Communicator
from .flat import FlatParameters


class Synchroniser:
    def __init__(self, comm: Communicator, flat: FlatParameters):
        self.comm, self.flat = comm, flat

    def start(self) -> None:
        """Start every replica from rank 0's parameters and buffers."""
        for tensor in (*self.flat.params, *self.flat.buffers):
            self.comm.broadcast(tensor, root=0)

    def after_backward(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def finish(self) -> None:
        """Called before the replicas are compared, evaluated or saved."""


class GradientAveraging(Synchroniser):
    def after_backward(self) -> None:
        for grad in self.flat.grads:
            self.comm.all_reduce(grad, op="avg")

    def finish(self) -> None:
        # Gradients keep parameters equal; BatchNorm statistics still drift apart per shard.
        for buffer in self.flat.buffers:
            self.comm.all_reduce(buffer, op="avg")


class ParameterAveraging(Synchroniser):
    def __init__(self, comm: Communicator, flat: FlatParameters, every: int,
                 optimizer: torch.optim.Optimizer | None = None):
        super().__init__(comm, flat)
        if every < 1:
            raise ValueError(f"avg_every={every}: must be at least 1")
        self.every, self.optimizer = every, optimizer

    def after_step(self, step: int) -> None:
        if step % self.every == 0:
            self.average()

    def finish(self) -> None:
        self.average()

    def average(self) -> None:
        for tensor in (*self.flat.params, *self.flat.buffers, *self._optimizer_state()):
            self.comm.all_reduce(tensor, op="avg")

    def _optimizer_state(self) -> list[torch.Tensor]:
        """Momentum / Adam moments, in parameter order (the same on every rank)."""
        if self.optimizer is None:
            return []
        tensors = []
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                for key, value in sorted(self.optimizer.state.get(param, {}).items()):
                    if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0 \
                            and value.device == param.device:
                        tensors.append(value)
        return tensors
