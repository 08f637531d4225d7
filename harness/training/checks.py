"""Every check of a TrainConfig, in one place, before any worker trains: a table of per-field rules,
one function for the rules across fields, then what reads files or builds the model.

The checks run in three stages, because Train.py starts its workers as soon as it knows where they
run, and its parent imports no torch:

- ``plan_workers(config)``: where the workers run and how many (no torch, no files);
- ``check_flags(config)``: every field's own range and the rules across fields (no files);
- ``check_inputs(config)``: the data's cheap facts, the model on the meta device, the checkpoint to
  resume; fills in ``samples``. Train.py's parent imports no torch for it: its rank 0 worker runs this
  stage (``check_inputs_in``), on the host that reads the data and writes the checkpoint.

``resolve(config)`` runs the first two and returns the config with the decided fields filled in.
Each failure is a ``ConfigError`` whose text is the one line Train.py prints.
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from harness.launch.cluster import ClusterStart, check_start, detect, unbind_from_mpi
from harness.launch.launchers import Launcher, make_launcher
from harness.launch.placement import host_gpus, resolve_gpus, visible_gpus
from harness.resilience.lock import InUse, NotWritable, check_writable, refuse_if_held
from harness.training.config import FIXED_MID_EPOCH, FIXED_ON_RESUME, ConfigError, TrainConfig, one_line_errors
from harness.training.flags import check_choices
from harness.training.optim import check_options, default_impl
from harness.training.schedule import is_constant

# what carves a validation split out of the training set (in-memory data, an image folder without val/): a resume
# with others would validate on samples it trained on
SPLIT_BY = ("seed", "val_fraction")
AT_LEAST_ONE = (lambda v: v >= 1, "must be at least 1")
NOT_NEGATIVE = (lambda v: v >= 0, "must not be negative")
POSITIVE = (lambda v: 0 < v < math.inf, "must be positive and finite")

# field -> (holds, what the value must be); None values (an unset optional) are not checked
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "cpu_workers": AT_LEAST_ONE, "workers_per_gpu": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE,
    "grad_accum": AT_LEAST_ONE, "epochs": AT_LEAST_ONE, "avg_every": AT_LEAST_ONE, "max_steps": AT_LEAST_ONE,
    "seed": NOT_NEGATIVE, "patience": NOT_NEGATIVE, "validate_every": NOT_NEGATIVE, "save_every": NOT_NEGATIVE,
    "save_every_steps": NOT_NEGATIVE, "data_workers": NOT_NEGATIVE, "max_bad_samples": NOT_NEGATIVE,
    "max_restarts": NOT_NEGATIVE, "profile_from": NOT_NEGATIVE, "profile_updates": AT_LEAST_ONE,
    "heartbeat_timeout": (lambda v: 0 < v < math.inf, "must be a positive number of seconds"),
    "bucket_mb": POSITIVE, "lr": POSITIVE,
    "clip_grad": (lambda v: 0 < v < math.inf, "must be a positive norm"),
    "val_fraction": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "weight_decay": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "momentum": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "target_error": (lambda v: 0 <= v <= 1, "must be a fraction in [0, 1]"),
    "amp": (lambda v: v in ("bf16", "fp16"), "must be bf16 or fp16"),
    "zero": (lambda v: v in (0, 1, 2), "must be 0, 1 or 2"),
    "outer_lr": (lambda v: 0 < v <= 10, "must be in (0, 10]"),
    "outer_momentum": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "fragments": AT_LEAST_ONE, "outer_delay": NOT_NEGATIVE, "max_staleness": NOT_NEGATIVE,
    "outer_optimizer": (lambda v: v in ("average", "nesterov"), "must be average or nesterov"),
    "outer_dtype": (lambda v: v in ("fp32", "bf16", "fp16", "int8"), "must be fp32, bf16, fp16 or int8"),
}
MAX_LR = 10.0       # above this every optimizer we offer diverges at once


def check_field(config: TrainConfig, name: str) -> None:
    value = getattr(config, name)
    holds, must = RULES[name]
    if value is not None and not holds(value):
        raise ConfigError(f"--{name.replace('_', '-')} {must}, got {value}")


def check_numbers(config: TrainConfig) -> None:
    """Each field's rule, a learning rate that can train, and every number in the JSON options finite."""
    for name in RULES:
        check_field(config, name)
    if config.lr > MAX_LR:
        raise ConfigError(f"--lr {config.lr} is far above any learning rate that trains (at most {MAX_LR}); "
                          "typical ones are 1e-4 to 0.5")
    for flag, options in (("--model-options", config.model_options), ("--dataset-options", config.dataset_options)):
        for key, value in options.items():
            if any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(value)):
                raise ConfigError(f"{flag} {key}={value} must be a finite number")


