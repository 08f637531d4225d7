"""Evaluate what Train.py saved: python Test.py --help

Rebuilds the model from the checkpoint's config, evaluates it on the dataset's test split (in
this process, or on workers in parallel with --gpus / --cpu-workers) and prints
"accuracy: 0.9xxx", per-class accuracy, a confusion matrix and a few example predictions.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from harness import ChildError, ChildFailed, Parent
from harness.resilience.checkpoint import CheckpointError, load_checkpoint
from harness.launch.placement import resolve_gpus

DEFAULT_CHECKPOINT = "checkpoints/model.pt"
EXAMPLES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help=f"default {DEFAULT_CHECKPOINT} (Train.py's default)")
    p.add_argument("--data-dir", default=None, help="override the data directory saved in the checkpoint")
    p.add_argument("--gpus", default=None, help="evaluate on workers on these GPUs ('all' or 0,1,...)")
    p.add_argument("--cpu-workers", type=int, default=0, help="evaluate on this many CPU workers in parallel")
    p.add_argument("--batch-size", type=int, default=None, help="default: the training batch size")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return p.parse_args(argv)


MAX_CONFUSION_CLASSES = 1000      # beyond this (a language model's vocabulary) count hits only


def confusion_on_shard(ctx, state: dict, batch_size: int) -> torch.Tensor:
    """Runs in each worker (or in-process with ctx=None): the confusion matrix of its share of the
    test split, or for very many classes the pair (correct, counted) as a 1 x 2 tensor."""
    from harness.data.pipeline import default_data_workers, evaluation_batches
    from harness.training.loop import autocast, load_data, make_model
    config = state["config"]
    device = ctx.device if ctx is not None else torch.device("cpu")
    test = _test_split(load_data(config), config)
    model = make_model(config, test.info, device)
    model.load_state_dict(state["model"])
    model.eval()
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


def _test_split(data, config: dict):
    if data.test is None:
        raise FileNotFoundError(f"dataset {config['dataset']} has no test split to evaluate (its factory "
                                "returned None for 'val')")
    return data.test


def examples(state: dict) -> list[dict]:
    """A few test samples with the model's prediction (the seed's oddeven lines for oddeven)."""
    from harness.checkout.datasets import decode_oddeven
    from harness.data.pipeline import evaluation_batches
    from harness.training.loop import load_data, make_model
    config = state["config"]
    test = _test_split(load_data(config), config)
    model = make_model(config, test.info, torch.device("cpu"))
    model.load_state_dict(state["model"])
    model.eval()
    x, y = next(evaluation_batches(test, 0, max(1, len(test) // EXAMPLES), EXAMPLES, torch.device("cpu")))
    with torch.no_grad():
        probabilities = model(x).float().softmax(-1)
    if config["dataset"] == "oddeven":
        numbers = decode_oddeven(x)
        return [{"input": int(n), "p_odd": float(p[1])} for n, p in zip(numbers, probabilities)]
    names = test.info.class_names or tuple(str(c) for c in range(test.info.num_classes))
    out = []
    for label, p in zip(y, probabilities):
        if label.dim() == 0:
            out.append({"label": names[int(label)], "prediction": names[int(p.argmax())], "confidence": float(p.max())})
    return out


def report(state: dict, confusion: torch.Tensor, shown: list[dict], as_json: bool) -> None:
    if confusion.shape == (1, 2):               # hits only (see MAX_CONFUSION_CLASSES)
        total, accuracy, per_class, confusion = int(confusion[0, 1]), int(confusion[0, 0]) / int(confusion[0, 1]), [], None
    else:
        total = int(confusion.sum())
        accuracy = float(confusion.diag().sum()) / total
        per_class = (confusion.diag().double() / confusion.sum(1).clamp(min=1)).tolist()
    if as_json:
        print(json.dumps({"accuracy": accuracy, "samples": total, "per_class_accuracy": per_class,
                          "confusion_matrix": confusion.tolist() if confusion is not None else None,
                          "examples": shown,
                          "model": state["config"]["model"], "dataset": state["config"]["dataset"],
                          "epoch": state["epoch"], "step": state["step"]}))
        return
    print(f"{state['config']['model']} on {state['config']['dataset']} test split ({total} samples), "
          f"trained {state['epoch']} epochs / {state['step']} updates")
    print(f"accuracy: {accuracy:.4f}")
    if per_class:
        print("per-class accuracy: " + ", ".join(f"{c}: {a:.3f}" for c, a in enumerate(per_class)))
    if confusion is not None and len(confusion) <= 20:
        print("confusion matrix (rows: true class, columns: predicted):")
        for row in confusion.tolist():
            print("  " + " ".join(f"{v:4d}" for v in row))
    for example in shown:
        if "p_odd" in example:
            print(f"Input: {example['input']}, Prediction: {example['p_odd']:.2f} (> 0.5 => odd)")
        else:
            print(f"label {example['label']}, predicted {example['prediction']} ({example['confidence']:.2f})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if (args.batch_size is not None and args.batch_size < 1) or args.cpu_workers < 0:
        print(f"Test.py: error: --batch-size must be at least 1 (got {args.batch_size}) and --cpu-workers "
              f"at least 0 (got {args.cpu_workers})", file=sys.stderr)
        return 2
    try:
        state = load_checkpoint(args.checkpoint)
        gpus = resolve_gpus(args.gpus)
    except (CheckpointError, ValueError) as e:
        print(f"Test.py: error: {e}", file=sys.stderr)
        return 2
    if args.data_dir:
        state["config"]["data_dir"] = args.data_dir
    workers = len(gpus) or args.cpu_workers
    batch_size = args.batch_size or state["config"]["batch_size"]
    try:
        if workers:
            with Parent() as parent:
                kids = parent.fork(workers, gpus=gpus or None)
                kids.exec(confusion_on_shard, state, batch_size)
                confusion = sum(kids.wait())
        else:
            confusion = confusion_on_shard(None, state, batch_size)
    except (ChildError, ChildFailed, FileNotFoundError) as e:
        print(f"Test.py: evaluation failed: {e}", file=sys.stderr)
        return 1
    report(state, confusion, examples(state), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
