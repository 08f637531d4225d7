"""Gradient accumulation inside the compiled backward (--compile with --grad-accum, autograd's own gradients).

Why: with K micro-batches an update, autograd adds each micro-batch's gradient into ``param.grad`` with an
eager kernel a parameter (AccumulateGrad), after the compiled backward has written that gradient out in full,
in float32: for GPT-2 124M, 149 adds over 124 M floats a micro-batch, which read and write the gradients once
more. Here the loss of every micro-batch passes through ``add_running``, an operator whose value is the loss
and whose backward hands each parameter the sum of its earlier gradients. The compiled backward then adds
that sum to the micro-batch's gradient itself, where Inductor fuses the add into the kernel that casts the
gradient to float32, and autograd takes the result as the parameter's gradient instead of adding it
(``param.grad`` is None by then). On one H200, nanoGPT's recipe (4 micro-batches) ran its graphed update 0.6%
faster (bench/results/2026-12-02-h200-fused-accumulation).

Why an operator (``torch.library.custom_op``) and not an ``autograd.Function``: a graph holding a Python
autograd.Function is never kept in AOTAutograd's cache (its backward's code is not part of the key), and a
warm start then traced GPT-2's backward again: the first update came 16 s later. An operator's backward is
traced into the graph like any other, and the graph is cached under the operator's name, so a change to
``_backward`` must come with a new name.

The first micro-batch adds zeros, made for it at each update: every micro-batch then runs one compiled graph (a
first micro-batch without the add would compile the model twice), and the zeros, gone once its backward has
run, take the place the earlier gradients take in the later micro-batches, so the peak stays where it was.
Kept for the run instead, they would hold a float32 copy of the model beside it for nothing but a memset.
Only where the optimizer reads autograd's own gradients and no hook acts on each micro-batch's (a world of
one, param and async mode): flat gradient buffers are views that the hooks all-reduce, and --zero 2
reduce-scatters every micro-batch's gradient; both accumulate in place (build.fused_accumulation decides).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from harness.data.batch import Batch, call_model
from harness.training.losses import Loss

__all__ = ["FusedAccumulation", "add_running"]


@torch.library.custom_op("harness::add_running", mutates_args=())
def add_running(loss: torch.Tensor, params: list[torch.Tensor], running: list[torch.Tensor]) -> torch.Tensor:
    """``loss``; its backward adds ``running[i]`` to ``params[i]``'s gradient, whatever the loss's own gradient
    (the step scales the loss by 1/K, or fp16's loss scale, after this: ``running`` already is what they made)."""
    return loss.clone()


@add_running.register_fake
def _(loss: torch.Tensor, params: list[torch.Tensor], running: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(loss)


def _keep(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.running = inputs[2]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple:
    # a copy, fused into the add, so that a parameter that got no other gradient does not alias ``running``
    return grad, [r.clone() for r in ctx.running], [None] * len(ctx.running)


add_running.register_autograd(_backward, setup_context=_keep)


class FusedAccumulation:
    """``batch -> loss``, as build.model_loss's function is, compiled, for the step to call on each micro-batch;
    its backward leaves in ``param.grad`` the sum of the update's gradients so far.

    Args:
        model: the module whose trainable parameters accumulate.
        loss: ``loss(output, batch)``, as the step's.
        compile: the compiler (``torch.compile``; a test may pass a lighter backend).
    """

    def __init__(self, model: torch.nn.Module, loss: Loss,
                 compile: Callable[[Callable], Callable] = torch.compile):
        self.params = [p for p in model.parameters() if p.requires_grad]

        def compute(batch: Batch, running: list[torch.Tensor]) -> torch.Tensor:
            return add_running(loss(call_model(model, batch), batch), self.params, running)
        self.compiled = compile(compute)

    def __call__(self, batch: Batch) -> torch.Tensor:
        running = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        return self.compiled(batch, running)
