"""Model and data checked together, in the parent, before any worker trains: one real batch of two
training samples through the model and the loss, on the CPU.

A model built for other data fails only once it meets a batch (a token model fed images, an MLP fed
token ids: "mat1 and mat2 must have the same dtype"), and in every worker, in a traceback. Here the
same failure is one line naming both flags. A model of more than REAL_LIMIT parameters is run on the
meta device instead (shapes and dtypes only: what depends on the values, such as a token id beyond the
vocabulary, is then left to the workers): on the CPU, building GPT-2 124M and running two samples took
the parent 6.8 s of the 2-core machine, and on the GPU host it held the workers' first step back as long.
"""
from __future__ import annotations

import torch

from harness.data.batch import Batch, call_model, is_pair, tree_map
from harness.training.config import ConfigError, TrainConfig
from harness.training.losses import make_loss

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
            loss = make_loss(config.loss)(call_model(model, moved), moved)
        if not torch.is_tensor(loss) or loss.dim() != 0:
            raise TypeError(f"the loss is a {type(loss).__name__} of shape {getattr(loss, 'shape', '?')}, not a scalar")
    except NotImplementedError:         # an operation without a meta kernel: nothing can be said here
        return
    except (RuntimeError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ConfigError(f"--model {config.model} does not fit --dataset {config.dataset}: "
                          f"{str(e).strip().splitlines()[0]} (a batch of {_describe(batch)}); "
                          f"pick a model made for {data.info.kind} data, or fix --model-options/--dataset-options "
                          "to match") from None


def _describe(batch: Batch) -> str:
    named = batch.items() if isinstance(batch, dict) else zip(("x", "y") if is_pair(batch) else
                                                              (f"[{i}]" for i in range(len(batch))), batch)
    return ", ".join(f"{name} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}" for name, t in named
                     if torch.is_tensor(t))
