"""Training metrics as a JSON-lines log, and a plot of it."""

import importlib
import json
import os
import pathlib
import threading

PLOT_MODULES = ("matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker")


class MetricsLog:
    """Metrics as JSON lines in the log dir (one record per line, flushed each write so a crash loses
    nothing), and a PNG plot at the end like the old Lua optim.Logger plot.

    The file is opened for appending, so a resumed run continues the same log.
    """

    def __init__(self, log_dir: str | os.PathLike):
        self.path = pathlib.Path(log_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        """Append one record as a single line; tensors and numpy values are stored as numbers/lists."""
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


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
    would otherwise only wait for its workers. Not a daemon: an exit waits for the import to end
    rather than tearing the interpreter down under it."""
    thread = threading.Thread(target=lambda: [importlib.import_module(m) for m in PLOT_MODULES],
                              name="import-matplotlib")
    thread.start()
    return thread


def plot_metrics(records: list[dict], png_path: str | os.PathLike) -> pathlib.Path | None:
    """Plot training loss and validation error per epoch in two panels; None if there are no epoch records.

    When an epoch appears more than once (a resumed run repeating epochs after its last checkpoint), the
    last record wins, as it belongs to the run that carried on.
    """
    by_epoch = {record["epoch"]: record for record in records if record.get("event") == "epoch"}
    if not by_epoch:
        return None
    # Figure + Agg canvas rather than pyplot: no global backend switch, no figure left open.
    from matplotlib.backends.backend_agg import FigureCanvasAgg     # PLOT_MODULES
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = sorted(by_epoch)
    val_epochs = [epoch for epoch in epochs if by_epoch[epoch].get("val_error") is not None]
    figure = Figure(figsize=(7, 6))
    FigureCanvasAgg(figure)
    loss_axes, error_axes = figure.subplots(2, 1, sharex=True)
    loss_axes.plot(epochs, [by_epoch[epoch]["train_loss"] for epoch in epochs], marker="o")
    loss_axes.set_ylabel("training loss")
    error_axes.plot(val_epochs, [by_epoch[epoch]["val_error"] for epoch in val_epochs], marker="o", color="tab:red")
    error_axes.set_ylabel("validation error")
    error_axes.set_xlabel("epoch")
    error_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in (loss_axes, error_axes):
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
