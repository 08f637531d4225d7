"""One training step, eager or replayed from a CUDA graph.

``TrainStep`` runs forward, backward, the synchroniser and the optimizer as ordinary calls.
``GraphedTrainStep`` captures that same step once, after warm-up, in a CUDA graph and replays it:
one launch instead of hundreds, which is what small models need (their step is shorter than the
CPU time spent launching its kernels). Capture needs static shapes and addresses, so the batch is
copied into fixed input tensors before each replay. The gradient all-reduce is captured too: NCCL
kernels go on the capturing stream, and the bucket side stream forks from and joins back into it.
Warm-up runs on a side stream, as graph capture requires, and also creates the optimizer's state
(momentum buffers) before capture so that their addresses are fixed.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .flat import FlatParameters
from .sync import Synchroniser

WARMUP_STEPS = 3


class TrainStep:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, flat: FlatParameters,
                 sync: Synchroniser, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 autocast: Callable[[], Any]):
        self.model, self.optimizer, self.flat, self.sync = model, optimizer, flat, sync
        self.loss_fn, self.autocast = loss_fn, autocast

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One update; returns the (detached) loss tensor without synchronising the device."""
        with self.autocast():
            loss = self.loss_fn(self.model(x), y)
        self.flat.zero_grad()
        loss.backward()
        self.sync.after_backward()
        self.optimizer.step()
        return loss.detach()


class GraphedTrainStep(TrainStep):
    def __init__(self, *args: Any, example: tuple[torch.Tensor, torch.Tensor]):
        """Warm up (real updates, with real collectives, on every rank alike); ``capture`` next."""
        super().__init__(*args)
        self.x, self.y = (t.clone() for t in example)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                super().__call__(self.x, self.y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()

    def capture(self) -> None:
        """Record one step. Nothing runs while recording, collectives included, so a rank whose
        capture fails has not fallen out of step with the others."""
        with torch.cuda.graph(self.graph):
            self.loss = super().__call__(self.x, self.y)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.loss


def make_step(model, optimizer, flat, sync, loss_fn, autocast, cuda_graph: bool = False,
              example: tuple[torch.Tensor, torch.Tensor] | None = None, say: Callable[[str], None] = print) -> TrainStep:
    """A graphed step when asked and possible; otherwise, with a message saying why, an eager one.
    The warm-up steps of a graphed step train too (WARMUP_STEPS updates on ``example``)."""
    args = (model, optimizer, flat, sync, loss_fn, autocast)
    if not cuda_graph:
        return TrainStep(*args)
    if example is None or example[0].device.type != "cuda":
        say("--cuda-graph needs GPU workers; running eagerly")
        return TrainStep(*args)
    if not getattr(optimizer, "graph_safe", True):
        say(f"--cuda-graph: {type(optimizer).__name__} keeps host-side state a graph would freeze; running eagerly")
        return TrainStep(*args)
    if not getattr(sync.comm, "graph_safe", True):
        say("--cuda-graph: workers sharing a GPU signal each other from the host, which a graph cannot "
            "replay; running eagerly")
        return TrainStep(*args)
    step = GraphedTrainStep(*args, example=example)
    problem = None
    try:
        step.capture()
    except Exception as error:          # capture refuses some models (host syncs, dynamic shapes)
        problem = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    captured = torch.tensor([0 if problem else 1], device=example[0].device)
    sync.comm.all_reduce(captured, op="min")       # every rank graphed, or none: steps must pair up
    if captured.item():
        return step
    sync.reset()
    say(f"--cuda-graph: this model could not be captured on every rank ({problem or 'failed on another rank'}); "
        "running eagerly")
    return TrainStep(*args)
