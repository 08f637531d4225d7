"""Train.py's command line: argparse groups whose destinations are TrainConfig's fields.

Every flag is ``--`` + a field name with dashes; its default is the field's (harness/training/config.py
is the one place defaults live). JSON options become dicts here; nothing else is checked here (that is
harness/training/checks.py), so a TrainConfig built in Python goes through the same checks.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Callable

from harness.launch.cluster import CHOICES as CLUSTER_CHOICES
from harness.launch.launchers import LAUNCHERS
from harness.cli import OneLineParser
from harness.spelling import did_you_mean
from harness.training.config import DEFAULT_SAVE, ConfigError, TrainConfig
from harness.training.optim import IMPLS, OPTIMIZERS
from harness.training.schedule import SCHEDULES

DEFAULTS = TrainConfig()


def _model_and_data(a: Callable[..., Any]) -> None:
    a("--model", help="registry name (cnn, gpt, hf-causal-lm, mlp, oddeven, resnet18, resnet50) or "
                      "package.module:factory")
    a("--model-options", help='JSON options for the model factory, e.g. \'{"hidden": [256]}\'')
    a("--loss", metavar="PACKAGE.MODULE:FN",
      help="the training loss fn(output, batch) -> scalar (default: the loss the model returns, a 0-d tensor, "
           "(logits, loss) or .loss, else cross-entropy of its logits against the batch's targets)")
    a("--dataset", help="in memory: cifar10, digits, mnist, oddeven, synthetic; streamed from --data-dir: imagefolder "
                        "(DIR/train/<class>/*.jpg, and DIR/val/ or else --val-fraction of train/), tokens "
                        "(DIR/train.bin and val.bin); or "
                        "package.module:factory returning a torch Dataset (called as factory(split, data_dir, **options))")
    a("--dataset-options",
      help='JSON options for the dataset, e.g. \'{"size": 8192}\' for synthetic, \'{"crop": 224, "resize": 256}\' '
           'for imagefolder, \'{"block_size": 1024, "dtype": "uint16", "vocab_size": 50257}\' for GPT-2 tokens '
           '(tokens: block_size 256 unless given)')
    a("--data-dir", help="the dataset's folder (default ./data for mnist/cifar10; refused for digits, oddeven and "
                         "synthetic, which read none)")
    a("--data-workers", type=int,
      help="loader processes per worker for streamed datasets (default: the host's cores shared out among "
           "the workers, one left for training, at most 16; 0 loads in the training process)")
    a("--val-fraction", type=float,
      help="share of the training set held out for validation (default 0.1): in-memory datasets, and an image "
           "folder without val/ (a seeded pick of train/, which Test.py then evaluates); refused where the data "
           "validates on its own split (tokens' val.bin, an image folder's val/, a factory's 'val')")
    a("--max-bad-samples", type=int, metavar="N",
      help="samples that fail to load or decode (a corrupt JPEG) are skipped, replaced by the next that loads "
           "and named in the log; past N of them (default 10) the run saves and stops with the list")


def _workers(a: Callable[..., Any]) -> None:
    a("--gpus", help="'all' or GPU indices like 0,1 (default: all GPUs if any, else CPU workers)")
    a("--cpu-workers", type=int, help="number of CPU workers when no GPU is used (default 2)")
    a("--workers-per-gpu", type=int,
      help="workers on each GPU (default 1; on other hosts too); they combine through CUDA IPC, one leader per "
           "GPU joins NCCL")
    a("--launcher", choices=LAUNCHERS,
      help="where the workers start: local (this machine, the default); ssh (on --hosts or --hostfile, through "
           "OpenSSH with your own config and keys; $HARNESS_SSH overrides the ssh command); slurm (on the "
           "nodes of the Slurm allocation this runs in, one srun step each)")
    a("--hosts", metavar="HOST:SLOTS,...", help="--launcher ssh: the hosts and how many workers each runs, e.g. node1:8,node2:8")
    a("--hostfile", help="--launcher ssh: a file of hosts, one per line (node1:8 or 'node1 slots=8')")
    a("--control-address",
      help="remote workers: the address of this machine they reach the parent on (default: the one on the "
           "route to the first host)")
    a("--encrypt", action="store_true",
      help="remote workers: encrypt the control plane with CurveZMQ (it is always signed), for a network "
           "others can listen on")
    a("--cluster", choices=CLUSTER_CHOICES,
      help="the engine that started this process (torchrun, Kubeflow, a Slurm job step, mpirun, SageMaker, "
           "SkyPilot): auto (default) detects it from its variables, none turns detection off. Started by one, "
           "Train.py runs once per node (--nproc-per-node 1): node 0's is the parent, every other node's its "
           "node agent, with a key every node shares (HARNESS_KEY_FILE or HARNESS_KEY; docs/hosts.md); when "
           "the engine restarts the job, it resumes from --save by itself")
    a("--mps", action="store_true",
      help="start a private NVIDIA MPS daemon for the run (pipe and log dirs in --log-dir), so workers "
           "sharing a GPU run their kernels concurrently; stopped at the end")


def _synchronisation(a: Callable[..., Any]) -> None:
    a("--mode", choices=("grad", "param", "async"),
      help="grad: average gradients every update (default); param: average parameters every --avg-every updates; "
           "async: push each worker's change to a parameter server in the parent every --avg-every updates on average, "
           "without waiting for the others; with S >= 1 a faster worker runs more of the run's updates (for hosts of "
           "unequal speed)")
    a("--max-staleness", type=int, metavar="S",
      help="async mode: a worker waits rather than leave another more than S server versions behind (default 1; "
           "0 is synchronous DiLoCo, bit for bit: K updates each); with S >= 1 each worker runs K x its measured "
           "speed / the mean speed updates between pushes, from the run's budget of workers x --max-steps updates")
    a("--avg-every", type=int, help="param and async modes: sync every K updates (async, S >= 1: on average) "
                                     "(default 1)")
    a("--avg-optimizer-state", action="store_true", help="param mode with plain averaging: also average "
      "momentum/Adam state (the outer optimizer keeps each worker's own)")
    a("--outer-optimizer", choices=("average", "nesterov"),
      help="param mode: what every --avg-every K updates do with the averaged pseudo-gradient (the parameters' change "
           "since the last sync): average (default; outer SGD at lr 1, the parameters' average) or nesterov (DiLoCo: "
           "outer Nesterov momentum, with --optimizer adamw inside)")
    a("--outer-lr", type=float, help="param mode: the outer learning rate (default 1 for average, 0.7 for nesterov)")
    a("--outer-momentum", type=float, help="param mode, nesterov: the outer momentum (default 0.9)")
    a("--fragments", type=int, metavar="F",
      help="param mode: sync the parameters in F fragments at staggered updates, 1/F of the model at a time "
           "(streaming DiLoCo; default 1)")
    a("--outer-delay", type=int, metavar="D",
      help="param mode: a fragment's exchange runs under the next D inner updates and is applied then, the new anchor "
           "mixed half and half with the replica's own (default 0: the inner steps wait for it); D < K/F. async: a "
           "worker trains on under its push until the answer is there, D updates at most, then mixes it in the same way; "
           "D < K")
    a("--outer-dtype", choices=("fp32", "bf16", "fp16", "int8"),
      help="param and async modes: pseudo-gradients sent as fp32 (default), bf16 or fp16 (half the bytes) or int8 "
           "with a scale per 1024 (a quarter), the rounding error carried into the next sync; async mode sends the "
           "anchor's changes back the same way")
    a("--grad-sync", choices=("bucketed", "flat"),
      help="grad mode: all-reduce buckets during backward (default), or the whole flat gradient after it")
    a("--bucket-mb", type=float, help="grad mode: gradient bucket size in MiB (default 25)")
    a("--zero", type=int, choices=(0, 1, 2),
      help="grad mode: 0 every worker holds the whole optimizer state (default); 1 each of N workers keeps the "
           "optimizer state of 1/N of the parameters (gradients reduce-scattered, parameters all-gathered: "
           "ZeRO-1); 2 also only 1/N of the gradients (ZeRO-2). Checkpoints are the same for every N and --zero")
    a("--reduce-dtype", choices=("fp32", "bf16"),
      help="grad mode: dtype gradients are averaged in (default fp32, i.e. the gradients' own)")


def _optimizer(a: Callable[..., Any]) -> None:
    a("--optimizer", choices=OPTIMIZERS, help="(default sgd)")
    a("--optimizer-impl", choices=IMPLS,
      help="fused: one kernel per update (sgd, adam, adamw, adagrad); foreach: one multi-tensor kernel per "
           "operation (default: fused where torch has it, else foreach; ccnesterov has its own)")
    a("--lr", type=float, help="learning rate (default 0.05)")
    a("--momentum", type=float, help="sgd momentum (default 0.9 for sgd)")
    a("--nesterov", action="store_true", help="sgd: Nesterov momentum")
    a("--weight-decay", type=float, help="(default 0)")
    a("--lr-schedule", choices=SCHEDULES,
      help="learning rate over the run: constant (default), or decaying to --min-lr after the warm-up: "
           "cosine (nanoGPT's), linear, step (a tenth after each third). Fused optimizers read the rate from "
           "the device, so the CUDA graph replays the schedule; other optimizers step eagerly with one")
    a("--warmup-steps", type=int, help="updates over which the learning rate rises linearly to --lr")
    a("--min-lr", type=float, help="where the schedule ends (default 0)")


def _step(a: Callable[..., Any]) -> None:
    a("--batch-size", type=int, help="per worker and micro-batch (default 32)")
    a("--grad-accum", type=int, metavar="K",
      help="micro-batches per update (default 1): each worker accumulates K micro-batches' gradients and they "
           "are averaged across workers once per update, so N workers x K x --batch-size b train exactly as "
           "one worker with batch N*K*b; with --cuda-graph the whole update is one graph")
    a("--amp", choices=("bf16", "fp16"),
      help="autocast: bf16 (the choice on GPUs that have it: A100, H100 and later), or fp16 for GPUs without "
           "bf16 (V100, T4), with dynamic loss scaling: an update whose gradients overflow is skipped and the "
           "scale halved (logged as loss_scale and skipped_updates); fp16 needs a fused optimizer")
    a("--tf32", action=argparse.BooleanOptionalAction,
      help="GPU: fp32 matmuls and convolutions on TF32 tensor cores (default on; --no-tf32 for full fp32, "
           "e.g. to compare runs to 1e-5)")
    a("--cuda-graph", action=argparse.BooleanOptionalAction,
      help="GPU: capture the whole step (forward, backward, all-reduce, optimizer) in a CUDA graph and replay "
           "it, one launch instead of hundreds (default: wherever the step can be captured; otherwise eager, "
           "with a message saying why). Its 3 warm-up updates on the first batch are undone, so it trains "
           "exactly as eager; --no-cuda-graph runs eagerly")
    a("--compile", action="store_true",
      help="torch.compile the model and the loss for the training step and, separately, for validation (the "
           "first update and the first validation wait for the compiler); on GPUs the compiled step is captured "
           "in the CUDA graph too")
    a("--clip-grad", type=float, metavar="NORM",
      help="clip the averaged gradients to this global norm before each update (the norm before clipping "
           "goes into the log as grad_norm)")


def _run_length(a: Callable[..., Any]) -> None:
    a("--epochs", type=int, help="(default 10)")
    a("--max-steps", type=int, help="train this many updates in all (overrides --epochs)")
    a("--validate-every", type=int, help="validate every N updates (default: at each epoch's end; async mode: every "
                                          "N x workers updates of all workers, by the one whose push passes them)")
    a("--target-error", type=float, help="stop once the validation error is at most this (e.g. 0.02)")
    a("--patience", type=int, help="stop after this many validations without improvement (0: never)")
    a("--seed", type=int, help="(default 0)")


def _checkpoints(a: Callable[..., Any]) -> None:
    a("--save", help=f"checkpoint path (default {DEFAULT_SAVE}); '' to not save")
    a("--save-every", type=int, help="save every N epochs (default 1) and at the end")
    a("--save-every-steps", type=int,
      help="also save every N updates, mid-epoch too (default 0: off); --resume continues exactly from there")
    a("--resume", help="checkpoint to continue from, exactly where it stopped, mid-epoch too (param mode: exact "
                       "when it stopped at a multiple of --avg-every)")


def _logging(a: Callable[..., Any]) -> None:
    a("--log-dir", help="metrics.jsonl and metrics.png go here (default runs/)")
    a("--plot", action=argparse.BooleanOptionalAction,
      help="draw the log as metrics.png at the end (default on; --no-plot saves the second of CPU matplotlib "
           "takes, for sweeps and scripted runs: the log has every record the plot draws)")
    a("--tensorboard", action="store_true",
      help="also write the log's records as TensorBoard scalars (event files in --log-dir; needs the "
           "tensorboard package: pip install -e '.[tensorboard]')")
    a("--profile", metavar="DIR",
      help="record a few updates of rank 0 with torch.profiler into DIR: trace.json (chrome://tracing, "
           "Perfetto), profile.json (per update: wall time, kernel time by category, idle time, the heaviest "
           "kernels) and profile.txt (the heaviest operators)")
    a("--profile-from", type=int, metavar="N",
      help="--profile: leave out the first N updates (default 20: compilation, graph capture, warm-up)")
    a("--profile-updates", type=int, metavar="N", help="--profile: record N updates (default 5)")


def _failures(a: Callable[..., Any]) -> None:
    a("--heartbeat-timeout", type=float, help="seconds of silence before a worker counts as hung (default 30)")
    a("--max-restarts", type=int,
      help="survive up to N worker deaths or hangs (default 0: the run stops with the error): each is healed "
           "in place (see --heal) or else every worker restarts from the last checkpoint; an exception in "
           "the training code is not retried")
    a("--heal", choices=("on", "off"),
      help="with --max-restarts: on (the default) replaces a dead worker while the others wait, and the survivors "
           "hand it their state, so only the interrupted update is redone; off restarts every worker from the "
           "last checkpoint (also what GPU workers do in param mode, with --workers-per-gpu above 1, with --zero or "
           "with a non-fused optimizer; --heal on with them is an error). --zero heals in place only with --heal on, "
           "which keeps a replica of each worker's shard on the next worker (a second 1/N of optimizer state and "
           "gradients, and 1/N of the gradients sent on each update). --mode async heals in place on CPUs and GPUs: "
           "the others train on, and the replacement rejoins the server from the dead worker's last applied push")


GROUPS = (("model and data", _model_and_data), ("workers and placement", _workers),
          ("synchronisation", _synchronisation), ("optimizer and schedule", _optimizer), ("the step", _step),
          ("run length and validation", _run_length), ("checkpoints and resume", _checkpoints),
          ("logging", _logging), ("failures and healing", _failures))


def make_parser(description: str, defaults: bool = True) -> argparse.ArgumentParser:
    """Train.py's parser; ``defaults=False``: flags not given are left out of the result (what a
    ``--resume`` run changes of its checkpoint's configuration)."""
    parser = OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False, argument_default=None if defaults else argparse.SUPPRESS)
    if defaults:
        parser.set_defaults(**{f.name: getattr(DEFAULTS, f.name) for f in dataclasses.fields(TrainConfig)})
    for title, add in GROUPS:
        add(parser.add_argument_group(title).add_argument)
    return parser


