"""Atomic checkpoint files that either load completely or fail with a message naming the file."""

import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from harness.resilience.lock import alive
from harness.resilience.saved_config import CheckpointError


REQUIRED_KEYS = ("model", "optimizer", "epoch", "step", "config")
_PLAIN_SCALARS = (str, int, float, bool, type(None))


def layout(model: dict, optimizer: dict | None, where: Any, rng: list, loss_scale: list | None, ranks: list | None,
           config: dict) -> dict:
    """A checkpoint's contents: the ``model``'s state, rank 0's ``optimizer`` state (unsharded), ``where`` the run
    stands (harness/resilience/heal.py's Where: epoch, update, position in the epoch, early stopping, the epoch's
    loss so far), every rank's
    random generators and loss scale, every rank's own part (``ranks``: param and async modes) and the ``config``.
    Written by rank 0 (harness/training/loop_save.py) or, in async mode, by the parent from the parts the workers sent
    (harness/resilience/gathered.py)."""
    return {"model": model, "optimizer": optimizer, "epoch": where.epoch, "step": where.step,
            "position": where.position, "epoch_so_far": tuple(where.so_far), "rng": rng,
            "early_stop": (where.best_error, where.stale),
            "loss_scale": loss_scale, "ranks": ranks, "config": config}


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write state to path (``write_atomically``) once it is known to load again."""
    path = Path(path)
    _check_state(path, state)
    write_atomically(path, state)


def write_atomically(path: Path, obj: object) -> None:
    """``torch.save`` obj to path so that readers see either the previous file or the complete new one.

    The data goes to a temp file in the same directory (os.replace is only atomic within one file
    system), is fsynced before the rename so the rename cannot overtake the data, and the directory is
    fsynced after it so the rename itself survives a power cut. The temp file is removed on any failure;
    a writer killed mid-write cannot remove its own, so a successful write removes what dead writers
    left of this path. The temp file's name carries its writer's pid: another live process's write in
    progress is never touched (one run writes one path at a time: harness/resilience/saver.py, and a
    second run is refused the path: harness/resilience/lock.py).
    """
    prefix = f".{path.name}."
    path.parent.mkdir(parents=True, exist_ok=True)      # rank 0 on another host than the parent, whose lock made it
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    for name in os.listdir(path.parent):
        if name.startswith(prefix) and name.endswith(".tmp") and not _writer_alive(name[len(prefix):]):
            (path.parent / name).unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _writer_alive(rest: str) -> bool:
    """Whether the process that named a temp file ``<pid>.<random>.tmp`` still runs (this one's own
    finished write is gone already); names without a pid are an older writer's, long dead."""
    pid = rest.split(".", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and alive(int(pid))


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by save_checkpoint.

    weights_only=True refuses arbitrary pickled objects, which is why save_checkpoint insists on a
    plain config. The file is memory-mapped: a tensor is read when it is used, so a reader that needs
    a part (the parent's checks, a rank its own part of every rank's) holds no more than that part.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a file; check the path")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception as error:  # torch.load raises many types for garbage, truncation and bad pickles
        pickled = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if pickled:
            raise CheckpointError(f"checkpoint {path} holds pickled objects ({pickled[1]}: a whole model saved with "
                                  f"torch.save(model)?), not a checkpoint of Train.py's, which holds state dicts and "
                                  f"the run's config; give one Train.py wrote (--save)") from None
        raise CheckpointError(
            f"checkpoint {path} is not a readable checkpoint (truncated, corrupt or not written by "
            f"torch.save): {_reason(error)}"
        ) from error
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict")
    _check_keys(path, state)
    return state


class ModelMismatch(ValueError):
    """A checkpoint's model state does not fit the model its config builds now (``load_model_state``)."""

    def sentence(self, what: str, model: str) -> str:
        """The one line that says so: ``what`` (the checkpoint, ``--resume PATH``) and the --model it was tried on."""
        return (f"{what} does not fit --model {model} as it builds now: {self}; it was trained with other model "
                "code or --model-options")


def load_model_state(model: torch.nn.Module, saved: dict[str, Any]) -> None:
    """``model.load_state_dict(saved)``, or ModelMismatch saying in one phrase where the checkpoint does not fit
    the model as it builds now (its code or options changed since it was trained). On the meta device it loads
    nothing and checks the same: each module's own loading decides what fits (an extra state may change shape)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # a meta model's "copying ... is a no-op": the point of checking there
            model.load_state_dict(saved)
    except RuntimeError as error:
        details = [line.strip() for line in str(error).splitlines()[1:] if line.strip()] or [str(error).strip()]
        raise ModelMismatch(details[0] + (f" (and {len(details) - 1} more)" if len(details) > 1 else "")) from None


def _check_state(path: Path, state: dict) -> None:
    """Reject at save time what load_checkpoint would reject, so a bad checkpoint is never written."""
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: state is a {type(state).__name__}, expected a dict")
    _check_keys(path, state)
    _check_plain(path, state["config"], "config")


def _check_keys(path: Path, state: dict) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks required keys {missing}; it needs all of {REQUIRED_KEYS}"
                              + (" (a model's bare state_dict? give a checkpoint Train.py wrote: --save)"
                                 if len(missing) == len(REQUIRED_KEYS) else ""))


def _check_plain(path: Path, value: object, where: str) -> None:
    # Exact types: subclasses such as numpy.float64, enums or namedtuples are pickled as their own
    # class, which weights_only=True refuses to load.
    if type(value) in _PLAIN_SCALARS:
        return
    if type(value) in (list, tuple):
        for index, item in enumerate(value):
            _check_plain(path, item, f"{where}[{index}]")
    elif type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise CheckpointError(f"checkpoint {path}: {where} has non-str key {key!r}; use str keys")
            _check_plain(path, item, f"{where}[{key!r}]")
    else:
        raise CheckpointError(
            f"checkpoint {path}: {where} is a {type(value).__name__}; configs may hold only "
            "str/int/float/bool/None/list/tuple/dict (convert it, e.g. str(path))"
        )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state(device: torch.device) -> dict:
    """This process's random generators (CPU, and the device's), for a checkpoint that resumes mid-epoch."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """``state`` as rng_state made it; a checkpoint loaded onto a GPU brings its tensors there too."""
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _reason(error: Exception) -> str:
    """torch.load's error in one line: for a file it cannot unpickle safely, torch wraps the cause
    ("Unsupported operand 110") in a paragraph about ``weights_only``, which is beside the point."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    return " ".join(text.split()) or type(error).__name__


def to_host(value: object) -> object:
    """``value`` with every tensor in it copied to the host (dicts, lists and tuples followed), as a
    worker's state travels to rank 0 for a checkpoint (the parent, which relays it, never touches CUDA)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value
