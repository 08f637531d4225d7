"""Evaluating a model: validation during training (``evaluate``) and Test.py's test of a checkpoint
(``evaluate_checkpoint``: the loss and, where predictions can be counted, a confusion matrix over the
test split, on workers in parallel or in-process). Any batch kind (harness/data/batch.py); the loss is
the training loss (harness/training/losses.py).
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterable

import torch

from harness.checkout.datasets.split import other_classes
from harness.data.batch import Batch, call_model, is_pair, samples
from harness.resilience.checkpoint import ModelMismatch, load_model_state
from harness.training.config import TrainConfig
from harness.training.losses import logits_of, make_loss

MAX_CONFUSION_CLASSES = 1000      # beyond this (a language model's vocabulary) count hits only
EXAMPLES = 8                      # test samples shown with the model's prediction


@torch.no_grad()
def evaluate(model: torch.nn.Module, forward: Callable[[Batch], tuple[Any, torch.Tensor]], batches: Iterable[Batch],
             autocast: Callable[[], contextlib.AbstractContextManager]) -> tuple[float, float, float, float]:
    """(summed loss, correct predictions, predictions counted, samples) over the batches, ``forward`` giving
    ``model``'s (output, loss) on a batch (harness/training/build.py: model_output_loss). Predictions are
    counted only where they mean something: an (x, y) pair whose model returns logits shaped like ``y``."""
    was_training = model.training
    model.eval()
    loss_sum = correct = count = seen = 0.0
    for batch in batches:
        with autocast():
            out, loss = forward(batch)
            loss_sum += loss.item() * samples(batch)
        seen += samples(batch)
        hits = _hits(out, batch)
        if hits is not None:
            correct, count = correct + hits[0], count + hits[1]
    model.train(was_training)
    return loss_sum, correct, count, seen


def _predicted(out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the predicted classes, the labels), shaped alike, where the batch has class labels they can be compared
    with: integer targets, one per row of logits over two classes or more, also given one per row as ``(N, 1)``
    (a regression's float targets, or a single output, have none)."""
    logits = logits_of(out)
    if not is_pair(batch) or logits is None or logits.shape[-1] < 2:
        return None
    y = batch[1]
    if y.is_floating_point() or y.is_complex() or y.shape not in (logits.shape[:-1], (*logits.shape[:-1], 1)):
        return None
    return logits.argmax(-1), y.view(logits.shape[:-1])


def _hits(out: Any, batch: Batch) -> tuple[int, int] | None:
    predicted = _predicted(out, batch)
    return None if predicted is None else ((predicted[0] == predicted[1]).sum().item(), predicted[1].numel())


class OtherClasses(ValueError):
    """The test data's classes are not the ones the checkpoint's model was trained on: its scores would be wrong."""


def _trained_model(state: dict, device: torch.device) -> tuple[TrainConfig, Any, torch.nn.Module]:
    """(the checkpoint's config, its test split, its model in eval mode on ``device``)."""
    from harness.training.build import load_data, make_model
    config = TrainConfig.from_dict(state["config"])
    data = load_data(config)
    if data.test is None:
        raise FileNotFoundError(f"dataset {config.dataset} has no test split to evaluate (its factory "
                                "returned None for 'val')" if ":" in config.dataset else
                                f"--dataset {config.dataset} has no test split in {config.data_dir}"
                                + (" (the run held none out: --val-fraction 0)" if not config.val_fraction else "")
                                + "; add one (DIR/val/ for an image folder) and pass Test.py --data-dir DIR")
    other = other_classes(config.classes, data.test.info.class_names)
    if other:
        raise OtherClasses(f"the data's {other}; test it on data of the classes it trained on")
    model = make_model(config, data.test.info, device)
    try:
        load_model_state(model, state["model"])
    except ModelMismatch as e:
        raise ModelMismatch(e.sentence("the checkpoint", config.model)) from None
    return config, data.test, model.eval()


def score_shard(ctx: Any, state: dict, batch_size: int) -> dict:
    """Runs in each worker (or in-process with ctx=None) on its share of the test split: the summed loss,
    the samples, and the confusion matrix of the predictions where they can be counted (for very many
    classes the pair (correct, counted) as a 1 x 2 tensor; all zeros where nothing is counted)."""
    from harness.data.pipeline import default_data_workers, evaluation_batches
    from harness.training.build import autocast
    device = ctx.device if ctx is not None else torch.device("cpu")
    config, test, model = _trained_model(state, device)
    loss = make_loss(config.loss)
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    classes = test.info.num_classes
    full = 0 < classes <= MAX_CONFUSION_CLASSES
    score = {"confusion": torch.zeros((classes, classes) if full else (1, 2), dtype=torch.int64), "loss_sum": 0.0,
             "samples": 0}
    with torch.no_grad():
        for batch in evaluation_batches(test, rank, world, batch_size, device, default_data_workers(world)):
            with autocast(config, device):
                out = call_model(model, batch)
                score["loss_sum"] += loss(out, batch).item() * samples(batch)
            score["samples"] += samples(batch)
            predicted = _predicted(out, batch)
            if predicted is not None:
                score["confusion"] += _confusion(predicted[0].cpu(), predicted[1].cpu(), classes, full)
    return score