def parse(argv: list[str] | None, description: str) -> TrainConfig:
    """The command line as a TrainConfig. With ``--resume PATH`` the checkpointed run's configuration
    gives the defaults, and only the flags on the command line change it (nanoGPT's init_from='resume'
    for the whole run)."""
    args = make_parser(description).parse_args(argv)
    given = _values(vars(make_parser(description, defaults=False).parse_args(argv)))
    if given.get("max_steps") and "epochs" in given:
        print(f"Train.py: note: --max-steps {given['max_steps']} overrides --epochs {given['epochs']}: the run ends "
              f"after {given['max_steps']} updates", file=sys.stderr)
    if args.resume is None:
        return TrainConfig(**_values(vars(args)))
    return TrainConfig.resuming(**given)


def _values(flags: dict[str, Any]) -> dict[str, Any]:
    """Parsed flags as TrainConfig's values: JSON options as dicts, ``--save ''`` as no checkpoint."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {name: value for name, value in flags.items() if name in known}
    for name in ("model_options", "dataset_options"):
        if isinstance(values.get(name), str):
            values[name] = json_option(name, values[name])
    if "save" in values:
        values["save"] = values["save"] or None
    return values


def json_option(name: str, text: str) -> dict:
    flag = "--" + name.replace("_", "-")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def check_choices(config: TrainConfig) -> None:
    """A ConfigError naming the first field whose value is not one of its flag's choices. Train.py's argparse
    refuses those on the command line; a TrainConfig built in Python comes here, where a value off the list would
    otherwise fall through to another's behaviour (``mode="Grad"`` trained each worker alone, unaveraged)."""
    for action in make_parser("")._actions:
        value = getattr(config, action.dest, None)
        if action.choices is None or value is None or value in action.choices:
            continue
        offered = [str(choice) for choice in action.choices]
        raise ConfigError(f"TrainConfig {action.dest}={value!r} is not one of {action.option_strings[0]}'s choices: "
                          + ", ".join(offered) + did_you_mean(str(value).lower(), offered))
