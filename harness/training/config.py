"""A training run's configuration: one typed dataclass, the fields named as Train.py's flags.

Train.py fills it from its argparse groups (harness/training/flags.py); a script or a notebook builds
one directly and calls ``harness.training.run(config)``. Every default is here, once, with what it
means; the checks live in harness/training/checks.py. The checkpoint stores ``to_dict()`` (plain
types only, so ``torch.load(weights_only=True)`` reads it) and Test.py and ``--resume`` rebuild it with
``TrainConfig.from_dict``.

The last group is not set by users: the checks (harness/training/checks.py: ``resolve()`` in the parent,
``check_inputs`` on rank 0) decide it before any worker trains, and the workers read it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spelling import did_you_mean

DEFAULT_SAVE = "checkpoints/model.pt"
# What each annotation of TrainConfig's fields admits (an int where a float is due; never a bool for a number).
TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,), "list": (list, tuple),
         "None": (type(None),)}
# Not taken from the checkpoint on --resume: decided again for this run and machine.
DECIDED_AGAIN = ("data_workers", "workers", "samples", "classes", "heal_in_place", "update_offset")
# What a resume may not change (mid-epoch, also what the rest of the epoch's order depends on).
FIXED_ON_RESUME = ("model", "model_options", "dataset", "dataset_options", "optimizer")
FIXED_MID_EPOCH = ("seed", "batch_size", "grad_accum", "workers", "samples")
PATHS = ("save", "log_dir", "data_dir", "profile")      # relative to the folder a run is started in
# Train.py's synchronisation flags but --mode: a resume that changes --mode to or from grad takes their defaults
# where it does not give them (the saved run's were that mode's; kept, they would be refused as another mode's)
SYNCHRONISATION = ("max_staleness", "avg_every", "avg_optimizer_state", "outer_optimizer", "outer_lr",
                   "outer_momentum", "fragments", "outer_delay", "outer_dtype", "grad_sync", "bucket_mb", "zero",
                   "reduce_dtype")


def _how_to_give(name: str, value: Any, types: list[str]) -> str:
    """The conversion a value of another type needs, where there is a usual one."""
    if name in ("model", "dataset", "loss") and not isinstance(value, str):
        return (" (name a factory as 'package.module:factory', a function in a module file the workers import, "
                "not the object itself)")
    if name == "gpus" and isinstance(value, (list, tuple)):
        return f" (the GPUs as one string: {','.join(map(str, value))!r})"
    if isinstance(value, os.PathLike) and "str" in types:
        return " (pass str(path))"
    if hasattr(value, "item") and ("int" in types or "float" in types):     # a numpy or torch scalar
        return f" (pass {types[0]}(value))"
    return " (the options themselves, not their JSON text)" if types[0] == "dict" else ""


class ConfigError(ValueError):
    """Bad input; reported as one line, before any worker starts (Train.py exits 2)."""


def rebased(saved: TrainConfig, resume: str) -> TrainConfig:
    """The saved run's relative paths (``PATHS``) made absolute from the folder that run ran in, where it is not
    this one: found from ``resume`` being the file that run saved (its ``save`` is the tail of the path). So a
    resume from another folder writes the same checkpoint and log as the run it continues, not new ones beside
    it. Unchanged where the file is not where that run saved it (copied, moved)."""
    if not saved.save or os.path.isabs(saved.save):
        return saved
    here, tail = Path(os.path.abspath(resume)).parts, Path(os.path.normpath(saved.save)).parts
    origin = Path(*here[:-len(tail)]) if len(here) > len(tail) and here[-len(tail):] == tail else None
    if origin is None or origin == Path.cwd():
        return saved
    return dataclasses.replace(saved, **{name: str(origin / getattr(saved, name)) for name in PATHS
                                         if getattr(saved, name) and not os.path.isabs(getattr(saved, name))})


def refuse_a_copy(saved: TrainConfig, resume: str) -> None:
    """A ConfigError where ``resume`` is a copy of the checkpoint its run saved, which still exists: the resumed
    run would write that file (its --save), not the copy, and so replace the run the copy was made from."""
    if saved.save and os.path.exists(saved.save) and not os.path.samefile(saved.save, resume):
        raise ConfigError(f"--resume {resume} is a copy of {saved.save}, the checkpoint its run saved, which this "
                          f"run would replace (and add to its log in {saved.log_dir}); pass --save for this run, "
                          f"e.g. --save {resume} --log-dir {Path(resume).parent / 'runs'}, or resume {saved.save}")


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """What opening the user's data or building their model raises (a file we may not read, a bad option, a
    module that does not import), as a ConfigError of its first line."""
    try:
        yield
    except (OSError, ValueError, TypeError, ImportError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None


@dataclass
class TrainConfig:
    # -- model and data
    model: str = "mlp"                  # registry name (models/__init__.py) or package.module:factory
    model_options: dict = field(default_factory=dict)       # keyword arguments of the model factory
    loss: str | None = None             # package.module:fn, fn(output, batch) (None: the model's own, else cross-entropy)
    dataset: str = "digits"             # registry name (datasets/__init__.py) or package.module:factory
    dataset_options: dict = field(default_factory=dict)     # keyword arguments of the dataset
    data_dir: str | None = None         # the dataset's folder (None: the dataset's own default)
    data_workers: int | None = None     # loader processes per worker (None: the host's cores shared out)
    val_fraction: float = 0.1           # share of the training set held out for validation (image folder: without val/)
    max_bad_samples: int = 10           # samples that fail to load, skipped and replaced, before the run stops
    # -- workers and placement
    gpus: str | None = None             # "all" or "0,1" (None: every GPU if there is one, else CPU)
    cpu_workers: int = 2                # workers when no GPU is used
    workers_per_gpu: int = 1            # workers sharing each GPU (CUDA IPC among them)
    launcher: str = "local"             # local, ssh or slurm
    hosts: str | None = None            # ssh: "node1:8,node2:8"
    hostfile: str | None = None         # ssh: a file of hosts
    control_address: str | None = None  # remote workers reach the parent here (None: the route's)
    encrypt: bool = False               # remote workers: CurveZMQ on the control plane
    mps: bool = False                   # a private NVIDIA MPS daemon for the run
    heartbeat_timeout: float = 30.0     # seconds of silence before a worker counts as hung
    cluster: str = "auto"               # the engine that started this process: auto-detected, none, or its name
    # -- synchronisation
    mode: str = "grad"                  # grad: average gradients every update; param: parameters; async: a server's
    max_staleness: int = 1              # async mode: how many server versions a worker may fall behind
    avg_every: int = 1                  # param mode: average every K updates
    avg_optimizer_state: bool = False   # param mode: average momentum/Adam state too
    outer_optimizer: str = "average"    # param mode: average (outer SGD at lr 1) or nesterov (DiLoCo)
    outer_lr: float | None = None       # param mode: the outer learning rate (None: 1 for average, 0.7 for nesterov)
    outer_momentum: float | None = None  # param mode: nesterov's momentum (None: 0.9)
    fragments: int = 1                  # param mode: fragments synced at staggered updates (streaming DiLoCo)
    outer_delay: int = 0                # param mode: updates a fragment's exchange runs under before it applies
    outer_dtype: str = "fp32"           # param mode: pseudo-gradients sent as fp32, bf16, fp16 or int8
    grad_sync: str = "bucketed"         # grad mode: buckets during backward, or "flat" after it
    bucket_mb: float = 25.0             # grad mode: bucket size in MiB
    reduce_dtype: str = "fp32"          # grad mode: fp32 (the gradients' own) or bf16
    zero: int = 0                       # grad mode: 0 full replicas; 1 shard the optimizer state; 2 also gradients
    # -- optimizer and schedule
    optimizer: str = "sgd"              # sgd, adam, adamw, adagrad, ccnesterov, ...
    optimizer_impl: str | None = None   # fused or foreach (None: fused where torch has it)
    lr: float = 0.05                    # learning rate
    momentum: float | None = None       # sgd momentum (None: 0.9 for sgd, else 0)
    nesterov: bool = False              # sgd: Nesterov momentum
    weight_decay: float = 0.0
    lr_schedule: str = "constant"       # constant, cosine, linear, step
    warmup_steps: int = 0               # updates of linear warm-up to lr
    min_lr: float = 0.0                 # where a schedule ends
    # -- the step
    batch_size: int = 32                # per worker and micro-batch
    grad_accum: int = 1                 # micro-batches per update
    amp: str | None = None              # "bf16" autocast, or "fp16" autocast with loss scaling
    tf32: bool = True                   # GPU: TF32 tensor cores for fp32 matmuls and convolutions
    cuda_graph: bool | None = None      # GPU: capture the whole step (None: wherever it can be)
    compile: bool = False               # torch.compile the model for the training step
    clip_grad: float | None = None      # clip the averaged gradients to this global norm
    # -- run length and validation
    epochs: int = 10
    max_steps: int | None = None        # updates in all (overrides epochs)
    validate_every: int = 0             # validate every N updates (0: at each epoch's end)
    target_error: float | None = None   # stop once the validation error is at most this
    patience: int = 0                   # stop after this many validations without improvement (0: never)
    seed: int = 0
    # -- checkpoints
    save: str | None = DEFAULT_SAVE     # checkpoint path (None or "": do not save)
    save_every: int = 1                 # save every N epochs, and at the end
    save_every_steps: int = 0           # also save every N updates, mid-epoch too (0: off)
    resume: str | None = None           # checkpoint to continue from, exactly
    inherited: bool = False             # made by resuming(): the fields it was not given are the saved run's
    # -- logging
    log_dir: str = "runs"               # metrics.jsonl and metrics.png
    plot: bool = True                   # draw metrics.png at the end (a second of CPU: matplotlib)
    tensorboard: bool = False           # also TensorBoard scalars in log_dir
    profile: str | None = None          # a folder for a torch.profiler record of a few updates (rank 0)
    profile_from: int = 20              # --profile: updates left out first (compilation, graph capture)
    profile_updates: int = 5            # --profile: updates recorded
    # -- failures
    max_restarts: int = 0               # worker deaths or hangs survived
    heal: str | None = None             # "on" (the default with max_restarts) or "off": restart instead
    # -- decided by the checks (resolve(), rank 0's check_inputs) before any worker trains, not set by users
    workers: int = 0                    # how many workers the run has
    samples: int = 0                    # training samples (after the validation split)
    classes: list = field(default_factory=list)     # the training data's class names (none: it names none)
    heal_in_place: bool = False         # a dead worker is healed from the survivors (else restart)
    # a resume's updates of its finished epochs beyond what they count now (--cpu-workers, --batch-size or
    # --grad-accum changed at an epoch's end): --epochs counts the epochs left in this run's updates
    update_offset: int = 0

    @property
    def outer(self) -> bool:
        """Whether param mode runs the outer optimizer (harness/collectives/outer.py) rather than plain
        averaging (harness/collectives/sync.py's ParameterAveraging, which heals in place)."""
        return self.mode == "async" or self.mode == "param" and (self.outer_optimizer != "average" or self.fragments > 1 or self.outer_delay > 0
                                         or self.outer_dtype != "fp32" or self.outer_lr not in (None, 1.0))

    def steps_per_epoch(self) -> int:
        """Each worker's updates an epoch, as the checks count them (``samples`` filled in: a checked config)."""
        return self.samples // self.workers // (self.batch_size * self.grad_accum)

    def total_updates(self, steps_per_epoch: int) -> int:
        """The run's updates (each worker's; --mode async: the budget per worker): --max-steps, else --epochs' worth."""
        return self.max_steps or self.update_offset + self.epochs * steps_per_epoch

    def to_dict(self) -> dict[str, Any]:
        """Plain types, as a checkpoint stores them (not ``inherited``: a resume of it is made by ``resuming``)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "inherited"}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainConfig:
        """The config a checkpoint stored; keys of older checkpoints that no longer exist are dropped
        and fields they lack take their defaults (the old ``heal`` was the decision, a bool)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in saved.items() if k in known}
        if isinstance(values.get("heal"), bool):
            values["heal_in_place"] = values.pop("heal")
        return cls(**values)

    @classmethod
    def resuming(cls, resume: str, **changes: Any) -> TrainConfig:
        """The config to continue the run saved at ``resume``: the saved run's fields (model, data,
        optimizer, schedule, length, ...) with ``changes`` over them; what ``resolve`` decides and the
        loader count (this machine's) are decided again. ``epochs`` without ``max_steps`` lengthens a run
        that was given --max-steps (which would override it) to that many epochs. A change that a resume cannot
        take is refused by the checks (harness/training/checks.py), naming it."""
        from harness.resilience.saved_config import CheckpointError, read_config
        try:
            saved = cls.from_dict(read_config(resume))
        except CheckpointError as e:
            raise ConfigError(f"--resume: {e}") from None
        fixed = [name for name in FIXED_ON_RESUME if name in changes and changes[name] != getattr(saved, name)]
        if fixed:
            raise ConfigError(f"--resume {resume} continues a run of " + ", ".join(
                f"--{name.replace('_', '-')} {getattr(saved, name)!r}" for name in fixed) + "; drop " + ", ".join(
                f"--{name.replace('_', '-')}" for name in fixed) + " (or start a new run without --resume)")
        again = DECIDED_AGAIN + (SYNCHRONISATION if (changes.get("mode", saved.mode) == "grad") != (saved.mode == "grad")
                                 else ())
        fresh = {name: getattr(cls(), name) for name in again}
        if "epochs" in changes and "max_steps" not in changes:      # the run is measured in epochs from now on
            changes = {**changes, "max_steps": None}
        continued = rebased(saved, resume)
        if "save" not in changes:
            refuse_a_copy(continued, resume)
        return dataclasses.replace(continued, **{**fresh, "resume": resume, **changes, "inherited": True})

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def check_types(self) -> None:
        """A ConfigError naming the first field whose value is not of its annotated type: a config built in Python
        (Train.py's flags are typed by argparse) fails here, in one line, not in a worker later."""
        for f in dataclasses.fields(self):
            names = [name.strip() for name in f.type.split("|")]
            value = getattr(self, f.name)
            allowed = tuple(kind for name in names for kind in TYPES[name])
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                raise ConfigError(f"TrainConfig {f.name}={value!r} is {type(value).__name__}, not {' or '.join(names)}"
                                  + _how_to_give(f.name, value, names))


def _refuse_unknown_fields(init: Callable[..., None]) -> Callable[..., None]:
    """``TrainConfig(lr_shedule=...)`` (and ``replace``, ``resuming``) as a ConfigError naming the closest field,
    not Python's TypeError "unexpected keyword argument", which names no field that exists."""
    @functools.wraps(init)
    def checked(self: TrainConfig, *args: Any, **values: Any) -> None:
        names = [f.name for f in dataclasses.fields(TrainConfig)]
        for key in values:
            if key not in names:
                raise ConfigError(f"TrainConfig has no field {key!r}{did_you_mean(key, names)}; its fields are "
                                  "Train.py's flags with '_' for '-' (python Train.py --help)")
        init(self, *args, **values)
    return checked


TrainConfig.__init__ = _refuse_unknown_fields(TrainConfig.__init__)
