"""Train one model on every worker: python Train.py --help

Defaults: an MLP on scikit-learn's bundled handwritten digits, on every GPU if there are GPUs,
otherwise on 2 CPU workers; the checkpoint goes to checkpoints/model.pt and the log (JSON lines
and a plot) to runs/. Every bad input is a one-line error before any worker trains.
Ctrl-C or SIGTERM: the workers stop within 8 updates and save a checkpoint that --resume continues
exactly; exit status 130 or 143. A second Ctrl-C stops at once.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

from harness import ChildError, ChildFailed, Children, Parent
from harness.control import timeline
from harness.resilience.interrupt import Interrupted, Interrupts
from harness.resilience.recovery import GaveUp, Recovery
from harness.training.metrics import MetricsLog, import_plotting_meanwhile, plot_metrics, read_metrics
from harness.training.optim import IMPLS, OPTIMIZERS, check_options
from harness.training.schedule import SCHEDULES, is_constant
from harness.launch.launchers import LAUNCHERS, make_launcher
from harness.launch.placement import host_gpus, resolve_gpus, visible_gpus

DEFAULT_SAVE = "checkpoints/model.pt"


class ConfigError(ValueError):
    """Bad command-line input; reported as one line, before any worker starts."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", default="mlp", help="registry name (cnn, gpt, mlp, oddeven, resnet18, resnet50) or package.module:factory")
    a("--model-options", default="{}", help='JSON options for the model factory, e.g. \'{"hidden": [256]}\'')
    a("--dataset", default="digits",
      help="in memory: cifar10, digits, mnist, oddeven, synthetic; streamed from --data-dir: imagefolder "
           "(DIR/train/<class>/*.jpg and DIR/val/), tokens (DIR/train.bin and val.bin); or "
           "package.module:factory returning a torch Dataset (called as factory(split, data_dir, **options))")
    a("--dataset-options", default="{}",
      help='JSON options for the dataset, e.g. \'{"size": 8192}\' for synthetic, \'{"crop": 224, "resize": 256}\' '
           'for imagefolder, \'{"block_size": 1024, "dtype": "uint16", "vocab_size": 50257}\' for tokens')
    a("--data-dir", default=None, help="the dataset's folder (default ./data for mnist/cifar10)")
    a("--data-workers", type=int, default=None,
      help="loader processes per worker for streamed datasets (default: the host's cores shared out among "
           "the workers, one left for training, at most 16; 0 loads in the training process)")
    a("--gpus", default=None, help="'all' or GPU indices like 0,1 (default: all GPUs if any, else CPU workers)")
    a("--cpu-workers", type=int, default=2, help="number of CPU workers when no GPU is used (default 2)")
    a("--workers-per-gpu", type=int, default=1,
      help="workers on each GPU (default 1; on other hosts too); they combine through CUDA IPC, one leader per "
           "GPU joins NCCL")
    a("--launcher", choices=LAUNCHERS, default="local",
      help="where the workers start: local (this machine, the default); ssh (on --hosts or --hostfile, through "
           "OpenSSH with your own config and keys; $HARNESS_SSH overrides the ssh command); slurm (on the "
           "nodes of the Slurm allocation this runs in, one srun step each)")
    a("--hosts", default=None, metavar="HOST:SLOTS,...",
      help="--launcher ssh: the hosts and how many workers each runs, e.g. node1:8,node2:8")
    a("--hostfile", default=None, help="--launcher ssh: a file of hosts, one per line (node1:8 or 'node1 slots=8')")
    a("--control-address", default=None,
      help="remote workers: the address of this machine they reach the parent on (default: the one on the "
           "route to the first host)")
    a("--encrypt", action="store_true",
      help="remote workers: encrypt the control plane with CurveZMQ (it is always signed), for a network "
           "others can listen on")
    a("--mps", action="store_true",
      help="start a private NVIDIA MPS daemon for the run (pipe and log dirs in --log-dir), so workers "
           "sharing a GPU run their kernels concurrently; stopped at the end")
    a("--mode", choices=("grad", "param"), default="grad",
      help="grad: average gradients every update; param: average parameters every --avg-every updates")
    a("--avg-every", type=int, default=1, help="param mode: average parameters every K updates (default 1)")
    a("--avg-optimizer-state", action="store_true", help="param mode: also average momentum/Adam state")
    a("--grad-sync", choices=("bucketed", "flat"), default="bucketed",
      help="grad mode: all-reduce buckets during backward (default), or the whole flat gradient after it")
    a("--bucket-mb", type=float, default=25.0, help="grad mode: gradient bucket size in MiB (default 25)")
    a("--reduce-dtype", choices=("fp32", "bf16"), default="fp32",
      help="grad mode: dtype gradients are averaged in (default fp32, i.e. the gradients' own)")
    a("--optimizer", choices=OPTIMIZERS, default="sgd")
    a("--optimizer-impl", choices=IMPLS, default=None,
      help="fused: one kernel per update (sgd, adam, adamw, adagrad); foreach: one multi-tensor kernel per "
           "operation (default: fused where torch has it, else foreach; ccnesterov has its own)")
    a("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    a("--momentum", type=float, default=None, help="sgd momentum (default 0.9 for sgd)")
    a("--nesterov", action="store_true", help="sgd: Nesterov momentum")
    a("--weight-decay", type=float, default=0.0)
    a("--batch-size", type=int, default=32, help="per worker and micro-batch (default 32)")
    a("--grad-accum", type=int, default=1, metavar="K",
      help="micro-batches per update (default 1): each worker accumulates K micro-batches' gradients and they "
           "are averaged across workers once per update, so N workers x K x --batch-size b train exactly as "
           "one worker with batch N*K*b; with --cuda-graph the whole update is one graph")
    a("--epochs", type=int, default=10)
    a("--max-steps", type=int, default=None, help="train this many updates in all (overrides --epochs)")
    a("--val-fraction", type=float, default=0.1, help="share of the training set held out for validation")
    a("--validate-every", type=int, default=0, help="validate every N updates (default: at each epoch's end)")
    a("--target-error", type=float, default=None, help="stop once the validation error is at most this (e.g. 0.02)")
    a("--patience", type=int, default=0, help="stop after this many validations without improvement (0: never)")
    a("--save", default=DEFAULT_SAVE, help=f"checkpoint path (default {DEFAULT_SAVE}); '' to not save")
    a("--save-every", type=int, default=1, help="save every N epochs (default 1) and at the end")
    a("--save-every-steps", type=int, default=0,
      help="also save every N updates, mid-epoch too (default 0: off); --resume continues exactly from there")
    a("--resume", default=None,
      help="checkpoint to continue from, exactly where it stopped, mid-epoch too (param mode: exact when it "
           "stopped at a multiple of --avg-every)")
    a("--seed", type=int, default=0)
    a("--amp", choices=("bf16",), default=None, help="bf16 autocast")
    a("--tf32", action=argparse.BooleanOptionalAction, default=True,
      help="GPU: fp32 matmuls and convolutions on TF32 tensor cores (default on; --no-tf32 for full fp32, "
           "e.g. to compare runs to 1e-5)")
    a("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
      help="GPU: capture the whole step (forward, backward, all-reduce, optimizer) in a CUDA graph and replay "
           "it, one launch instead of hundreds (default: wherever the step can be captured; otherwise eager, "
           "with a message saying why). Its 3 warm-up updates on the first batch are undone, so it trains "
           "exactly as eager; --no-cuda-graph runs eagerly")
    a("--lr-schedule", choices=SCHEDULES, default="constant",
      help="learning rate over the run: constant (default), or decaying to --min-lr after the warm-up: "
           "cosine (nanoGPT's), linear, step (a tenth after each third). Not with --cuda-graph (it would "
           "freeze the rate): a schedule or warm-up runs eagerly")
    a("--warmup-steps", type=int, default=0, help="updates over which the learning rate rises linearly to --lr")
    a("--min-lr", type=float, default=0.0, help="where the schedule ends (default 0)")
    a("--compile", action="store_true",
      help="torch.compile the model for the training step (the first updates wait for the compiler; "
           "evaluation runs eagerly). Not with --cuda-graph: a compiled model trains without one")
    a("--clip-grad", type=float, default=None, metavar="NORM",
      help="clip the averaged gradients to this global norm before each update (the norm before clipping "
           "goes into the log as grad_norm)")
    a("--tensorboard", action="store_true",
      help="also write the log's records as TensorBoard scalars (event files in --log-dir; needs the "
           "tensorboard package: pip install -e '.[tensorboard]')")
    a("--log-dir", default="runs", help="metrics.jsonl and metrics.png go here (default runs/)")
    a("--heartbeat-timeout", type=float, default=30.0, help="seconds of silence before a worker counts as hung")
    a("--max-restarts", type=int, default=0,
      help="survive up to N worker deaths or hangs (default 0: the run stops with the error): each is healed "
           "in place (see --heal) or else every worker restarts from the last checkpoint; an exception in "
           "the training code is not retried")
    a("--heal", choices=("on", "off"), default=None,
      help="with --max-restarts: on (the default) replaces a dead worker while the others wait, and the survivors "
           "hand it their state, so only the interrupted update is redone; off restarts every worker from the "
           "last checkpoint (also what GPU workers do in param mode, with --workers-per-gpu above 1 or with a "
           "non-fused optimizer; --heal on with them is an error)")
    return p.parse_args(argv)


def make_config(args: argparse.Namespace) -> tuple[dict, list[int]]:
    """Check every input that can be checked before training; returns (config, gpus)."""
    config, gpus = read_flags(args)
    check_inputs(config)
    return config, gpus


def launch_plan(args: argparse.Namespace) -> tuple[list[int], int]:
    """The flags that say where the workers run, checked without importing torch (so that Train.py
    can start its workers first); returns (GPUs, number of workers)."""
    for name in ("cpu_workers", "workers_per_gpu"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.heartbeat_timeout <= 0:
        raise ConfigError(f"--heartbeat-timeout must be a positive number of seconds, got {args.heartbeat_timeout}")
    if args.launcher != "local":
        gpus, count = remote_plan(args)
    else:
        if args.control_address or args.encrypt:
            raise ConfigError("--control-address and --encrypt are for workers on other hosts (--launcher ssh or "
                              "slurm); a local run talks over a private Unix socket")
        try:
            make_launcher(args.launcher, args.hosts, args.hostfile)
            gpus = resolve_gpus(args.gpus if args.gpus is not None else ("all" if visible_gpus() else None))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        count = len(gpus) * args.workers_per_gpu or args.cpu_workers
    if not gpus and (args.workers_per_gpu > 1 or args.mps):
        flag = "--mps" if args.mps else f"--workers-per-gpu {args.workers_per_gpu}"
        raise ConfigError(f"{flag} needs GPU workers, but none are used; pass --gpus, or use --cpu-workers N on CPU")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts must not be negative, got {args.max_restarts}")
    if args.heal == "on" and not args.max_restarts:
        raise ConfigError("--heal on needs --max-restarts N (how many failures the run may survive), e.g. 3")
    return gpus, count


def remote_plan(args: argparse.Namespace) -> tuple[list[int], int]:
    """--launcher ssh or slurm: (each host's GPUs, number of workers: the hosts' slots). This machine
    cannot see the hosts' GPUs: ``--gpus all`` (the default where this machine has GPUs) gives each of a
    host's workers its own GPU, 0, 1, ..., or with ``--workers-per-gpu K`` each K workers one; ``--gpus
    0,1`` shares a host's workers out over those. Workers that share a GPU combine through CUDA IPC on
    their host, as on one machine; ``args.workers_per_gpu`` becomes the most that share one."""
    if args.mps:
        raise ConfigError(f"--mps works on one machine only so far (it starts a private MPS daemon there); drop it "
                          f"with --launcher {args.launcher} (--workers-per-gpu works without it)")
    try:
        launcher = make_launcher(args.launcher, args.hosts, args.hostfile)
        most = max(h.slots for h in launcher.hosts)
        gpus = host_gpus(args.gpus if args.gpus is not None else ("all" if visible_gpus() else None),
                         -(-most // args.workers_per_gpu))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if gpus:
        sharing = -(-most // len(gpus))
        if sharing > args.workers_per_gpu > 1:
            raise ConfigError(f"--workers-per-gpu {args.workers_per_gpu} on GPUs {','.join(map(str, gpus))}: a host "
                              f"with {most} slots would put {sharing} workers on a GPU; list more GPUs, give the "
                              f"hosts fewer slots or raise --workers-per-gpu")
        args.workers_per_gpu = max(args.workers_per_gpu, sharing)
    return gpus, launcher.slots


def placement_flags(args: argparse.Namespace) -> dict:
    """Where the workers start, as the config keeps it (and a restart starts them again)."""
    return {"launcher": args.launcher, "hosts": args.hosts, "hostfile": args.hostfile,
            "control_address": args.control_address, "encrypt": args.encrypt}


def gpu_heal_limit(args: argparse.Namespace) -> str | None:
    """What keeps GPU workers from healing in place, if anything. A GPU worker's update applies only
    if its collectives completed (harness/resilience/heal.py), which a fused optimizer can be told; param mode's
    averaging and workers sharing a GPU have no such guard yet."""
    from harness.training.optim import default_impl
    if args.workers_per_gpu > 1:
        return f"--workers-per-gpu {args.workers_per_gpu}"
    if args.mode == "param":
        return "--mode param"
    if (args.optimizer_impl or default_impl(args.optimizer)) != "fused":
        return f"--optimizer {args.optimizer}" + (f" --optimizer-impl {args.optimizer_impl}" if args.optimizer_impl else "")
    return None


def heals_in_place(args: argparse.Namespace, gpus: list[int]) -> bool:
    """Whether a dead worker is replaced and healed from the survivors (else the group restarts from the
    last checkpoint). GPU workers whose updates cannot be guarded (``gpu_heal_limit``) restart."""
    if not args.max_restarts or args.heal == "off":
        return False
    limit = gpu_heal_limit(args) if gpus else None
    if limit and args.heal == "on":
        raise ConfigError(f"--heal on: GPU workers heal in place in grad mode, with a fused optimizer, one worker "
                          f"per GPU, not with {limit}; drop --heal on to restart from the last checkpoint instead "
                          f"(save often with --save-every-steps)")
    return limit is None


def read_flags(args: argparse.Namespace) -> tuple[dict, list[int]]:
    """The flags' own checks (fast: no data is read); returns (config, gpus)."""
    from harness.checkout.datasets import dataset_names, is_known
    from harness.checkout.models import MODELS
    from harness.data.pipeline import default_data_workers

    def json_option(name: str, text: str) -> dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--{name} is not valid JSON ({e.msg}): {text!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"--{name} must be a JSON object like '{{\"key\": 1}}', got {text!r}")
        return value

    if not is_known(args.dataset):
        raise ConfigError(f"unknown dataset '{args.dataset}'; valid names: {', '.join(dataset_names())}, "
                          "or package.module:factory")
    if args.model not in MODELS and ":" not in args.model:
        raise ConfigError(f"unknown model '{args.model}'; valid names: {', '.join(sorted(MODELS))}, "
                          "or package.module:factory")
    gpus, workers = launch_plan(args)
    for name in ("batch_size", "grad_accum", "epochs", "avg_every"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ConfigError(f"--max-steps must be at least 1, got {args.max_steps}")
    for name in ("seed", "patience", "validate_every", "save_every", "save_every_steps", "weight_decay"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if args.bucket_mb <= 0:
        raise ConfigError(f"--bucket-mb must be positive, got {args.bucket_mb}")
    if args.lr <= 0:
        raise ConfigError(f"--lr must be positive, got {args.lr}")
    if args.warmup_steps < 0 or not 0 <= args.min_lr <= args.lr:
        raise ConfigError(f"--warmup-steps {args.warmup_steps} must not be negative and --min-lr {args.min_lr} must be "
                          f"between 0 and --lr {args.lr}")
    if args.clip_grad is not None and args.clip_grad <= 0:
        raise ConfigError(f"--clip-grad must be a positive norm, got {args.clip_grad}")
    if args.cuda_graph and not is_constant(args.lr_schedule, args.warmup_steps):
        raise ConfigError("--cuda-graph would freeze the learning rate that --lr-schedule/--warmup-steps change "
                          "every update; drop one of them")
    if args.compile and args.cuda_graph:
        raise ConfigError("--compile and --cuda-graph do not combine: a replayed graph would skip the compiled "
                          "model's guards and recompiles; drop --cuda-graph (a compiled model trains without one)")
    if args.compile and not gpus and not shutil.which("g++"):
        raise ConfigError("--compile on CPU workers needs a C++ compiler for torch's CPU code: install g++ "
                          "(e.g. apt-get install g++) or drop --compile")
    if args.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'")
    if not 0 <= args.val_fraction < 1:
        raise ConfigError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.data_workers is not None and args.data_workers < 0:
        raise ConfigError(f"--data-workers must not be negative, got {args.data_workers}")
    momentum = args.momentum if args.momentum is not None else (0.9 if args.optimizer == "sgd" else 0.0)
    try:
        check_options(args.optimizer, args.lr, momentum, args.weight_decay, args.nesterov, args.optimizer_impl)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config = {
        "model": args.model, "model_options": json_option("model-options", args.model_options),
        "dataset": args.dataset, "dataset_options": json_option("dataset-options", args.dataset_options),
        "data_dir": args.data_dir, "mode": args.mode, "avg_every": args.avg_every,
        "avg_optimizer_state": args.avg_optimizer_state, "grad_sync": args.grad_sync,
        "bucket_mb": args.bucket_mb, "reduce_dtype": args.reduce_dtype, "optimizer": args.optimizer,
        "optimizer_impl": args.optimizer_impl, "lr": args.lr,
        "momentum": momentum, "nesterov": args.nesterov, "weight_decay": args.weight_decay,
        "batch_size": args.batch_size, "grad_accum": args.grad_accum, "epochs": args.epochs, "max_steps": args.max_steps,
        "val_fraction": args.val_fraction,
        "validate_every": args.validate_every, "target_error": args.target_error, "patience": args.patience,
        "save": args.save or None, "save_every": args.save_every, "save_every_steps": args.save_every_steps,
        "resume": args.resume, "seed": args.seed, "max_restarts": args.max_restarts,
        "heal": heals_in_place(args, gpus),
        "amp": args.amp, "tf32": args.tf32, "cuda_graph": False if args.compile else args.cuda_graph,
        "compile": args.compile, "log_dir": args.log_dir,
        "lr_schedule": args.lr_schedule, "warmup_steps": args.warmup_steps, "min_lr": args.min_lr,
        "clip_grad": args.clip_grad, "tensorboard": args.tensorboard,
        "workers": workers, "mps": args.mps, **placement_flags(args),
        "data_workers": args.data_workers if args.data_workers is not None else default_data_workers(workers),
    }
    return config, gpus


def check_inputs(config: dict) -> None:
    """The checks that read files (data, a checkpoint to resume) or build the model (on the meta
    device); sets ``config["samples"]``. Train.py runs them while its workers start."""
    from harness.resilience.checkpoint import CheckpointError, check_writable, load_checkpoint
    config["samples"] = _check_data_and_model(config)
    if config["save"]:
        try:
            check_writable(config["save"])
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
    if config["resume"]:
        try:
            saved = load_checkpoint(config["resume"])
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
        shape = ("model", "model_options", "dataset", "dataset_options", "optimizer")
        if saved.get("position"):       # mid-epoch: the rest of the epoch's order depends on these too
            shape += ("seed", "batch_size", "grad_accum", "workers", "samples")
        before = {"grad_accum": 1, **saved["config"]}       # checkpoints from before --grad-accum
        differ = [k for k in shape if before.get(k) != config[k]]
        if differ:
            raise ConfigError(f"--resume {config['resume']} was trained with "
                              + ", ".join(f"a training set of {before.get(k)} samples" if k == "samples"
                                          else f"--{k.replace('_', '-')} {before.get(k)!r}" for k in differ)
                              + "; pass the same values to continue it"
                              + (" (it stopped mid-epoch)" if saved.get("position") else ""))


def _check_data_and_model(config: dict) -> int:
    """Check the data's cheap facts (a streamed dataset is scanned and one sample of each split
    decoded; nothing is loaded whole) and build the model on the meta device: a missing file, a bad
    option or a batch larger than a worker's shard fails here, not in every worker. Returns the
    number of training samples."""
    import torch
    from harness.checkout.datasets import check_data
    from harness.training.loop import make_model
    try:
        info, samples = check_data(config["dataset"], config["data_dir"], seed=config["seed"],
                                   val_fraction=config["val_fraction"], **config["dataset_options"])
        with torch.device("meta"):          # checks the model's options without allocating its weights
            make_model(config, info, torch.device("meta"))
    except (OSError, ValueError, TypeError, ImportError) as e:      # OSError: a file we may not read
        raise ConfigError(str(e).splitlines()[0]) from None
    shard = samples // config["workers"]
    if config["batch_size"] * config["grad_accum"] > shard:
        accum = f" x --grad-accum {config['grad_accum']}" if config["grad_accum"] > 1 else ""
        raise ConfigError(f"--batch-size {config['batch_size']}{accum} is larger than a worker's shard ({shard} "
                          f"samples of {samples} over {config['workers']} workers); use at most {shard} in all")
    return samples


class Progress:
    """The parent's view of a run: a tqdm bar, Train.lua-style epoch lines, and the metrics log."""

    def __init__(self, config: dict, steps_per_epoch: int, log: MetricsLog):
        self.config, self.log = config, log
        self.total = config["max_steps"] or steps_per_epoch * config["epochs"]
        self.epochs = -(-self.total // steps_per_epoch)
        self.bar = None      # made at the first report, so the workers' start-up does not count as a slow update
        self.saved: str | None = None      # the last checkpoint this run wrote

    def handle(self, record: dict) -> None:
        from tqdm import tqdm
        event = record["event"]
        self.log.write({"time": time.time(), **record})
        if "step" in record:
            if self.bar is None:
                self.bar = tqdm(total=self.total, initial=record["step"], unit="update", dynamic_ncols=True)
            self.bar.update(record["step"] - self.bar.n)
        if event == "step":
            self.bar.set_description(f"epoch {record['epoch'] + 1}/{self.epochs}")
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:.0f}")
        elif event == "epoch":
            self.bar.set_description(f"epoch {record['epoch']}/{self.epochs}")
            val = record["val_error"]
            tqdm.write(f"Epoch {record['epoch']}/{self.epochs}: average loss per sample "
                       f"{record['train_loss']:.4f}"
                       + (f", validation error {val:.2%}" if val is not None else "")
                       + f" ({record['seconds']:.1f} s)")
        elif event == "saved":
            self.saved = record["path"]
        elif event == "recovered":
            tqdm.write(f"rank {record['rank']} ({record['cause']}) recovered in {record['seconds']:.1f} s, redoing "
                       f"step {record['redo_step']}" + (" (parameters: the survivors' average)"
                                                          if record["mode"] == "param" else ""))
        elif event == "restart":
            unhealed = f"; not healed in place: {record['not_healed']}" if "not_healed" in record else ""
            tqdm.write(f"rank {record['rank']} ({record['cause']}{unhealed}): restarting every worker from "
                       f"{record['resume'] or 'the start'} (restart {record['restart']} of {record['max_restarts']})")
        elif event == "done" and record["stop"] and not record.get("signal"):    # main() says where it stopped
            tqdm.write(f"Stopped early after epoch {record['epoch']}: {record['stop']}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def mps_for(mps: bool, log_dir: str) -> Iterator[dict[str, str]]:
    """With --mps, a private MPS daemon for the run; yields the environment that points workers at it."""
    from harness.launch.mps import active_mps_env, start_mps
    if not mps:
        found = active_mps_env()
        if found:
            print(f"using the MPS daemon your environment points at ({found['CUDA_MPS_PIPE_DIRECTORY']})")
        yield {}
        return
    try:
        daemon = start_mps(Path(log_dir) / "mps")
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"--mps: {e}") from None
    with daemon:
        print(f"started a private MPS daemon (log: {daemon.log_dir})")
        yield daemon.env


# torch._dynamo: what the first optimizer a process builds imports (about 1.8 s of a CPU worker's start).
WORKER_IMPORTS = ("harness.training.loop", "harness.checkout.datasets", "harness.checkout.models", "torch._dynamo")


@contextlib.contextmanager
def workers(count: int, gpus: list[int], mps: bool, log_dir: str, heartbeat_timeout: float,
            heal: bool, place: dict) -> Iterator[Children]:
    """A group of training workers, stopped on exit. They import what training needs as soon as they
    start, so a group started before the parent's own imports and checks does that work alongside
    them. With --mps the private daemon starts first and outlives the workers: MPS only quits once
    its clients are gone. ``heal``: a dead worker does not stop the group (harness/resilience/recovery.py).
    ``place``: placement_flags(), where they start (harness/launch/launchers.py)."""
    with mps_for(mps, log_dir) as daemon_env, Parent(heartbeat_timeout=heartbeat_timeout) as parent:
        try:
            group = parent.fork(count, gpus=gpus or None, env=daemon_env, preload=WORKER_IMPORTS, heal=heal,
                                launcher=place["launcher"], hosts=place["hosts"], hostfile=place["hostfile"],
                                address=place["control_address"], encrypt=place["encrypt"])
        except ValueError as e:         # e.g. no address to listen on for the hosts
            raise ConfigError(str(e)) from None
        yield group


def train(config: dict, gpus: list[int], heartbeat_timeout: float = 30.0, marks: dict | None = None,
          interrupts: Interrupts | None = None, started: Children | None = None) -> list[dict]:
    """Run harness.training.loop.train_worker on every worker and show progress; returns their summaries.
    ``started``: workers already started (Train.py starts them before its checks), else a group is
    forked here. A worker that dies or hangs is healed in place or restarts the group from the last
    checkpoint, --max-restarts times in all (harness/resilience/recovery.py).
    ``marks``: the parent's start-up timeline so far; with the workers' it goes to the log at the end.
    ``interrupts``: the handlers of SIGINT and SIGTERM, told about the workers once they exist."""
    marks = marks if marks is not None else timeline.start("checked")
    steps_per_epoch = config["samples"] // config["workers"] // (config["batch_size"] * config["grad_accum"])
    log = MetricsLog(config["log_dir"], tensorboard=config["tensorboard"])
    progress = Progress(config, steps_per_epoch, log)
    recovery = Recovery(config, lambda: progress.saved, progress.handle)

    def attempt(attempt_config: dict) -> list[dict]:
        nonlocal started
        if started is not None:             # only the first attempt: a failed group is stopped for good
            kids, started = started, None
            return run_group(attempt_config, kids, marks, interrupts, progress, recovery)
        with workers(attempt_config["workers"], gpus, attempt_config["mps"], attempt_config["log_dir"],
                     heartbeat_timeout, attempt_config["heal"], attempt_config) as kids:
            marks.setdefault("forked", time.time())
            return run_group(attempt_config, kids, marks, interrupts, progress, recovery)

    try:
        results = recovery.run(attempt)
        log.write({"time": time.time(), "event": "startup", "parent": marks,
                   "workers": [r["marks"] for r in results]})
    finally:
        progress.close()
        log.close()
    plot = plot_metrics(read_metrics(log.path), Path(config["log_dir"]) / "metrics.png")
    print(f"log: {log.path}" + (f", plot: {plot}" if plot else "")
          + (f", checkpoint: {config['save']}" if config["save"] else ""))
    return results


def run_group(config: dict, kids: Children, marks: dict, interrupts: Interrupts | None,
              progress: Progress, recovery: Recovery) -> list[dict]:
    """One group of workers from start (or ``config["resume"]``) to the end of the run, healed in
    place when a worker dies, if it may be; otherwise the failure ends the group (stopped)."""
    from harness.training.loop import train_worker
    if interrupts is not None:
        interrupts.watch(kids)
    try:
        kids.exec(train_worker, config)
        progress.handle({"event": "workers", "pids": kids.pids, "hosts": kids.hosts})
        while True:
            try:
                record = kids[0].receive()
            except ChildFailed as failure:
                recovery.heal(kids, failure)
                continue
            if record["event"] == "healed":
                record = {**recovery.healed(record), "pids": kids.pids}
            progress.handle(record)
            if record["event"] == "first_step":
                timeline.mark(marks, "first_step")
            if record["event"] == "done":
                break
        return kids.wait()
    except ChildFailed:
        kids.stop(grace=1.0)        # a group forked to heal is not stopped by its failure
        raise


def main(argv: list[str] | None = None) -> int:
    marks = timeline.start("imported")
    args = parse_args(argv)
    with Interrupts() as caught:
        try:
            return run(args, marks, caught)
        except Interrupted as e:
            print(f"Train.py: {e}; nothing saved since the last checkpoint", file=sys.stderr)
            return 128 + e.signum


def run(args: argparse.Namespace, marks: dict, interrupts: Interrupts) -> int:
    """Check, train, and say how it ended; returns the exit status (128 + the signal's number when
    SIGINT or SIGTERM stopped the run at an update, with a checkpoint that --resume continues).
    The workers start as soon as it is known where they run; the parent imports torch and checks the
    other flags and the files meanwhile."""
    try:
        gpus, count = launch_plan(args)
        heal = heals_in_place(args, gpus)
        with workers(count, gpus, args.mps, args.log_dir, args.heartbeat_timeout, heal, placement_flags(args)) as kids:
            timeline.mark(marks, "forked")
            config, _ = read_flags(args)
            check_inputs(config)
            where = f"{config['workers']} CPU workers"
            shared = f", {args.workers_per_gpu} per GPU" if gpus and args.workers_per_gpu > 1 else ""
            if args.launcher != "local":
                where = f"{len(kids.hosts)} hosts ({args.launcher}), " + ("GPUs " + ",".join(map(str, gpus))
                                                                          if gpus else "CPU") + " on each" + shared
            elif gpus:
                where = f"{len(gpus)} GPU(s)" + shared
            print(f"training {config['model']} on {config['dataset']} with {config['workers']} workers on {where}, "
                  f"mode {config['mode']}")
            timeline.mark(marks, "checked")
            import_plotting_meanwhile()
            results = train(config, gpus, args.heartbeat_timeout, marks, interrupts, started=kids)
    except ConfigError as e:                    # a bad input, or the MPS daemon did not start
        print(f"Train.py: error: {e}", file=sys.stderr)
        return 2
    except (ChildError, ChildFailed, GaveUp) as e:
        print(f"Train.py: training failed: {e}", file=sys.stderr)
        return 1
    signum = results[0]["interrupted"]
    if signum:
        saved = (f"saved {config['save']}; continue with --resume {config['save']}" if config["save"]
                 else "not saved (--save is empty)")
        print(f"Train.py: {signal.Signals(signum).name}: stopped at epoch {results[0]['epoch']}, "
              f"update {results[0]['step']}; {saved}", file=sys.stderr)
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
