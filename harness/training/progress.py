"""The parent's view of a run: a tqdm bar, Train.lua-style epoch lines, and the metrics log.

Rank 0 sends records (harness/training/loop.py); every record goes to metrics.jsonl as it comes,
and the ones a person watches (epochs, heals, restarts) are also printed above the bar. Where stderr is
not a terminal (a log file, a batch job's output) the bar is a line every ``LINE_EVERY`` seconds instead:
tqdm's redraws, one at every report and another after every printed line, would fill the file.
"""
from __future__ import annotations

import sys
import threading
import time

from harness.training.config import TrainConfig
from harness.training.metrics import MetricsLog

LINE_EVERY = 30.0       # seconds between progress lines where stderr is not a terminal


class Progress:
    """``steps_per_epoch``: updates in an epoch; ``log``: where every record goes. ``handle`` runs on
    the main thread and ``silent`` on the group's housekeeping thread, so both hold one lock."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int, log: MetricsLog):
        self.config, self.log = config, log
        self.lock = threading.Lock()
        self.total = config.total_updates(steps_per_epoch)
        self.epochs = -(-self.total // steps_per_epoch) if config.max_steps else config.epochs
        self.bar = None      # made at the first report, so the workers' start-up does not count as a slow update
        self.last_saved: dict | None = None     # the "saved" record of the last checkpoint this run wrote
        # --mode async: the server has one worker validate when the updates of all come due, not at rank 0's
        # epochs, so each validation is a line of its own and the epoch lines say the training loss alone
        self.apart = config.mode == "async"

    @property
    def saved(self) -> str | None:
        """The last checkpoint this run wrote."""
        return self.last_saved["path"] if self.last_saved else None

    def silent(self, rank: int, seconds: float | None) -> None:
        """A worker silent for a third of the heartbeat timeout (``seconds``), or heard again (None)."""
        from tqdm import tqdm
        timeout = self.config.heartbeat_timeout
        with self.lock:
            self.log.write({"time": time.time(), "event": "silent" if seconds is not None else "heard", "rank": rank,
                            **({"seconds": seconds, "timeout": timeout} if seconds is not None else {})})
            tqdm.write(f"rank {rank} has been silent for {seconds:.0f} s (it counts as hung at {timeout:.0f} s)"
                       if seconds is not None else f"rank {rank} is heard again")
            if self.bar is not None:
                self.bar.set_postfix_str(f"rank {rank} silent" if seconds is not None else "")

    def handle(self, record: dict) -> None:
        with self.lock:
            self._handle(record)

    def _handle(self, record: dict) -> None:
        from tqdm import tqdm
        event = record["event"]
        self.log.write({"time": time.time(), **record})
        if "step" in record:
            if self.bar is None:
                self.bar = tqdm(total=self.total, initial=record["step"], unit="update", dynamic_ncols=True) \
                    if sys.stderr.isatty() else Lines(self.total, record["step"])
            self.bar.update(record["step"] - self.bar.n)
        if event == "step":
            self.bar.set_description(f"epoch {record['epoch'] + 1}/{self.epochs}")
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:.0f}")
        elif event == "epoch":
            self.bar.set_description(f"epoch {record['epoch']}/{self.epochs}")
            validated = validation_words(record) if not self.apart else None
            tqdm.write(f"Epoch {record['epoch']}/{self.epochs}: average loss per sample "
                       f"{record['train_loss']:.4f}" + (f", {validated}" if validated else "")
                       + f" ({record['seconds']:.1f} s)")
        elif event == "validation" and (record.get("epoch_end") is False or self.apart):   # no epoch's line says it
            validated = validation_words(record)
            if validated:
                tqdm.write(f"Update {record['step']}: {validated}")
        elif event == "saved":
            self.last_saved = record
            if record.get("salvaged"):
                tqdm.write(f"a host was lost: a survivor saved update {record['step']} to {record['path']}, "
                           "which the run resumes from when it is started again")
        elif event == "not_saved":
            tqdm.write(f"a host was lost: nothing saved since the last checkpoint ({record['why']})")
        elif event in ("recovered", "restart", "restarted"):
            tqdm.write(describe_recovery(record))
        elif event == "done" and record["stop"] and not record.get("signal"):    # Train.py says where it stopped
            tqdm.write(f"Stopped early after epoch {record['epoch']}: {record['stop']}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Lines:
    """What the bar shows, as a line on stderr at the first report of the loss and then at most every ``every``
    seconds (the part of tqdm's interface that Progress uses; a report sets the loss after the update count)."""

    def __init__(self, total: int, initial: int, every: float = LINE_EVERY):
        self.total, self.n, self.every = total, initial, every
        self.description, self.postfix, self.shown = "", "", -float("inf")

    def update(self, count: int) -> None:
        self.n += count

    def set_description(self, text: str) -> None:
        self.description = text

    def set_postfix(self, **values: object) -> None:
        self.postfix = ", ".join(f"{name}={value}" for name, value in values.items())
        if time.monotonic() - self.shown >= self.every:
            self.shown = time.monotonic()
            said = ", ".join(part for part in (self.description, self.postfix) if part)
            print(f"update {self.n}/{self.total}: {said}", file=sys.stderr, flush=True)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


def validation_words(record: dict) -> str:
    """"validation error 3.61%", or the loss where nothing was classified; "" where the record has neither."""
    val, val_loss = record.get("val_error"), record.get("val_loss")
    return (f"validation error {val:.2%}" if val is not None else
            f"validation loss {val_loss:.4f}" if val_loss is not None else "")


def describe_recovery(record: dict) -> str:
    """The console line of a "recovered" (healed in place), "restart" or "restarted" record."""
    if record["event"] == "restarted":
        return f"training again {record['seconds']:.1f} s after restart {record['restart']}, at update {record['step']}"
    if record["event"] == "recovered":
        return (f"rank {record['rank']} ({record['cause']}) recovered in {record['seconds']:.1f} s, redoing "
                f"step {record['redo_step']}" + (" (every worker back to the anchor of its last sync)"
                                                 if record.get("back_to_anchor") else
                                                 " (parameters: the survivors' average)" if record["mode"] == "param"
                                                 else ""))
    unhealed = f"; not healed in place: {record['not_healed']}" if "not_healed" in record else ""
    return (f"rank {record['rank']} ({record['cause']}{unhealed}): restarting every worker from "
            f"{record['resume'] or 'the start'} (restart {record['restart']} of {record['max_restarts']})")
