"""How a call fails: the parent's two errors and the worker's one.

In the parent, ``ChildError``: the code a child ran raised; the child's traceback comes with it.
``ChildFailed``: a child died or stopped responding; the rank, why, its host and the last lines of
its stderr come with it. Both are raised by the group's supervision (harness/control/supervise.py).
``HostLost``: a dead child's host is gone, so no child can take its place (a launcher raises it).
In a child, ``PeerFailed``: another child failed, so the running function's wait (a join, a
receive, an exchange) is ended instead of lasting forever (harness/control/serve.py).
They live here because the control plane raises them; users import them from the API
(``from harness import ChildError, ChildFailed, PeerFailed``; harness/parent.py, harness/child.py).
"""
from __future__ import annotations

from typing import Sequence


class ChildError(RuntimeError):
    """An exception raised by the code a child ran; carries the rank and the child's traceback."""

    def __init__(self, rank: int, traceback_text: str):
        self.rank, self.traceback = rank, traceback_text
        last = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "unknown error"
        # "package.module.Class: message": the exception's class (its module's path) and its message
        self.raised, _, self.message = last.partition(": ")
        super().__init__(f"child {rank} raised {last}\n--- child {rank} traceback ---\n{traceback_text.rstrip()}")


class ChildFailed(RuntimeError):
    """A child died or stopped responding; the rest of its group has been stopped."""

    def __init__(self, rank: int, reason: str, stderr_tail: Sequence[str] = (), host: str | None = None):
        self.rank, self.reason, self.stderr_tail, self.host = rank, reason, list(stderr_tail), host
        tail = "".join(f"\n  | {line}" for line in self.stderr_tail) or "\n  (no stderr output)"
        where = f" on host {host}" if host else ""
        super().__init__(f"child {rank}{where} {reason}; last lines of its stderr:{tail}")


class PeerFailed(RuntimeError):
    """Raised in a child when another child of its group failed, so it cannot be waiting forever."""


class HostLost(RuntimeError):
    """The host a child ran on is gone (a node agent fell silent: harness/launch/agents.py raises NodeLost): nothing
    can be started there, so a dead child there cannot be replaced."""
