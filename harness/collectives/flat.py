"""Flatten a model's parameters and gradients into a few contiguous buffers (Torch7's getParameters())."""

from dataclasses import dataclass

import torch


@dataclass
class Segment:
    """One (device, dtype) group of parameters: its flat parameter buffer, whose first elements are
    the trainable parameters' (``trainable[k]`` at ``offsets[k]``, the same offsets in ``grads``), and
    its gradient buffer (None where gradients are not flattened: --zero 2 shards them instead)."""
    params: torch.Tensor
    grads: torch.Tensor | None
    trainable: list[torch.nn.Parameter]
    offsets: list[int]

    @property
    def trainable_numel(self) -> int:
        return self.offsets[-1] + self.trainable[-1].numel()


class FlatParameters:
    """Every trainable parameter becomes a view into one contiguous buffer per (device, dtype), and every
    gradient a view into a matching gradient buffer, so collectives act on a few large buffers.

    Build it after the model has reached its final device and dtype: ``model.to(...)`` or ``model.half()``
    may replace ``param.data`` with a fresh tensor and silently leave the buffers behind.

    Gradients land in the flat buffers because autograd accumulates into an existing ``.grad`` in place.
    Two things replace ``.grad`` with a new tensor instead and so detach it from the buffer:
    ``torch.optim.Optimizer.zero_grad()`` (its default ``set_to_none=True`` sets grads to None) and
    ``backward(create_graph=True)`` (accumulates out of place). Callers therefore zero gradients with
    ``FlatParameters.zero_grad()``; ``rebind_grads()`` repairs grads detached by either route.

    In-place parameter updates (optimizer steps, ``load_state_dict`` without ``assign=True``) write
    straight into the views, so optimizers built on ``model.parameters()`` need no special care.

    Within a buffer the trainable parameters come first, frozen ones after them, so a trainable
    parameter sits at the same offset in the parameter buffer as in the gradient buffer: a shard of
    one is the same range of the other (harness/collectives/shards.py).

    ``flatten_grads=False`` leaves gradients where autograd puts them (``grads`` is empty): --zero 2
    keeps only its shard of them; param and async modes, which exchange parameters, and a world of one,
    which averages nothing, let autograd hand its own over as ``.grad`` (``zero_grad`` sets them to None), as
    a plain loop does (harness/training/build.py's ``flat_gradients`` decides): accumulating into a zeroed
    buffer costs an add kernel per parameter (161 on ResNet-50, 0.34 ms of a 24 ms step on an H100).
    """

    def __init__(self, model: torch.nn.Module, flatten_grads: bool = True):
        self.flatten_grads = flatten_grads
        # model.parameters() already deduplicates by identity, so tied parameters appear once, in
        # order of first registration.
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for param in model.parameters():
            groups.setdefault((param.device, param.dtype), []).append(param)
        if not any(param.requires_grad for group in groups.values() for param in group):
            raise ValueError(
                f"{type(model).__name__} has no parameters with requires_grad=True; "
                "unfreeze at least one parameter before flattening"
            )

        self.params: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.segments: list[Segment] = []       # the groups with trainable parameters
        self._grad_views: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._segments: list[tuple[int, torch.Tensor, list[torch.nn.Parameter]]] = []
        for group in groups.values():
            trainable = [param for param in group if param.requires_grad]
            flat_params = _flatten_params(trainable + [param for param in group if not param.requires_grad])
            self.params.append(flat_params)
            if not trainable:
                continue  # a fully frozen group gets no grad buffer, so grads may be shorter than params
            offsets = [0]
            for param in trainable[:-1]:
                offsets.append(offsets[-1] + param.numel())
            flat_grad = None
            if flatten_grads:
                flat_grad = torch.zeros(offsets[-1] + trainable[-1].numel(), dtype=trainable[0].dtype,
                                        device=trainable[0].device)
                self._grad_views.extend(zip(trainable, views(flat_grad, trainable)))
                self._segments.append((len(self.grads), flat_grad, trainable[::-1]))
                self.grads.append(flat_grad)
            self.segments.append(Segment(flat_params, flat_grad, trainable, offsets))
        self.rebind_grads()

        self.buffers: list[torch.Tensor] = [buf for buf in model.buffers() if buf.is_floating_point()]

    def zero_grad(self) -> None:
        """Zero the flat gradient buffers in place; grads stay views (unlike set_to_none). Without flat
        gradients, the parameters' own are let go (set to None)."""
        for flat_grad in self.grads:
            flat_grad.zero_()
        if not self.flatten_grads:
            for param in self._trainable():
                param.grad = None

    def complete_grads(self) -> list[torch.Tensor]:
        """Without flat gradients: every trainable parameter's own, zeros made where backward gave it none, so
        the optimizer steps on it (weight decay, momentum) as on a flat buffer's zeroed view, and a world of one
        trains as N workers do."""
        trainable = self._trainable()
        for param in trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        return [param.grad for param in trainable]

    def grad_nbytes(self) -> int:
        """What the gradients take: the flat buffers, or what autograd makes for the trainable parameters."""
        if self.flatten_grads:
            return sum(g.nbytes for g in self.grads)
        return sum(p.nbytes for p in self._trainable())

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [param for segment in self.segments for param in segment.trainable]

    def rebind_grads(self) -> int:
        """Zero the gradient buffers and point every trainable parameter's .grad back at its view.

        Returns how many grads had been detached (None or a separate tensor), so callers can warn
        about whatever detached them.
        """
        self.zero_grad()
        detached = 0
        for param, view in self._grad_views:
            if not _is_same_view(param.grad, view):
                param.grad = view
                detached += 1
        return detached

    def numel(self) -> int:
        """Number of elements over all parameters, frozen ones included."""
        return sum(flat.numel() for flat in self.params)

    def checksum(self) -> float:
        """float64 sum of all parameter buffers: a cheap test that replicas hold the same weights."""
        return sum(flat.sum(dtype=torch.float64).item() for flat in self.params)

    def grad_segments(self) -> list[tuple[int, torch.Tensor, list[torch.nn.Parameter]]]:
        """(index into grads, grad buffer, its parameters in reverse registration order) per buffer.

        Reverse order because backward produces gradients roughly last layer first, which is the
        order a gradient-bucketing layer wants to launch reductions in.
        """
        return list(self._segments)


def views(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Consecutive slices of flat, shaped like params and laid out like them, in order.

    A slice keeps its parameter's dense memory format (e.g. channels_last conv weights): turning
    those into contiguous views would make cuDNN convert layouts every step, and autograd
    accumulate channels_last gradients into mismatched strides."""
    views, offset = [], 0
    for param in params:
        strides = torch.empty_like(param, device="meta").stride()     # dense, in param's memory format
        views.append(flat[offset : offset + param.numel()].as_strided(param.shape, strides))
        offset += param.numel()
    return views


def _flatten_params(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Copy params into one buffer and make each param's .data a view of it (values preserved)."""
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    for param, view in zip(params, views(flat, params)):
        view.copy_(param.detach())
        param.data = view
    return flat


def _is_same_view(grad: torch.Tensor | None, view: torch.Tensor) -> bool:
    return (
        grad is not None
        and grad.data_ptr() == view.data_ptr()
        and grad.shape == view.shape
        and grad.stride() == view.stride()
    )
