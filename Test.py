"""Evaluate what Train.py saved: python Test.py --help

Rebuilds the model from the checkpoint's config, evaluates it on the dataset's test split (in
this process, or on workers in parallel with --gpus / --cpu-workers) and prints
"accuracy: 0.9xxx", per-class accuracy, a confusion matrix and a few example predictions.
"""
from __future__ import annotations

import argparse
import os
import sys

from harness import ChildError, ChildFailed
from harness.checkout.datasets import FOLDERLESS
from harness.cli import OneLineParser
from harness.launch.placement import resolve_gpus
from harness.plugins import find_in_working_folder, unimportable
from harness.training.config import DEFAULT_SAVE, TrainConfig, rebased


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--checkpoint", default=DEFAULT_SAVE, help=f"default {DEFAULT_SAVE} (Train.py's default)")
    p.add_argument("--data-dir", default=None, help="override the data directory saved in the checkpoint")
    p.add_argument("--gpus", default=None, help="evaluate on workers on these GPUs ('all' or 0,1,...)")
    p.add_argument("--cpu-workers", type=int, default=0, help="evaluate on this many CPU workers in parallel")
    p.add_argument("--batch-size", type=int, default=None, help="default: the training batch size")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return p.parse_args(argv)


def trained_data_dir(config: dict, checkpoint: str) -> dict:
    """The checkpoint's config with a relative --data-dir that is not found from here read from the folder the
    trained run ran in (Test.py started elsewhere: config.rebased); one found from here is kept (a copied
    checkpoint tested from the project's folder)."""
    data_dir = config.get("data_dir")
    if not data_dir or os.path.isabs(data_dir) or os.path.exists(data_dir):
        return config
    return {**config, "data_dir": rebased(TrainConfig.from_dict(config), checkpoint).data_dir}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wrong = []
    if args.batch_size is not None and args.batch_size < 1:
        wrong.append(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.cpu_workers < 0:
        wrong.append(f"--cpu-workers must be at least 0, got {args.cpu_workers}")
    if wrong:
        print(f"Test.py: error: {'; '.join(wrong)}", file=sys.stderr)
        return 2
    # torch (3 s of imports) once the flags are good: --help and a mistyped flag answer at once, as Train.py's do
    from harness.resilience.checkpoint import CheckpointError, ModelMismatch, load_checkpoint
    from harness.training.evaluation import OtherClasses, evaluate_checkpoint, report
    try:
        state = load_checkpoint(args.checkpoint)
        gpus = resolve_gpus(args.gpus)
    except (CheckpointError, ValueError) as e:
        print(f"Test.py: error: {e}", file=sys.stderr)
        return 2
    state["config"] = trained_data_dir(state["config"], args.checkpoint)
    if args.data_dir:
        if state["config"]["dataset"] in FOLDERLESS:
            print(f"Test.py: error: --data-dir {args.data_dir}: the checkpoint's --dataset {state['config']['dataset']} "
                  "reads no folder (it is bundled or generated); drop --data-dir", file=sys.stderr)
            return 2
        state["config"]["data_dir"] = args.data_dir
    for what in ("model", "dataset", "loss"):
        why = unimportable(state["config"].get(what) or "", what)
        if why:
            print(f"Test.py: error: {why}", file=sys.stderr)
            return 2
    try:
        result = evaluate_checkpoint(state, len(gpus) or args.cpu_workers, gpus,
                                 args.batch_size or state["config"]["batch_size"])
    except (ModelMismatch, OtherClasses) as e:
        print(f"Test.py: error: {args.checkpoint}: {e}", file=sys.stderr)
        return 2
    except (ChildError, ChildFailed, FileNotFoundError) as e:
        print(f"Test.py: evaluation failed: {e}", file=sys.stderr)
        return 1
    report(result, args.json)
    return 0


if __name__ == "__main__":
    find_in_working_folder()        # as a command only: a process that calls main() keeps its own path
    sys.exit(main())
