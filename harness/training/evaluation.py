"""Evaluating a model: validation during training (``evaluate``) and Test.py's test of a checkpoint
(``test_checkpoint``: a confusion matrix over the test split, on workers in parallel or in-process).
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterable

import torch

from harness.training.config import TrainConfig

MAX_CONFUSION_CLASSES = 1000      # beyond this (a language model's vocabulary) count hits only
EXAMPLES = 8                      # test samples shown with the model's prediction


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             autocast: Callable[[], contextlib.AbstractContextManager]) -> tuple[float, float, int]:
    """(summed loss, correct predictions, predictions counted) over the batches."""
    from harness.checkout.models import loss_fn
    was_training = model.training
    model.eval()
    loss = correct = count = 0.0
    for xb, yb in batches:
        with autocast():
            out = model(xb)
        loss += loss_fn(out.float(), yb).item() * len(xb)
        correct += (out.argmax(-1) == yb).sum().item()
        count += yb.numel()
    model.train(was_training)
    return loss, correct, count


def _trained_model(state: dict, device: torch.device) -> tuple[TrainConfig, Any, torch.nn.Module]:
    """(the checkpoint's config, its test split, its model in eval mode on ``device``)."""
    from harness.training.build import load_data, make_model
    config = TrainConfig.from_dict(state["config"])
    data = load_data(config)
    if data.test is None:
        raise FileNotFoundError(f"dataset {config.dataset} has no test split to evaluate (its factory "
                                "returned None for 'val')")
    model = make_model(config, data.test.info, device)
    model.load_state_dict(state["model"])
    return config, data.test, model.eval()


def confusion_on_shard(ctx: Any, state: dict, batch_size: int) -> torch.Tensor:
    """Runs in each worker (or in-process with ctx=None): the confusion matrix of its share of the
    test split, or for very many classes the pair (correct, counted) as a 1 x 2 tensor."""
    from harness.data.pipeline import default_data_workers, evaluation_batches
    from harness.training.build import autocast
    device = ctx.device if ctx is not None else torch.device("cpu")
    config, test, model = _trained_model(state, device)
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    classes = test.info.num_classes
    full = classes <= MAX_CONFUSION_CLASSES
    confusion = torch.zeros((classes, classes) if full else (1, 2), dtype=torch.int64)
    with torch.no_grad():
        for x, y in evaluation_batches(test, rank, world, batch_size, device, default_data_workers(world)):
            with autocast(config, device):
                predicted = model(x).argmax(-1).cpu()
            y = y.cpu()
            if full:
                confusion += torch.bincount((y * classes + predicted).flatten(),
                                            minlength=classes * classes).view(classes, classes)
            else:
                confusion += torch.tensor([[(predicted == y).sum().item(), y.numel()]])
    return confusion


def examples(state: dict) -> list[dict]:
    """A few test samples with the model's prediction (the seed's oddeven lines for oddeven)."""
    from harness.checkout.datasets import decode_oddeven
    from harness.data.pipeline import evaluation_batches
    config, test, model = _trained_model(state, torch.device("cpu"))
    x, y = next(evaluation_batches(test, 0, max(1, len(test) // EXAMPLES), EXAMPLES, torch.device("cpu")))
    with torch.no_grad():
        probabilities = model(x).float().softmax(-1)
    if config.dataset == "oddeven":
        numbers = decode_oddeven(x)
        return [{"input": int(n), "p_odd": float(p[1])} for n, p in zip(numbers, probabilities)]
    names = test.info.class_names or tuple(str(c) for c in range(test.info.num_classes))
    return [{"label": names[int(label)], "prediction": names[int(p.argmax())], "confidence": float(p.max())}
            for label, p in zip(y, probabilities) if label.dim() == 0]


def summarize(state: dict, confusion: torch.Tensor, shown: list[dict]) -> dict:
    """Test.py's result: accuracy, samples, per-class accuracy, the confusion matrix, examples."""
    if confusion.shape == (1, 2):               # hits only (see MAX_CONFUSION_CLASSES)
        total, hits = int(confusion[0, 1]), int(confusion[0, 0])
        per_class, matrix = [], None
    else:
        total, hits = int(confusion.sum()), int(confusion.diag().sum())
        per_class = (confusion.diag().double() / confusion.sum(1).clamp(min=1)).tolist()
        matrix = confusion.tolist()
    return {"accuracy": hits / total, "samples": total, "per_class_accuracy": per_class,
            "confusion_matrix": matrix, "examples": shown, "model": state["config"]["model"],
            "dataset": state["config"]["dataset"], "epoch": state["epoch"], "step": state["step"],
            "evaluates": evaluated(state["config"])}


def evaluated(config: dict) -> str:
    """What the test split is, in words: an image folder's val/, or the part of train/ carved for it."""
    from harness.checkout.datasets import describe_test
    return describe_test(config["dataset"], config.get("data_dir"), config.get("val_fraction", 0.0))


def report(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    print(f"{result['model']} on {result['dataset']}, {result['evaluates']} ({result['samples']} samples), "
          f"trained {result['epoch']} epochs / {result['step']} updates")
    print(f"accuracy: {result['accuracy']:.4f}")
    if result["per_class_accuracy"]:
        print("per-class accuracy: " + ", ".join(f"{c}: {a:.3f}" for c, a in enumerate(result["per_class_accuracy"])))
    matrix = result["confusion_matrix"]
    if matrix is not None and len(matrix) <= 20:
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
    none, in this process. Raises ChildError/ChildFailed/FileNotFoundError when evaluation fails."""
    from harness import Parent
    if workers:
        with Parent() as parent:
            kids = parent.fork(workers, gpus=gpus or None)
            kids.exec(confusion_on_shard, state, batch_size)
            confusion = sum(kids.wait())
    else:
        confusion = confusion_on_shard(None, state, batch_size)
    return summarize(state, confusion, examples(state))