def _numbers(value: Any) -> list[Any]:
    return [n for v in value for n in _numbers(v)] if isinstance(value, (list, tuple)) else [value]


def plan_workers(config: TrainConfig, launcher: Launcher | None = None) -> tuple[list[int], TrainConfig]:
    """Where the workers run, checked without importing torch (so that Train.py can start its workers
    first): (the GPUs of each host, the config with ``workers`` and ``workers_per_gpu`` decided).
    ``launcher``: the nodes an engine started Train.py on (harness/launch/agents.py), if it did."""
    for name in ("cpu_workers", "workers_per_gpu", "heartbeat_timeout", "max_restarts"):
        check_field(config, name)
    config = check_cluster(config, launcher.cluster if launcher else None)
    if launcher is not None or config.launcher != "local":
        gpus, config = _remote_plan(config, launcher)
    else:
        if config.control_address or config.encrypt:
            raise ConfigError("--control-address and --encrypt are for workers on other hosts (--launcher ssh or "
                              "slurm); a local run talks over a private Unix socket")
        try:
            make_launcher(config.launcher, config.hosts, config.hostfile)
            gpus = resolve_gpus(config.gpus if config.gpus is not None else ("all" if visible_gpus() else None))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        config = config.replace(workers=len(gpus) * config.workers_per_gpu or config.cpu_workers)
    if not gpus and (config.workers_per_gpu > 1 or config.mps):
        flag = "--mps" if config.mps else f"--workers-per-gpu {config.workers_per_gpu}"
        raise ConfigError(f"{flag} needs GPU workers, but none are used; pass --gpus, or use --cpu-workers N on CPU")
    if config.heal == "on" and not config.max_restarts:
        raise ConfigError("--heal on needs --max-restarts N (how many failures the run may survive), e.g. 3")
    return gpus, config.replace(heal_in_place=heals_in_place(config, gpus))


def cluster_start(config: TrainConfig) -> ClusterStart | None:
    """What the engine that started this process said (harness/launch/cluster.py), checked: one process
    per node, and on several nodes no launcher of our own (the engine started each node's process). Under
    MPI this process first takes back the CPUs mpirun's binding took from it (``unbind_from_mpi``)."""
    try:
        start = detect(os.environ, config.cluster)
        check_start(start)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    unbound = unbind_from_mpi(start)
    if unbound:
        print(unbound, flush=True)
    if start and start.nodes > 1 and (config.launcher != "local" or config.hosts or config.hostfile):
        raise ConfigError(f"--launcher {config.launcher}: {start.engine} started Train.py on each of its {start.nodes} "
                          "nodes, and each starts its node's workers; drop --launcher, --hosts and --hostfile")
    return start


def check_cluster(config: TrainConfig, job: ClusterStart | None = None) -> TrainConfig:
    """Started by an engine: checked (``cluster_start``), and after the engine restarted the job (``job``:
    what every node's engine said, where node agents have told it), a resume from the checkpoint the
    run was writing, also where the job began by resuming another (its --resume is where it began, not where
    it got to)."""
    start = job or cluster_start(config)
    if start and start.restart_count and config.save and config.resume != config.save and \
            Path(config.save).exists():
        return config.replace(resume=config.save)
    return config


