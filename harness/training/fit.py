"""Model and data checked together, by rank 0 as its first exec, before any worker trains: one batch of two
training samples through the model and the loss.

A model built for other data fails only once it meets a batch (a token model fed images, an MLP fed
token ids: "mat1 and mat2 must have the same dtype"), and in every worker, in a traceback. Here the
same failure is one line naming both flags.

Where the batch runs: a model of at most FAST_LIMIT parameters on real weights on the CPU. A larger one
on the meta device first, which allocates nothing and reads no value: building GPT-2 124M on the CPU and
running two samples took 6.8 s of the 2-core machine, and held the workers' first step back by 4.7-6.5 s
on the GPU host (measured when the parent made this check). A model that passes there has passed; a
failure there may be the meta device's own (``.item()``, a CPU tensor kept by the model, an operation
without a meta kernel: Hugging Face's GPT-2 and Llama fail so), so it is refused only once real weights
on the CPU fail too. Likewise a factory that cannot build on the meta device at all (one that loads
weights with ``from_pretrained``, or reads a value) is built on the CPU instead, whatever its size: its
size cannot be known without it, and each worker builds it so anyway (rank 0's check is its own first
exec, whose model is gone before it trains). A model of more than REAL_LIMIT parameters is never built
on the CPU here: a failure on the meta device is then left to the workers to report. Of what depends on values, targets
beyond the model's classes or vocabulary are checked apart on the meta device (``targets_beyond``); an
input token id beyond the embedding is left to the workers.
"""
from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from harness.data.batch import Batch, call_model, is_pair, tree_map
from harness.training.config import ConfigError, TrainConfig, one_line_errors
from harness.training.losses import logits_of, make_loss, own_loss

if TYPE_CHECKING:
    from harness.checkout.datasets import DataInfo

FAST_LIMIT = 20_000_000         # parameters: above this the batch runs on the meta device first
REAL_LIMIT = 200_000_000        # parameters: above this it never runs on real weights here
SAMPLES = 2


class Problem(NamedTuple):
    """What a batch met in the check: the first line of what was raised (or of what is wrong), and whose it is:
    "model" (the model against the data), "default loss" (cross-entropy against the model's output and the data's
    targets), "loss" (the user's --loss raised it) or "gradient" (the loss depends on no trainable parameter:
    training would change nothing)."""

    line: str
    source: str = "model"


def check_fit(config: TrainConfig, info: DataInfo, train: Any | None) -> None:
    """Raises ConfigError when the model's options are wrong, or the model does not take the dataset's batches
    or the loss its output. ``train``: the training split ``check_data`` opened (None: synthetic data, of which
    a few samples are made here)."""
    from harness.checkout.datasets import open_data
    from harness.data.pipeline import evaluation_batches
    if train is None:
        options = {**config.dataset_options, "size": 4} if config.dataset == "synthetic" else config.dataset_options
        train = open_data(config.dataset, config.data_dir, seed=config.seed, val_fraction=0.0, **options).train
    # the run's own batch size where it is below SAMPLES: a BatchNorm that a single sample cannot train fails here
    try:
        batch = next(evaluation_batches(train, 0, 1, min(SAMPLES, config.batch_size), torch.device("cpu")))
    except RuntimeError as e:       # the default collate stacks the samples: they must share a shape
        if "stack expects each tensor to be equal size" not in str(e):
            raise
        raise ConfigError(f"--dataset {config.dataset}: its samples differ in shape, so they do not stack into a "
                          f"batch ({str(e).strip().splitlines()[0]}); pad them to one shape, or give the dataset a "
                          "collate_fn attribute that pads a list of samples into a batch") from None
    model = on_meta(config, info)
    size = sum(p.numel() for p in model.parameters()) if model is not None else 0
    if size > FAST_LIMIT:
        output, problem = run_batch(config, model, batch, torch.device("meta"))
        if problem is None:
            beyond = targets_beyond(logits_of(output), batch) if config.loss is None and own_loss(output) is None \
                else None
            if beyond is not None:
                raise refusal(config, info.kind, batch, Problem(beyond))
            return
        if size > REAL_LIMIT:
            return
    with one_line_errors():
        model = on_cpu(config, info)
    _, problem = run_batch(config, model, batch, torch.device("cpu"))
    if problem is not None:
        raise refusal(config, info.kind, batch, problem)


def on_meta(config: TrainConfig, info: DataInfo) -> Any | None:
    """The model built on the meta device, which allocates nothing; None where its factory cannot build it
    there (one that loads weights, ``from_pretrained``, or reads a value, ``.item()``): it is built on real
    weights then, which says whether the failure was the meta device's or the factory's."""
    from harness.training.build import make_model
    try:
        with torch.device("meta"):
            return make_model(config, info, torch.device("meta"))
    except Exception:
        return None


def on_cpu(config: TrainConfig, info: DataInfo) -> Any:
    """The model on real weights. A TypeError of its factory is an option of the wrong kind (a number for a list,
    a keyword it does not take): it names the flags it came from, which the factory's own words do not."""
    from harness.training.build import make_model
    try:
        return make_model(config, info, torch.device("cpu"))
    except TypeError as e:
        given = f" --model-options '{json.dumps(config.model_options)}'" if config.model_options else ""
        raise ConfigError(f"--model {config.model}{given}: {str(e).strip().splitlines()[0]}") from None


