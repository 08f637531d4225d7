"""Model and data checked together, in the parent, before any worker trains: one real batch of two
training samples through the model and the loss, on the CPU.

A model built for other data fails only once it meets a batch (a token model fed images, an MLP fed
token ids: "mat1 and mat2 must have the same dtype"), and in every worker, in a traceback. Here the
same failure is one line naming both flags. A model of more than REAL_LIMIT parameters is run on the
meta device instead: on the CPU, building GPT-2 124M and running two samples took the parent 6.8 s of
the 2-core machine, and on the GPU host it held the workers' first step back as long. The meta device
checks shapes and dtypes and reads no value; of what depends on values, targets beyond the model's
classes or vocabulary are checked apart (``check_targets``), the rest (an input token id beyond the
embedding) is left to the workers.
"""
from __future__ import annotations

import torch

from harness.data.batch import Batch, call_model, is_pair, tree_map
from harness.training.config import ConfigError, TrainConfig
from harness.training.losses import logits_of, make_loss, own_loss

REAL_LIMIT = 20_000_000         # parameters: above this the batch runs on the meta device
SAMPLES = 2


def check_fit(config: TrainConfig) -> None:
    """Raises ConfigError when the model does not take the dataset's batches or the loss its output."""
    from harness.checkout.datasets import open_data
    from harness.data.pipeline import evaluation_batches
    from harness.training.build import make_model
    options = {**config.dataset_options, "size": 4} if config.dataset == "synthetic" else config.dataset_options
    data = open_data(config.dataset, config.data_dir, seed=config.seed, val_fraction=0.0, **options)
    batch = next(evaluation_batches(data.train, 0, 1, SAMPLES, torch.device("cpu")))
    with torch.device("meta"):
        model = make_model(config, data.info, torch.device("meta"))
    device = torch.device("cpu") if sum(p.numel() for p in model.parameters()) <= REAL_LIMIT else torch.device("meta")
    if device.type == "cpu":
        model = make_model(config, data.info, device)
    moved = tree_map(lambda t: t.to(device), batch)
    try:
        with torch.no_grad():
            output = call_model(model, moved)
            loss = make_loss(config.loss)(output, moved)
        if not torch.is_tensor(loss) or loss.dim() != 0:
            raise TypeError(f"the loss is a {type(loss).__name__} of shape {getattr(loss, 'shape', '?')}, not a scalar")
        if device.type == "meta" and config.loss is None and own_loss(output) is None:     # cross-entropy's
            check_targets(logits_of(output), batch)
    except NotImplementedError:         # an operation without a meta kernel: nothing can be said here
        return
    except (RuntimeError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ConfigError(f"--model {config.model} does not fit --dataset {config.dataset}: "
                          f"{str(e).strip().splitlines()[0]} (a batch of {_describe(batch)}); "
                          f"pick a model made for {data.info.kind} data, or fix --model-options/--dataset-options "
                          "to match") from None


def check_targets(logits: torch.Tensor | None, batch: Batch) -> None:
    """What cross-entropy on real weights would have refused, where the batch ran on the meta device, which
    looks at no value: a pair's class (or next-token) targets beyond the logits' last dimension, a model
    built for fewer classes or a smaller vocabulary than the data's. Raises IndexError as cross-entropy does."""
    targets = batch[1] if is_pair(batch) else None
    if logits is None or logits.dim() < 2 or not torch.is_tensor(targets) or targets.is_floating_point() \
            or targets.numel() == 0:
        return
    top = int(targets.max())
    if top >= logits.shape[-1]:
        raise IndexError(f"Target {top} is out of bounds: the model's output has {logits.shape[-1]} classes")


def _describe(batch: Batch) -> str:
    named = batch.items() if isinstance(batch, dict) else zip(("x", "y") if is_pair(batch) else
                                                              (f"[{i}]" for i in range(len(batch))), batch)
    return ", ".join(f"{name} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}" for name, t in named
                     if torch.is_tensor(t))
