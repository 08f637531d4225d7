"""A dead worker need not end the run: restart the whole group from the last checkpoint.

``with_restarts(run, config, ...)`` calls ``run(config)`` and, when a worker dies or stops
responding (``ChildFailed``: the parent has already stopped the rest of the group), calls it again
with ``config["resume"]`` pointing at the last checkpoint this run wrote, up to ``max_restarts``
times. A resume is exact (harness/train.py), so what is lost is the updates since that checkpoint:
save often (``--save-every-steps``; harness/saver.py writes in the background) and little is.

Only deaths and hangs are retried. An exception in the training code (``ChildError``) would
most likely be raised again by the same code on the same data, so it ends the run at once.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from .parent import ChildFailed

T = TypeVar("T")


class GaveUp(RuntimeError):
    """Workers died more often than ``max_restarts`` allows; carries the last failure."""

    def __init__(self, failure: ChildFailed, restarts: int):
        self.failure = failure
        super().__init__(f"{failure}\n(gave up after {restarts} restart{'s' * (restarts != 1)}: "
                         f"raise --max-restarts to allow more)")


def with_restarts(run: Callable[[dict], T], config: dict, last_saved: Callable[[], str | None],
                  report: Callable[[dict], None]) -> T:
    """``run(config)``, restarted from ``last_saved()`` (or the run's own starting point, when it has
    saved nothing yet) after each ``ChildFailed``, at most ``config["max_restarts"]`` times. Each
    restart is ``report``ed as an event record first."""
    limit, attempt, restarts = config["max_restarts"], config, 0
    while True:
        try:
            return run(attempt)
        except ChildFailed as failure:
            if restarts == limit:
                if limit:
                    raise GaveUp(failure, limit) from failure
                raise
            restarts += 1
            resume = last_saved() or config["resume"]
            report({"event": "restart", "restart": restarts, "max_restarts": limit, "rank": failure.rank,
                     "cause": failure.reason, "resume": resume})
            attempt = {**config, "resume": resume}
