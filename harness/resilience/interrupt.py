"""Ctrl-C and SIGTERM: the run stops at a step every rank agrees on, saves, and exits cleanly.

A signal reaches processes at different moments: the terminal sends Ctrl-C's SIGINT to the whole
process group, ``kill`` or a scheduler's preemption notice often only to the parent. So:

- the parent (``Interrupts``) catches SIGINT and SIGTERM, says in one line what happens next, and
  forwards the signal to every child; a second signal, or one before there are children to
  forward it to, raises ``Interrupted`` at once (``with Parent()`` then stops the children);
- a child never dies of these signals: it records them as ``ctx.interrupted`` (harness/child.py);
- the training loop asks ``StopVote`` after each update. A rank that stopped on its own would leave
  the others waiting in a collective, so every ``EVERY`` updates each rank all-reduces (max) its
  flag, and reads the vote cast ``EVERY`` updates earlier. Every rank reads the same vote at the
  same step, and by then it has long been computed: on a GPU reading it waits for nothing.

Once the run is over, ``finished`` makes a late signal exit with the run's status rather than kill the
parent (Train.py's last step).

Only StopVote needs torch, and imports it itself: the parent of Train.py must not wait for torch
before it starts its workers.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM that stops the run at once, without a checkpoint.

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the parent's main thread happens to be,
    and the ``except Exception`` there guards other work (decoding a child's message, a service's answer), whose
    failure it would be taken for."""

    def __init__(self, signum: int, when: str):
        self.signum = signum
        super().__init__(f"stopped at once by {signal.Signals(signum).name} ({when})")


class Interrupts:
    """``with Interrupts() as caught:`` the parent's handlers for SIGINT and SIGTERM
    while a run lasts. ``caught.signum`` is the first signal (None if none came); ``watch(children)``
    forwards it, and any later first signal, to a group forked after the handlers were installed."""

    def __init__(self, notice: str = "finishing the current update, saving, then stopping"):
        self.signum: int | None = None
        self._notice = notice
        self._children: Any = None
        self._previous: dict[int, Any] = {}

    def watch(self, children: Any) -> None:
        self._children = children
        if self.signum is not None:
            children.signal(self.signum)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum, "the second signal")
        if self._children is None:
            raise Interrupted(signum, "before training started")
        self.signum = signum
        # os.write, not print: a handler may run while the main thread is inside a print.
        os.write(2, f"\n{signal.Signals(signum).name}: {self._notice} (press Ctrl-C again to stop at once)\n".encode())
        if self._children is not None:
            self._children.signal(signum)

    def __enter__(self) -> "Interrupts":
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def finished(status: int) -> int:
    """The run is over, its work saved and its workers gone: a SIGINT or SIGTERM from here on (the
    interpreter's shutdown can take a while) ends this process at once with the run's ``status``, not
    killed by the signal, which would tell a scheduler the work was lost."""
    def leave(_signum: int, _frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, RuntimeError, ValueError):     # RuntimeError: the signal came inside a write
                pass
        os._exit(status)
    for sig in SIGNALS:
        signal.signal(sig, leave)
    return status


class StopVote:
    """``poll(step, loss)`` after each update: (the signal number every rank agreed to stop for, else 0;
    whether some rank's loss was not finite). The second flag rides on the same all-reduce: a diverged
    run stops within 2 x EVERY updates, with no synchronisation of its own."""

    EVERY = 4

    def __init__(self, ctx: Any, comm: Any, device: torch.device):
        import torch
        self._ctx, self._comm = ctx, comm
        self._flag = torch.zeros(2, dtype=torch.int32, device=device)      # [signal, loss not finite]
        cuda = device.type == "cuda"
        self._host = torch.zeros(2, dtype=torch.int32, pin_memory=True) if cuda else self._flag
        self._cast = torch.cuda.Event() if cuda else None
        self._pending = False

    def poll(self, step: int, loss: torch.Tensor) -> tuple[int, bool]:
        import torch
        if step % self.EVERY:
            return 0, False
        agreed, diverged = 0, False
        if self._pending:
            if self._cast is not None:
                self._cast.synchronize()
            agreed, diverged = int(self._host[0]), bool(self._host[1])
        self._flag[0].fill_(self._ctx.interrupted or 0)
        torch.logical_not(torch.isfinite(loss), out=self._flag[1])
        self._comm.all_reduce(self._flag, "max")
        if self._cast is not None:
            self._host.copy_(self._flag, non_blocking=True)
            self._cast.record()
        self._pending = True
        return agreed, diverged

    def bad_samples(self) -> None:
        """Nothing: the ranks gather their bad samples (harness/data/bad_samples.py's Tally) and so decide the
        same stop at the same update."""