def _remote_plan(config: TrainConfig, launcher: Launcher | None) -> tuple[list[int], TrainConfig]:
    """--launcher ssh or slurm, or node agents (``launcher``). This machine cannot see the hosts' GPUs: ``--gpus all`` (the default
    where this machine has GPUs) gives each of a host's workers its own GPU, 0, 1, ..., or with
    ``--workers-per-gpu K`` each K workers one; ``--gpus 0,1`` shares a host's workers out over those.
    Workers that share a GPU combine through CUDA IPC on their host, as on one machine;
    ``workers_per_gpu`` becomes the most that share one."""
    if config.mps:
        raise ConfigError(f"--mps works on one machine only so far (it starts a private MPS daemon there); drop it "
                          f"with --launcher {config.launcher} (--workers-per-gpu works without it)")
    try:
        launcher = launcher or make_launcher(config.launcher, config.hosts, config.hostfile)
        most = max(h.slots for h in launcher.hosts)
        gpus = host_gpus(config.gpus if config.gpus is not None else ("all" if visible_gpus() else None),
                         -(-most // config.workers_per_gpu))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    per_gpu = config.workers_per_gpu
    if gpus:
        sharing = -(-most // len(gpus))
        if sharing > per_gpu > 1:
            raise ConfigError(f"--workers-per-gpu {per_gpu} on GPUs {','.join(map(str, gpus))}: a host "
                              f"with {most} slots would put {sharing} workers on a GPU; list more GPUs, give the "
                              f"hosts fewer slots or raise --workers-per-gpu")
        per_gpu = max(per_gpu, sharing)
    return gpus, config.replace(workers=launcher.slots, workers_per_gpu=per_gpu)


def gpu_heal_limit(config: TrainConfig) -> str | None:
    """What keeps GPU workers from healing in place, if anything. A GPU worker's update applies only
    if its collectives completed (harness/resilience/heal.py), which a fused optimizer can be told;
    param mode's averaging and workers sharing a GPU have no such guard yet."""
    if config.workers_per_gpu > 1:
        return f"--workers-per-gpu {config.workers_per_gpu}"
    if config.mode == "param":
        return "--mode param"
    if (config.optimizer_impl or default_impl(config.optimizer)) != "fused":
        return f"--optimizer {config.optimizer}" + (f" --optimizer-impl {config.optimizer_impl}"
                                                    if config.optimizer_impl else "")
    return None


def heals_in_place(config: TrainConfig, gpus: list[int]) -> bool:
    """Whether a dead worker is replaced and healed from the survivors (else the group restarts from the
    last checkpoint). GPU workers whose updates cannot be guarded (``gpu_heal_limit``) restart; --zero
    heals in place only with --heal on, which keeps a replica of each shard on the next worker. --mode async's
    workers share no collective, so they heal in place on CPUs and GPUs alike (harness/collectives/server.py)."""
    if not config.max_restarts or config.heal == "off":
        return False
    if config.mode == "async":      # no collective to guard: a replacement rejoins the server, CPU or GPU
        return True
    if config.zero and config.heal != "on":
        return False        # a replica of each shard (healing in place) costs memory: only when asked for
    limit = gpu_heal_limit(config) if gpus else None
    if limit and config.heal == "on":
        raise ConfigError(f"--heal on: GPU workers heal in place in grad mode, with a fused optimizer, one worker "
                          f"per GPU, not with {limit}; drop --heal on to restart from the last checkpoint instead "
                          f"(save often with --save-every-steps)")
    return limit is None


def check_outputs(config: TrainConfig) -> None:
    """What the run writes can be written (without torch: before the workers start), and no live run holds it (its
    lock, which this creates nothing to look at: the run takes its own once the checks passed). The checkpoint's
    folder is probed here, where the run's lock goes beside it (and in async mode the checkpoint itself), and again
    by rank 0 (``check_inputs``), which writes it from its own host in the other modes."""
    if not config.log_dir:
        raise ConfigError(f"--log-dir '' names no folder, and every run writes its log; give one (default "
                          f"{TrainConfig.log_dir})")
    if Path(config.log_dir).exists() and not Path(config.log_dir).is_dir():
        raise ConfigError(f"--log-dir {config.log_dir} is a file, not a folder; give a folder for the log "
                          f"(default {TrainConfig.log_dir})")
    if config.save and (Path(config.save).is_dir() or config.save.endswith(("/", os.sep))):
        raise ConfigError(f"--save {config.save} is a folder; give a file path inside it, e.g. "
                          f"{Path(config.save) / 'model.pt'}")
    _check_writable(config)
    try:
        refuse_if_held({"--save": config.save}, {"--log-dir": config.log_dir})
    except InUse as e:
        raise ConfigError(str(e)) from None


def _check_writable(config: TrainConfig) -> None:
    if config.save:
        try:
            check_writable(config.save)
        except NotWritable as e:
            raise ConfigError(str(e)) from None


def check_flags(config: TrainConfig, gpus: list[int]) -> TrainConfig:
    """Each field's own rule (RULES), then the rules across fields (fast: no data is read, and no torch
    imported). Returns the config with ``momentum`` and ``cuda_graph`` decided."""
    from harness.checkout import datasets, models
    if not datasets.is_known(config.dataset):
        raise ConfigError(datasets.unknown(config.dataset))
    if config.model not in models.MODELS and ":" not in config.model:
        raise ConfigError(models.unknown(config.model))
    if config.loss is not None:
        from harness.plugins import check_findable
        try:
            check_findable(config.loss, "loss")
        except ValueError as e:
            raise ConfigError(f"--loss: {e}") from None
    check_numbers(config)
    check_across(config, gpus)
    momentum = config.momentum if config.momentum is not None else (0.9 if config.optimizer == "sgd" else 0.0)
    try:
        check_options(config.optimizer, config.lr, momentum, config.weight_decay, config.nesterov,
                      config.optimizer_impl)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return config.replace(momentum=momentum)


def check_across(config: TrainConfig, gpus: list[int]) -> None:
    """The rules that tie one flag to another."""
    if config.warmup_steps < 0:
        raise ConfigError(f"--warmup-steps {config.warmup_steps} must not be negative")
    if not 0 <= config.min_lr <= config.lr:
        raise ConfigError(f"--min-lr {config.min_lr} must be between 0 and --lr {config.lr}")
    fused = (config.optimizer_impl or default_impl(config.optimizer)) == "fused"
    if config.cuda_graph and not fused and not is_constant(config.lr_schedule, config.warmup_steps):
        raise ConfigError(f"--cuda-graph would freeze the learning rate that --lr-schedule/--warmup-steps change "
                          f"every update: --optimizer {config.optimizer} is not fused, so its rate is not read "
                          f"from the device; use a fused optimizer (sgd, adam, adamw, adagrad) or drop one of them")
    check_zero(config)
    check_outer(config)
    check_async(config)
    check_idle(config)
    check_gpu_flags(config, gpus)
    if config.amp == "fp16" and not fused:
        impl = f" --optimizer-impl {config.optimizer_impl}" if config.optimizer_impl else ""
        raise ConfigError(f"--amp fp16 skips an overflowing update through the flag fused optimizers read, which "
                          f"--optimizer {config.optimizer}{impl} ignores; use a fused optimizer (sgd, adam, adamw, "
                          "adagrad) or --amp bf16")
    if config.compile and not gpus and not shutil.which("g++"):
        raise ConfigError("--compile on CPU workers needs a C++ compiler for torch's CPU code: install g++ "
                          "(e.g. apt-get install g++) or drop --compile")
    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'")
    if config.profile and config.max_steps and config.max_steps < config.profile_from + config.profile_updates:
        raise ConfigError(f"--profile records updates {config.profile_from + 1} to "
                          f"{config.profile_from + config.profile_updates}, after --max-steps {config.max_steps}: "
                          "lower --profile-from or raise --max-steps")


def check_idle(config: TrainConfig) -> None:
    """A flag that would change nothing in this run, because what it sets is another mode's or another flag's, is
    refused: set on purpose, it would be trusted to have done something. (--val-fraction, whose use depends on the
    data's files: ``check_held_out``.)"""
    from harness.checkout.datasets import FOLDERLESS
    grads = _given(config, "grad_sync", "bucket_mb", "reduce_dtype")
    if grads and config.mode != "grad":
        raise ConfigError(f"{_listed(grads)} {_verb(grads)} how --mode grad averages gradients, which --mode "
                          f"{config.mode} does not do; drop {_them(grads)}")
    every = _given(config, "avg_every")
    if every and config.mode == "grad":
        raise ConfigError(f"{_listed(every)} sets how often --mode param (or async) syncs; add --mode param or drop it")
    floor = _given(config, "min_lr")
    if floor and config.lr_schedule == "constant":
        raise ConfigError(f"{_listed(floor)} is where a --lr-schedule ends, and the constant rate has none; add "
                          "--lr-schedule cosine (or linear, step) or drop it")
    cadence = _given(config, "save_every", "save_every_steps")
    if cadence and not config.save:
        raise ConfigError(f"{_listed(cadence)} {_verb(cadence)} how often --save writes, and this run saves nothing "
                          f"(--save ''); give --save a path or drop {_them(cadence)}")
    folder = _given_here(config, "data_dir")
    if folder and config.dataset in FOLDERLESS:
        raise ConfigError(f"{_listed(folder)}: --dataset {config.dataset} reads no folder (it is bundled or "
                          "generated); drop --data-dir, or use a dataset that reads one (imagefolder, tokens, mnist, "
                          "cifar10, package.module:factory)")
    if ":" not in config.dataset and config.dataset not in FOLDERLESS and config.data_dir and \
            os.path.isfile(config.data_dir):     # a factory may read a file
        raise ConfigError(f"--data-dir {config.data_dir} is a file; --dataset {config.dataset} reads a folder: give "
                          f"the one that holds its files ({os.path.dirname(config.data_dir) or '.'})")
    profiled = _given(config, "profile_from", "profile_updates")
    if profiled and not config.profile:
        raise ConfigError(f"{_listed(profiled)} {_verb(profiled)} what --profile records; add --profile DIR or drop "
                          f"{_them(profiled)}")


def check_gpu_flags(config: TrainConfig, gpus: list[int]) -> None:
    """--cuda-graph and --no-tf32 set how GPU workers run: refused for CPU workers, as ``check_idle`` refuses (not on
    a resume, whose settings may be the saved run's, from GPUs)."""
    if config.resume:
        return
    given = {"cuda_graph": True} if config.cuda_graph else {}
    if not config.tf32:
        given["tf32"] = False
    if given and not gpus:
        flags = ", ".join("--cuda-graph" if name == "cuda_graph" else "--no-tf32" for name in given)
        raise ConfigError(f"{flags} {_verb(given)} how GPU workers run, and this run's workers are on the CPU; drop "
                          f"{_them(given)} (or pass --gpus)")


def _given(config: TrainConfig, *names: str) -> dict[str, Any]:
    """Those of ``names`` whose value is not the default: set by the user."""
    return {name: getattr(config, name) for name in names if getattr(config, name) != getattr(TrainConfig, name)}


def _given_here(config: TrainConfig, *names: str) -> dict[str, Any]:
    """``_given`` for a check that came after checkpoints were written: none on a resume, whose values may be an
    older run's that the check did not refuse then (the user cannot set them back)."""
    return {} if config.resume else _given(config, *names)


def _listed(given: dict[str, Any]) -> str:
    return ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in given.items())


def _verb(given: dict[str, Any]) -> str:
    return "sets" if len(given) == 1 else "set"


def _them(given: dict[str, Any]) -> str:
    return "it" if len(given) == 1 else "them"


def check_zero(config: TrainConfig) -> None:
    """--zero shards grad mode's buckets over the workers, one worker a GPU."""
    if not config.zero:
        return
    clash = (f"--mode {config.mode}" if config.mode in ("param", "async") else
             f"--workers-per-gpu {config.workers_per_gpu}" if config.workers_per_gpu > 1 else
             "--grad-sync flat" if config.grad_sync == "flat" else
             "--reduce-dtype bf16" if config.reduce_dtype == "bf16" else None)
    if clash:
        raise ConfigError(f"--zero {config.zero} shards grad mode's gradient buckets over one worker per GPU, "
                          f"which {clash} does not have; drop {clash} or use --zero 0")


def check_outer(config: TrainConfig) -> None:
    """The outer optimizer's flags belong to param mode, --avg-optimizer-state to plain averaging, and a fragment's
    exchange lands before its next."""
    given = [f"--{name.replace('_', '-')}" for name in _given(config, "outer_optimizer", "outer_lr", "outer_momentum",
                                                              "fragments", "outer_delay", "outer_dtype")]
    if given and config.mode not in ("param", "async"):
        raise ConfigError(f"{', '.join(given)} {'set' if len(given) > 1 else 'sets'} what --mode param (or async) "
                          "does every --avg-every updates; add --mode param or drop them")
    if config.avg_optimizer_state and config.mode != "async" and (config.mode != "param" or config.outer):
        raise ConfigError("--avg-optimizer-state averages the optimizer's state with the parameters, in plain averaging "
                          + ("(--mode param); add --mode param or drop it" if config.mode != "param" else
                             "(--mode param without an outer optimizer, fragments, delay or compression); the outer "
                             "optimizer keeps each worker's own inner state, as DiLoCo does: drop it"))
    if config.outer_momentum is not None and config.outer_optimizer != "nesterov":
        raise ConfigError(f"--outer-momentum {config.outer_momentum} is nesterov's; add --outer-optimizer nesterov")
    if config.fragments > config.avg_every:
        raise ConfigError(f"--fragments {config.fragments} is more than --avg-every {config.avg_every}: each fragment "
                          "syncs once every K updates, at its own; use at most K fragments")
    if config.outer_delay and config.outer_delay >= config.avg_every // config.fragments:
        raise ConfigError(f"--outer-delay {config.outer_delay} must be under --avg-every / --fragments "
                          f"({config.avg_every} / {config.fragments}), so a fragment's exchange lands before its next")


def check_async(config: TrainConfig) -> None:
    """--mode async (harness/collectives/server.py) pushes whole pseudo-gradients to the parent's server,
    and its workers share no collective: what needs one, or a fragment of the model, is refused."""
    if config.mode != "async":
        if config.max_staleness != TrainConfig.max_staleness:
            raise ConfigError(f"--max-staleness {config.max_staleness} bounds --mode async's server; add --mode async "
                              "or drop it")
        return
    clash = ("--fragments" if config.fragments > 1 else
             "--avg-optimizer-state" if config.avg_optimizer_state else
             "--patience" if config.patience else "--target-error" if config.target_error is not None else None)
    if clash:
        raise ConfigError(f"--mode async does not support {clash} yet (a whole model is pushed at a time, and the "
                          f"workers share no collective); "
                          f"drop it, or use --mode param --outer-optimizer nesterov")


def check_fields(config: TrainConfig) -> None:
    """Every field of its type, and every field that a flag offers choices for one of them: before anything starts."""
    config.check_types()
    check_choices(config)


def resolve(config: TrainConfig) -> tuple[list[int], TrainConfig]:
    """``plan_workers`` and ``check_flags``: (GPUs, the config with every decided field filled in)."""
    check_fields(config)
    gpus, config = plan_workers(config)
    return gpus, check_flags(config, gpus)


def check_inputs(config: TrainConfig) -> TrainConfig:
    """The checks that read files (data, a checkpoint to resume) or build the model (on the meta
    device); returns the config with ``samples``, ``data_workers`` (this host's cores shared out) and a resume's
    ``update_offset`` decided."""
    from harness.data.pipeline import default_data_workers
    from harness.resilience.checkpoint import CheckpointError, load_checkpoint
    _check_loss(config)
    samples, validated, info = _check_data_and_model(config)
    loaders = config.data_workers if config.data_workers is not None else default_data_workers(config.workers)
    config = config.replace(samples=samples, classes=[str(name) for name in info.class_names], data_workers=loaders)
    check_early_stop(config, validated)
    check_length(config)
    if config.mode != "async":      # rank 0 writes it, on a host that need not be the parent's
        _check_writable(config)
    try:
        saved = load_checkpoint(config.resume) if config.resume else None
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    if saved:
        config = config.replace(update_offset=update_offset(config, saved))
        _check_resumable(config, saved)
        _check_model_state(config, info, saved["model"])
    return config


def update_offset(config: TrainConfig, saved: dict) -> int:
    """The updates checkpoint ``saved`` trained in its finished epochs beyond what as many epochs count in
    ``config`` (0 unless a resume changed an epoch's updates, which it may at an epoch's end). --mode async counts
    its budget over the workers together (``trained``): 0."""
    if config.mode == "async":
        return 0
    return saved["step"] - saved.get("position", 0) - saved["epoch"] * config.steps_per_epoch()


def _check_model_state(config: TrainConfig, info: Any, saved: dict) -> None:
    """The model as it builds now (on the meta device) fits the checkpoint's state: its code or --model-options may
    have changed since it was trained. A model that cannot be built on the meta device is not checked here (its
    workers' load_state_dict says so)."""
    from harness.resilience.checkpoint import ModelMismatch, load_model_state
    from harness.training.fit import on_meta
    model = on_meta(config, info)
    try:
        if model is not None:
            load_model_state(model, saved)
    except ModelMismatch as e:
        raise ConfigError(f"{e.sentence(f'--resume {config.resume}', config.model)}: restore them to resume it, or "
                          "train anew without --resume") from None


def check_length(config: TrainConfig) -> None:
    """What is counted in updates against the run's length (known once the data's size is). A warm-up as long as
    the run never reaches --lr: the run trains at a fraction of the rate it was given. A --validate-every longer
    than the run never validates (and it replaces the epochs' validations), so --target-error and --patience
    never act either. A resume goes on with the schedule it was trained with."""
    total = config.total_updates(config.steps_per_epoch())
    if config.resume:
        return
    if config.warmup_steps >= total:
        raise ConfigError(f"--warmup-steps {config.warmup_steps} is as long as the run or longer ({total} updates): "
                          f"the rate would never reach --lr {config.lr}; warm up for a few percent of the run "
                          f"(e.g. --warmup-steps {max(1, total // 20)}) or train longer")
    if config.validate_every > total:
        raise ConfigError(f"--validate-every {config.validate_every} is longer than the run ({total} updates): it "
                          f"would never validate; validate more often (e.g. --validate-every {max(1, total // 4)}) "
                          "or drop it to validate at each epoch's end")


def _check_loss(config: TrainConfig) -> None:
    """--loss names a callable (the parent found its module without importing it: check_flags)."""
    if config.loss is not None:
        from harness.training.losses import make_loss
        try:
            make_loss(config.loss)
        except ValueError as e:
            raise ConfigError(f"--loss: {e}") from None


def check_inputs_in(ctx: Any, config: TrainConfig) -> TrainConfig | str | None:
    """``check_inputs`` as a worker's exec (rank 0's; the others return None at once): the checked config, or
    the line of the ConfigError it raised."""
    if ctx.rank != 0:
        return None
    try:
        return check_inputs(config)
    except ConfigError as e:
        return str(e)


def check_early_stop(config: TrainConfig, validated: bool) -> None:
    """--patience and --target-error stop on validation, which a run without a validation split (``validated``
    False) never makes."""
    stops = _given(config, "patience", "target_error")
    if stops and not validated:
        raise ConfigError(f"{_listed(stops)} {_verb(stops)} when to stop on validation, and --dataset "
                          f"{config.dataset} has no validation split in this run; add --val-fraction 0.1 (or a "
                          f"validation split to the data) or drop {_them(stops)}")


def _check_resumable(config: TrainConfig, saved: dict) -> None:
    from harness.checkout.datasets import holds_out
    from harness.checkout.datasets.split import other_classes
    before = {"grad_accum": 1, **saved["config"]}       # checkpoints from before --grad-accum
    fixed = {name: "" for name in FIXED_ON_RESUME}
    fixed.update({name: " (it stopped mid-epoch)" for name in FIXED_MID_EPOCH if saved.get("position")})
    if before.get("val_fraction") and holds_out(config.dataset, config.data_dir):
        fixed.update({name: " (its validation samples are held out of the training set by --seed and --val-fraction: "
                            "others would validate on samples it trained on)" for name in SPLIT_BY})
    if any(part.get("pending") for part in saved.get("ranks") or []):
        fixed["fragments"] = " (exchanges of its fragments were in flight when it saved)"
    other = other_classes(before.get("classes") or [], config.classes)
    if other:
        raise ConfigError(f"--resume {config.resume}: the data's {other}; resume it on the data it trained on")
    differ = [name for name in fixed if before.get(name) != getattr(config, name)]
    if differ:
        raise ConfigError(f"--resume {config.resume} was trained with "
                          + ", ".join(_saved_as(k, before.get(k)) for k in differ)
                          + "; drop the flags that change them to continue it (a resume takes them from the "
                          "checkpoint)" + "".join(dict.fromkeys(fixed[name] for name in differ)))
    done, total, every = trained(config, saved)
    if done >= total:
        length = f"--max-steps {config.max_steps}" if config.max_steps else \
            f"--epochs {config.epochs} of {config.steps_per_epoch()} updates"
        raise ConfigError(f"--resume {config.resume} has trained {done} updates{every}, and this run's length is "
                          f"{total} ({length}{' each' if every else ''}): nothing is left to train; pass a larger "
                          "--epochs or --max-steps to train more")


def _saved_as(name: str, value: object) -> str:
    """A setting of the saved run, in the words of Train.py's flags."""
    if name == "samples":
        return f"a training set of {value} samples"
    if name == "workers":
        return f"{value} workers (--cpu-workers, or the GPUs times --workers-per-gpu)"
    return f"--{name.replace('_', '-')} {value!r}"


def trained(config: TrainConfig, saved: dict) -> tuple[int, int, str]:
    """(the updates checkpoint ``saved`` has trained (outside async mode its "saved" record will do), the updates a
    checked ``config`` trains in all, and how they count: "", or in async mode " by N workers together", where the
    budget is every worker's together and a fast worker runs more than its share)."""
    total = config.total_updates(config.steps_per_epoch())
    served = (saved.get("ranks") or [{}])[0].get("server") if config.mode == "async" else None
    if served:
        return sum(served["updates"]), total * config.workers, f" by {config.workers} workers together"
    return saved["step"], total, ""


def _check_data_and_model(config: TrainConfig) -> tuple[int, bool, Any]:
    """Check the data's cheap facts (a streamed dataset is scanned and one sample of each split
    decoded; nothing is loaded whole) and the model on a batch of it (fit.py): a missing file, a bad
    option or a batch larger than a worker's shard fails here, not in every worker. Returns the
    number of training samples, whether there is a validation split, and the data's DataInfo."""
    from harness.checkout.datasets import check_data
    from harness.training.fit import check_fit
    check_held_out(config)
    with one_line_errors():
        facts = check_data(config.dataset, config.data_dir, seed=config.seed, val_fraction=config.val_fraction,
                           max_bad_samples=config.max_bad_samples, **config.dataset_options)
    check_fit(config, facts.info, facts.train)
    samples = facts.samples
    shard = samples // config.workers
    if config.batch_size * config.grad_accum > shard:
        accum = f" x --grad-accum {config.grad_accum}" if config.grad_accum > 1 else ""
        raise ConfigError(f"--batch-size {config.batch_size}{accum} is larger than a worker's shard ({shard} "
                          f"samples of {samples} over {config.workers} workers); --batch-size is each worker's, "
                          f"so it can be {shard // config.grad_accum} at most"
                          + (f" with --grad-accum {config.grad_accum}" if accum else ""))
    return samples, facts.validated, facts.info


def check_held_out(config: TrainConfig) -> None:
    """--val-fraction is refused where the data has a validation split of its own (read on the data's host)."""
    from harness.checkout.datasets import describe_test, holds_out
    held = _given_here(config, "val_fraction")
    if held and not holds_out(config.dataset, config.data_dir):
        where = "its factory's 'val' split (none where it returns None)" if ":" in config.dataset else \
            describe_test(config.dataset, config.data_dir)
        raise ConfigError(f"{_listed(held)} holds part of the training set out for validation, and --dataset "
                          f"{config.dataset} validates on {where} instead; drop --val-fraction")


def check(config: TrainConfig) -> tuple[list[int], TrainConfig]:
    """Every check ``run`` makes, without starting workers: (GPUs, the config ready to train)."""
    gpus, config = resolve(config)
    check_outputs(config)
    return gpus, check_inputs(config)