def run_batch(config: TrainConfig, model: Any, batch: Batch, device: torch.device) -> tuple[Any, Problem | None]:
    """(the model's output, None) where ``batch`` went through ``model`` and the loss on ``device`` (or met an
    operation without a meta kernel: nothing can be said then), else (None, what it raised and where). Autograd
    records it, so a loss that no trainable parameter reaches is found too, and keeps none of its activations
    (what a backward would need is dropped as it is saved: no backward runs)."""
    if next(model.parameters(), None) is None:
        return None, Problem("the model has no parameters at all", "gradient")
    if not any(p.requires_grad for p in model.parameters()):
        return None, Problem("none of the model's parameters requires grad; unfreeze some (requires_grad=True)",
                             "gradient")
    moved = tree_map(lambda t: t.to(device), batch)
    stage = "model"
    try:
        with warnings.catch_warnings(), torch.autograd.graph.saved_tensors_hooks(_dropped, _dropped):
            warnings.simplefilter("ignore")       # said again by training itself, where they belong
            output = call_model(model, moved)
            stage = "loss"
            loss = make_loss(config.loss)(output, moved)
        if not torch.is_tensor(loss):
            raise TypeError(f"it returned a {type(loss).__name__}, not a 0-d tensor")
        if loss.dim() != 0:
            raise TypeError(f"it returned a tensor of shape {list(loss.shape)}, not a 0-d tensor (reduce it: .mean())")
    except NotImplementedError:
        return None, None
    except (RuntimeError, TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, Problem(line, stage if stage == "model" or config.loss is not None else "default loss")
    if not loss.requires_grad:
        return None, Problem("the loss does not require grad; make it from the model's output without .detach() "
                             "or torch.no_grad()", "gradient")
    return output, None


def _dropped(_: Any) -> None:
    """What autograd keeps for a backward that the check never runs: nothing."""


def targets_beyond(logits: Any, batch: Batch) -> str | None:
    """What cross-entropy on real weights says where a pair's integer targets reach ``logits.shape[-1]`` (a
    model built for fewer classes or a smaller vocabulary), for a batch that went through on the meta device."""
    targets = batch[1] if is_pair(batch) else None
    if not torch.is_tensor(logits) or not torch.is_tensor(targets) or targets.is_floating_point() \
            or targets.numel() == 0:
        return None
    top = int(targets.max())
    return f"Target {top} is out of bounds: the model's output has {logits.shape[-1]} classes" \
        if top >= logits.shape[-1] else None


def refusal(config: TrainConfig, kind: str, batch: Batch, problem: Problem) -> ConfigError:
    doubles = [t for t in (batch.values() if isinstance(batch, dict) else batch) if torch.is_tensor(t)
               and t.dtype == torch.float64]
    if doubles and "Double" in problem.line:    # numpy's float64 samples against float32 weights: the data's to fix
        return ConfigError(f"--dataset {config.dataset} gives float64 samples, which --model {config.model}'s float32 "
                           f"weights do not take ({problem.line}); make them float32 (x.astype(np.float32), "
                           "torch.from_numpy(x).float())")
    if problem.source == "gradient":
        loss = f"--loss {config.loss}" if config.loss else "the loss"
        return ConfigError(f"--model {config.model}: {loss} depends on no parameter that trains, so training would "
                           f"change nothing: {problem.line}")
    if "Expected more than 1 value per channel" in problem.line and config.batch_size == 1:
        return ConfigError(f"--batch-size 1: --model {config.model} normalises over the batch (BatchNorm), which one "
                           f"sample cannot train ({problem.line}); use --batch-size 2 or more")
    if problem.source == "loss":
        return ConfigError(f"--loss {config.loss} does not take the output of --model {config.model}: "
                           f"{problem.line} (a batch of {_describe(batch)}); the loss is called "
                           "as fn(output, batch) and must return a scalar tensor")
    return ConfigError(f"--model {config.model} does not fit --dataset {config.dataset}: {problem.line} (a batch of "
                       f"{_describe(batch)}); {_advice(kind, batch, problem)}")


def _advice(kind: str, batch: Batch, problem: Problem) -> str:
    """What to change where the model or the default loss refuse the batch: float targets are not class indices
    (one-hot rows, or a regression's values), which cross-entropy, the default loss, needs; else the model or the
    options are not made for this data."""
    values = list(batch.values() if isinstance(batch, dict) else batch)
    if any(isinstance(v, (list, tuple)) for v in values):
        return ("the batch holds lists, not tensors: give tensors (a Hugging Face datasets.Dataset does after "
                ".set_format(\"torch\"), or .with_format(\"torch\"))")
    targets = batch[1] if is_pair(batch) else None
    if problem.source != "default loss" or not torch.is_tensor(targets):
        return f"pick a model made for {kind} data, or fix --model-options/--dataset-options to match"
    if targets.is_floating_point():
        return ("its targets are floats, and the default loss is cross-entropy over class indices: give class "
                "indices (.long(); y.argmax(-1) of one-hot rows), or pass --loss package.module:fn for a regression")
    if targets.dim() == 2 and targets.shape[1] > 1 and bool(((targets == 0) | (targets == 1)).all()):
        return "its targets look like one-hot rows, and the default loss takes class indices: give y.argmax(-1)"
    if targets.dtype != torch.int64:
        return (f"its targets are {str(targets.dtype).removeprefix('torch.')}, and the default loss takes int64 "
                "class indices: give y.long() (torch.from_numpy(y).long())")
    return f"pick a model made for {kind} data, or fix --model-options/--dataset-options to match"


def _describe(batch: Batch) -> str:
    named = batch.items() if isinstance(batch, dict) else zip(("x", "y") if is_pair(batch) else
                                                              (f"[{i}]" for i in range(len(batch))), batch)
    return ", ".join(f"{name} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}" if torch.is_tensor(t) else
                     f"{name} {type(t).__name__} of {len(t)}" for name, t in named
                     if torch.is_tensor(t) or isinstance(t, (list, tuple)))
