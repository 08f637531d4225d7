"""Training metrics as a JSON-lines log, and a plot of it."""

import json
import os
import pathlib
import threading
import time
from dataclasses import dataclass

from harness.training.imports import import_meanwhile

SCALAR_SKIP = ("time", "step", "epoch")      # the x axis and bookkeeping, not curves
PLOT_MODULES = ("matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker")


class MetricsLog:
    """Metrics as JSON lines in the log dir (one record per line, flushed each write so a crash loses
    nothing), and a PNG plot at the end like the old Lua optim.Logger plot.

    The file is opened for appending, so a resumed run continues the same log; each run begins its part with a
    "run" record (``resume``: the checkpoint it continues, or None for a fresh start). With ``tensorboard``
    every record's numbers also go to TensorBoard event files in the same directory, as scalars
    named ``event/field`` (``step/loss``, ``epoch/val_error``, ...) at the record's update.
    """

    def __init__(self, log_dir: str | os.PathLike, tensorboard: bool = False):
        self.path = pathlib.Path(log_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._board = None
        if tensorboard:
            self._board = Board(log_dir)

    def write(self, record: dict) -> None:
        """Append one record as a single line; tensors and numpy values are stored as numbers/lists."""
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        if self._board is not None and "step" in record:
            for key, value in record.items():
                if key not in SCALAR_SKIP and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._board.add_scalar(f"{record['event']}/{key}", value, record["step"], record.get("time"))

    def close(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class Board:
    """TensorBoard scalars written with the tensorboard package's own event writer: torch's SummaryWriter wraps the
    same writer, and would make Train.py's parent import torch (2 s and more before the workers start)."""

    def __init__(self, log_dir: str | os.PathLike):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._writer, self._event, self._summary = EventFileWriter(str(log_dir)), Event, Summary

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
        self._writer.add_event(self._event(wall_time=wall_time or time.time(), step=step, summary=summary))

    def close(self) -> None:
        self._writer.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Every record in a metrics.jsonl file, in the order written."""
    records = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number} is not a JSON record ({error}); fix or delete that line") from error
    return records


def import_plotting_meanwhile() -> threading.Thread:
    """Start importing what plot_metrics needs (most of its second) in a thread, for a parent that
    would otherwise only wait for its workers."""
    return import_meanwhile(PLOT_MODULES, "import-matplotlib")


@dataclass
class Curves:
    """What the plot draws: ``(x, y)`` pairs of lists for each panel, and the x axis's name."""

    x_name: str
    loss: tuple[list, list]
    validation: tuple[list, list]
    validation_name: str
    lr: tuple[list, list]


def curves(records: list[dict]) -> Curves | None:
    """The last fresh run's curves (from its "run" record on: the runs that resumed it are its own), where earlier
    runs wrote to the same log. Per epoch where an epoch ended (a resumed run's repeated epoch: the last record wins,
    as it belongs to the run that carried on); per update for a run that ended within its first epoch (its
    "first_step", "step" and "validation" records); None if there is neither. The validation panel shows the error,
    else the loss (nothing classified)."""
    fresh = [i for i, r in enumerate(records) if r.get("event") == "run" and not r.get("resume")]
    records = records[fresh[-1]:] if fresh else records
    by_epoch = {r["epoch"]: r for r in records if r.get("event") == "epoch"}
    rows = [by_epoch[epoch] for epoch in sorted(by_epoch)]
    x_name, loss_key, x_key = "epoch", "train_loss", "epoch"
    validations = rows
    if not rows:
        rows = [r for r in records if r.get("event") in ("first_step", "step") and "loss" in r]
        validations = [r for r in records if r.get("event") == "validation"]
        x_name, loss_key, x_key = "update", "loss", "step"
    if not rows and not validations:
        return None
    key = "val_error" if any(r.get("val_error") is not None for r in validations) else "val_loss"

    def pairs(of: list[dict], name: str) -> tuple[list, list]:
        kept = [r for r in of if r.get(name) is not None]
        return [r[x_key] for r in kept], [r[name] for r in kept]
    return Curves(x_name, pairs(rows, loss_key), pairs(validations, key), key.replace("val_", "validation "),
                  pairs(rows, "lr"))


def plot_metrics(records: list[dict], png_path: str | os.PathLike) -> pathlib.Path | None:
    """Plot the training loss and the validation error (and the learning rate, where logged) in panels, per epoch
    or per update (``curves``); None if there is nothing to plot."""
    drawn = curves(records)
    if drawn is None:
        return None
    # Figure + Agg canvas rather than pyplot: no global backend switch, no figure left open.
    from matplotlib.backends.backend_agg import FigureCanvasAgg     # PLOT_MODULES
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with_lr = bool(drawn.lr[0])
    figure = Figure(figsize=(7, 8 if with_lr else 6))
    FigureCanvasAgg(figure)
    panels = figure.subplots(3 if with_lr else 2, 1, sharex=True)
    marker = "o" if drawn.x_name == "epoch" else "."
    panels[0].plot(*drawn.loss, marker=marker)
    panels[0].set_ylabel("training loss" if drawn.x_name == "epoch" else "training loss (its update)")
    panels[1].plot(*drawn.validation, marker="o", color="tab:red")
    panels[1].set_ylabel(drawn.validation_name)
    if with_lr:
        panels[2].plot(*drawn.lr, marker=marker, color="tab:green")
        panels[2].set_ylabel(f"learning rate ({'epoch' if drawn.x_name == 'epoch' else 'update'}'s end)")
    panels[-1].set_xlabel(drawn.x_name)
    panels[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in panels:
        axes.grid(True, alpha=0.3)
    figure.tight_layout()

    png_path = pathlib.Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, format="png")
    return png_path


def _jsonable(value: object) -> object:
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays/scalars, 0-d ones become plain numbers
        return value.tolist()
    raise TypeError(
        f"metrics value {value!r} of type {type(value).__name__} is not JSON serialisable; "
        "log a number, string, list or dict instead"
    )


def worker_memory_mb(pid: int | None = None) -> float | None:
    """Memory of a process and all its descendants (a training worker and its loader processes):
    the sum of their proportional set sizes, so pages they share (libraries, a forked parent's
    memory, a mapped file) count once. None where /proc cannot tell (not Linux)."""
    try:
        total_kb, todo = 0, [pid or os.getpid()]
        while todo:
            process = todo.pop()
            try:
                with open(f"/proc/{process}/smaps_rollup") as f:
                    total_kb += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
                for task in os.listdir(f"/proc/{process}/task"):
                    with open(f"/proc/{process}/task/{task}/children") as f:
                        todo += [int(child) for child in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue                    # a loader process that just exited
        return total_kb / 1024
    except (OSError, StopIteration):
        return None


def memory_usage(flat, sync, optimizers, device) -> dict:
    """What a worker holds for training, in MiB: parameters (the flat buffers), gradients (the flat
    buffers and a sharded synchroniser's pieces, staging and replica), optimizer state (the tensors of
    ``optimizers``, each storage once: --zero's replica has one of its own) and, on a GPU, the peak
    allocated so far (None on CPU). The "memory" record's per-rank entry (--zero shards the last three)."""
    import torch
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for optimizer in optimizers
                for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)}
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"param_mb": sum(t.nbytes for t in flat.params) / 2**20, "grad_mb": sync.gradient_bytes() / 2**20,
            "optimizer_mb": sum(storages.values()) / 2**20, "peak_mb": None if peak is None else peak / 2**20}
