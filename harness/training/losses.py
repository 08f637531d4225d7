"""The training loss, whatever the model returns and however the batch is made.

``--loss package.module:fn`` names ``fn(output, batch) -> scalar``: a regression, a contrastive or a
masked-LM loss of the user's own. Without it the model's own loss is used where it returns one (a
0-d tensor, a ``(logits, loss)`` tuple as nanoGPT's model with targets, an object with ``.loss`` as
Hugging Face's ``ModelOutput``, or a dict with ``"loss"``), and else cross-entropy of its logits (a tensor,
``.logits`` or a dict's ``"logits"``) against the pair's targets.
The same rule serves training, validation and Test.py, so they always report the same loss.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from harness.data.batch import Batch, is_pair

Loss = Callable[[Any, Batch], torch.Tensor]


def own_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returned with its output, if it returned one."""
    if torch.is_tensor(output):
        return output if output.dim() == 0 else None
    if isinstance(output, (tuple, list)) and len(output) == 2 and torch.is_tensor(output[1]) \
            and output[1].dim() == 0:
        return output[1]
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    return loss if torch.is_tensor(loss) else None


def logits_of(output: Any) -> torch.Tensor | None:
    """The predictions a model returned, if any: a tensor of logits, a tuple's first, or ``.logits``."""
    if torch.is_tensor(output):
        return output if output.dim() > 0 else None
    if isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
        return output[0]
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    return logits if torch.is_tensor(logits) else None


def default_loss(output: Any, batch: Batch) -> torch.Tensor:
    """The model's own loss, else cross-entropy over the last dimension against the pair's targets
    (``(N, C)``/``(N,)`` and ``(N, T, V)``/``(N, T)`` alike)."""
    own = own_loss(output)
    if own is not None:
        return own
    # a tensor, or .logits: a Hugging Face model given no labels returns them alone (a tuple's parts are ambiguous)
    logits = None if isinstance(output, (tuple, list)) else logits_of(output)
    if is_pair(batch) and logits is not None:
        from harness.checkout.models import loss_fn
        return loss_fn(logits, batch[1])
    kind = type(output).__name__
    what = "not a tensor of logits, .logits nor a loss" if is_pair(batch) else \
        "no loss, and the batch has no (x, y) targets"
    raise TypeError(f"it returns a {kind}, {what}: return the loss from the model (a 0-d tensor, (logits, loss), "
                    "or an object with .loss) or pass --loss package.module:fn")


def make_loss(spec: str | None) -> Loss:
    """``--loss``: the user's ``fn(output, batch)``, or the default rule above."""
    if spec is None:
        return default_loss
    from harness.plugins import import_factory
    return import_factory(spec, "loss", "fn(output, batch) -> scalar tensor")
