"""A dead worker need not end the run: heal the group in place, or restart it from the last checkpoint.

``Recovery`` holds the run's budget, ``--max-restarts N`` failures survived, and spends it two ways:

- ``heal(kids, failure)``: the parent's side of healing in place (harness/resilience/heal.py is the workers'
  side). The group was forked with ``heal=True``, so the survivors are still alive with their
  replicas; a replacement is started for the dead rank (``Children.replace``) and the survivors
  hand it their state. The workers' "healed" report ends the heal (``healed`` turns it into the
  log's "recovered" record: rank, cause, seconds from the failure to training again, the step
  redone). Healing is refused, and the failure raised, when it is off, when the budget is spent,
  or when another failure comes while a heal is under way: a group that broke while mending
  itself is restarted from the checkpoint instead. When the dead rank's host is lost (``HostLost``: a
  node agent fell silent), no replacement can start: a survivor saves what it holds (``Children.salvage``;
  the workers' "saved" record, or "not_saved" and why) and ``HostLost`` ends the run, for the engine that
  started it to restart it from that checkpoint.
- ``run(attempt)``: calls ``attempt(resume)`` and, when a worker dies or stops responding
  (``ChildFailed``, the group stopped), calls it again with ``resume`` the last checkpoint this run
  wrote. A resume is exact (harness/training/loop.py), so what is lost is the
  updates since that checkpoint: save often (``--save-every-steps``; harness/resilience/saver.py writes in the
  background) and little is. The new group's first update ends the restart (``restarted``: the log's
  "restarted" record, with the seconds from the "restart" record to training again). Not once the run has been asked to stop (SIGINT, SIGTERM): a new group would only be
  stopped again, or die of the signal forwarded before its handlers are in, so the failure ends the run as a stop
  (``Interrupted``) at the last checkpoint.

Only deaths and hangs are survived. An exception in the training code (``ChildError``) would
most likely be raised again by the same code on the same data, so it ends the run at once.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from harness.control.errors import HostLost
from harness.parent import ChildFailed, Children
from harness.resilience.interrupt import Interrupted

T = TypeVar("T")


class GaveUp(RuntimeError):
    """Workers died more often than ``max_restarts`` allows; carries the last failure."""

    def __init__(self, failure: ChildFailed, restarts: int):
        self.failure = failure
        super().__init__(f"{failure}\n(gave up after {restarts} restart{'s' * (restarts != 1)}: "
                         f"raise --max-restarts to allow more)")


def spend(failure: ChildFailed, used: int, limit: int) -> int:
    """``used + 1``: one more failure survived. Raises ``failure`` when ``used`` is ``limit`` already (as ``GaveUp``
    where restarts were allowed at all)."""
    if used == limit:
        if limit:
            raise GaveUp(failure, limit) from failure
        raise failure
    return used + 1


def restart_record(failure: ChildFailed, restart: int, limit: int, resume: str | None) -> dict:
    """The log's "restart" record: the group is started again (``restart`` of ``limit``) from ``resume``."""
    return {"event": "restart", "restart": restart, "max_restarts": limit, "rank": failure.rank,
            "cause": failure.reason, "resume": resume}


class Recovery:
    """Args:
        limit: how many failures the run survives (``--max-restarts``).
        heals_in_place: a failure is healed in place while the budget lasts (else the group restarts).
        resume: the checkpoint the run started from, if any (where a restart goes before any save).
        last_saved: returns the last checkpoint the run wrote, if any.
        report: where restart records go (the metrics log).
        stopping: returns the signal that asked the run to stop, if one did (then a failure is not restarted).
        used: failures the run survived already, before training (while its inputs were checked)."""

    def __init__(self, limit: int, heals_in_place: bool, resume: str | None,
                 last_saved: Callable[[], str | None], report: Callable[[dict], None],
                 stopping: Callable[[], int | None] = lambda: None, used: int = 0):
        self.limit, self.heals_in_place = limit, heals_in_place
        self.used = used
        self._resume, self._last_saved, self._report, self._stopping = resume, last_saved, report, stopping
        self._healing: tuple[ChildFailed, float] | None = None     # the failure being healed, and when
        self._restarting: float | None = None      # when the group was last restarted, until its first update
        self._unhealed: str | None = None       # why the last failure was not healed in place

    def run(self, attempt: Callable[[str | None], T]) -> T:
        """``attempt(resume)``, restarted from the last checkpoint (or the run's own starting point, when
        it has saved nothing yet) after each ``ChildFailed`` while the budget lasts, unless the run was asked to
        stop (then ``Interrupted``)."""
        resume = self._resume
        while True:
            try:
                return attempt(resume)
            except ChildFailed as failure:
                self._healing = None
                signum = self._stopping()
                if signum:
                    last = self._last_saved() or self._resume
                    raise Interrupted(signum, f"rank {failure.rank} {failure.reason} during the stop; the last "
                                              f"checkpoint: {last or 'none'}") from failure
                self.used = spend(failure, self.used, self.limit)
                resume = self._last_saved() or self._resume
                self._report({**restart_record(failure, self.used, self.limit, resume),
                              **({"not_healed": self._unhealed} if self._unhealed else {})})
                self._unhealed, self._restarting = None, time.monotonic()

    def heal(self, kids: Children, failure: ChildFailed, unhealable: str | None = None) -> None:
        """Replace the failed rank and let the survivors heal it; raises ``failure`` (the group
        stopped, so ``run`` restarts it) when healing is off, the budget spent, a heal under way, or the running
        code says why this failure cannot be healed in place (``unhealable``: the parameter server's ``lose``)."""
        if not self.heals_in_place or self.used == self.limit or self._healing is not None or unhealable:
            if self.heals_in_place and self._healing is not None:
                first, since = self._healing
                self._unhealed = (f"it came {time.monotonic() - since:.1f} s into the heal of rank {first.rank} "
                                  f"({first.reason})")
            elif self.heals_in_place and unhealable:
                self._unhealed = unhealable
            kids.stop(grace=1.0)
            raise failure
        self.used += 1
        self._healing = (failure, time.monotonic())
        try:
            kids.replace(failure.rank)
        except ChildFailed as error:      # the replacement's failure, with the first one's cause: both go to the user
            self._unhealed = f"the replacement failed: rank {error.rank} {error.reason}"
            kids.stop(grace=1.0)
            raise ChildFailed(error.rank, f"{error.reason} as it replaced the worker that {failure.reason}",
                              error.stderr_tail, error.host) from error
        except HostLost:        # no child can start there: a survivor saves what it holds, for the engine's restart
            for record in kids.salvage(failure.rank, lambda sent: sent.get("event") in ("saved", "not_saved")):
                self._report(record)
            raise

    def restarted(self, first_step: dict) -> dict | None:
        """The log's "restarted" record where ``first_step`` (a group's "first_step" record) is the first update of
        a group that replaced a failed one; None for the run's first group."""
        if self._restarting is None:
            return None
        since, self._restarting = self._restarting, None
        return {"event": "restarted", "restart": self.used, "max_restarts": self.limit, "step": first_step["step"],
                "seconds": time.monotonic() - since}

    def healed(self, record: dict) -> dict:
        """The workers' "healed" report as the log's "recovered" record."""
        failure, since = self._healing
        self._healing = None
        return {"event": "recovered", "rank": failure.rank, "cause": failure.reason,
                "seconds": time.monotonic() - since, "redo_step": record["step"] + 1, "restart": self.used,
                "max_restarts": self.limit, **{k: v for k, v in record.items() if k != "event"}}