def _confusion(predicted: torch.Tensor, y: torch.Tensor, classes: int, full: bool) -> torch.Tensor:
    if full:
        return torch.bincount((y * classes + predicted).flatten(), minlength=classes * classes).view(classes, classes)
    return torch.tensor([[(predicted == y).sum().item(), y.numel()]])


def examples(state: dict) -> list[dict]:
    """A few test samples with the model's prediction (the seed's oddeven lines for oddeven)."""
    from harness.checkout.datasets import decode_oddeven
    from harness.data.pipeline import evaluation_batches
    config, test, model = _trained_model(state, torch.device("cpu"))
    batch = next(evaluation_batches(test, 0, max(1, len(test) // EXAMPLES), EXAMPLES, torch.device("cpu")))
    with torch.no_grad():
        out = call_model(model, batch)
    predicted = _predicted(out, batch)
    if predicted is None:        # no class labels to show predictions against
        return []
    x, y = batch[0], predicted[1]
    probabilities = logits_of(out).float().softmax(-1)
    if config.dataset == "oddeven":
        numbers = decode_oddeven(x)
        return [{"input": int(n), "p_odd": float(p[1])} for n, p in zip(numbers, probabilities)]
    names = test.info.class_names or tuple(str(c) for c in range(test.info.num_classes))
    return [{"label": names[int(label)], "prediction": names[int(p.argmax())], "confidence": float(p.max())}
            for label, p in zip(y, probabilities) if label.dim() == 0]


def summarize(state: dict, score: dict, shown: list[dict]) -> dict:
    """Test.py's result: the loss, and where predictions can be counted the accuracy, per-class accuracy
    and confusion matrix (None and [] where they cannot), the samples, examples."""
    confusion = score["confusion"]
    if confusion.shape == (1, 2):               # hits only (see MAX_CONFUSION_CLASSES), or nothing counted
        counted, hits = int(confusion[0, 1]), int(confusion[0, 0])
        per_class, matrix = [], None
    else:
        counted, hits = int(confusion.sum()), int(confusion.diag().sum())
        per_class = [hit / total if total else None        # None: no sample of that class in the split
                     for hit, total in zip(confusion.diag().tolist(), confusion.sum(1).tolist())] if counted else []
        matrix = confusion.tolist() if counted else None
    return {"accuracy": hits / counted if counted else None, "loss": score["loss_sum"] / max(score["samples"], 1),
            "samples": counted or score["samples"], "per_class_accuracy": per_class, "confusion_matrix": matrix,
            "examples": shown, "model": state["config"]["model"], "dataset": state["config"]["dataset"],
            "epoch": state["epoch"], "step": state["step"], "evaluates": evaluated(state["config"])}


def evaluated(config: dict) -> str:
    """What the test split is, in words: an image folder's val/, or the part of train/ carved for it."""
    from harness.checkout.datasets import describe_test
    return describe_test(config["dataset"], config.get("data_dir"), config.get("val_fraction", 0.0))


SHOWN_CLASSES = 20      # more (a language model's vocabulary) are left to --json


def report(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    print(f"{result['model']} on {result['dataset']}, {result['evaluates']} ({result['samples']} samples), "
          f"trained {result['epoch']} epoch{'s' * (result['epoch'] != 1)} / {result['step']} updates")
    print(f"loss: {result['loss']:.4f}")
    if result["accuracy"] is not None:
        print(f"accuracy: {result['accuracy']:.4f}")
    per_class = result["per_class_accuracy"]
    if per_class and len(per_class) <= SHOWN_CLASSES:
        print("per-class accuracy: " + ", ".join(f"{c}: " + ("n/a" if a is None else f"{a:.3f}")
                                                 for c, a in enumerate(per_class)))
    elif per_class:
        print(f"per-class accuracy and confusion matrix: {len(per_class)} classes, in --json")
    matrix = result["confusion_matrix"]
    if matrix is not None and len(matrix) <= SHOWN_CLASSES:
        print("confusion matrix (rows: true class, columns: predicted):")
        for row in matrix:
            print("  " + " ".join(f"{v:4d}" for v in row))
    for example in result["examples"]:
        if "p_odd" in example:
            print(f"Input: {example['input']}, Prediction: {example['p_odd']:.2f} (> 0.5 => odd)")
        else:
            print(f"label {example['label']}, predicted {example['prediction']} ({example['confidence']:.2f})")


def evaluate_checkpoint(state: dict, workers: int, gpus: list[int], batch_size: int) -> dict:
    """The checkpoint's model on its test split: on ``workers`` workers (on ``gpus``, else CPU) or, with
    none, in this process. Raises ChildError/ChildFailed/FileNotFoundError when evaluation fails, ModelMismatch
    (here, before any worker starts: the examples are made first) where the model built now does not fit it."""
    from harness import Parent
    shown = examples(state)
    if workers:
        with Parent() as parent:
            kids = parent.fork(workers, gpus=gpus or None)
            kids.exec(score_shard, state, batch_size)
            scores = kids.wait()
    else:
        scores = [score_shard(None, state, batch_size)]
    total = {key: sum(score[key] for score in scores) for key in scores[0]}
    return summarize(state, total, shown)
