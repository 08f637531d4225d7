"""Healing a group: a new child in a dead rank's place, in a new generation.

A group forked with ``heal=True`` is not stopped when a child fails (harness/control/supervise.py):
the survivors are told to abort their collectives and wait (``ctx.await_heal``). ``replace_rank``
then reaps the dead child and puts a new one in its place: the warm spare where there is one (it
has imported torch already; harness/control/spawn.py), else a fresh child started as that rank.
The new child joins the running exec, and the survivors get the heal notice ({"generation",
"replaced"}) they wait for. Each replacement starts a new *generation*: the replacement's identity
and every exchange tag carry it, so nothing of the broken generation is mistaken for the new one's.
What the ranks do then is the running code's business (harness/resilience/heal.py is Train.py's).

When the dead rank's host is lost (``HostLost``: no child can start there), ``salvage`` sends the survivors a
notice of another kind instead ({"generation", "salvage": the rank that is to write what it holds}), and
waits for that rank to say it did.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .errors import ChildFailed
from .spawn import ChildProcess
from .supervise import START_TIMEOUT, Supervisor


def replace_rank(group: Supervisor, rank: int) -> None:
    """Start a new child as ``rank`` (same GPU and environment), give it the running exec and send the
    survivors the heal notice. Raises ``ChildFailed`` (having stopped the group) if the new child does
    not connect, or if a survivor's exec has already ended: that group cannot be healed."""
    old = group.children[rank]
    _reap(old)
    ended = [c.rank for c in group.children if c.rank != rank and c.outcome and c.outcome[0] == group.exec_id]
    if ended:
        failure = group.failure
        reason = failure.reason if failure is not None and failure.rank == rank else "failed"
        group.give_up(ChildFailed(rank, f"{reason}, and could not be healed: rank {ended[0]}'s function had "
                                        f"already ended", old.stderr_tail))
    group.generation += 1
    # The socket thread dispatches under the link's lock and drops a message from an identity it does not know; a
    # child says hello once. So the new child, and the new spare take_spare starts, are recorded before it reads on.
    with group.link.lock:
        spare = group.starter.take_spare(rank)
        child = spare or group.starter.start(rank, group.generation)
        child.inbox["data"] = old.inbox["data"]      # what the dead child sent is still to be read
        group.children[rank] = child
    group.failure, group.first_error = None, None
    deadline = time.monotonic() + START_TIMEOUT
    if group.wait_for(lambda: child.connected or None, deadline) is None:
        group.give_up(ChildFailed(rank, f"was replaced, but the new child did not connect within "
                                        f"{START_TIMEOUT:.0f} s", child.stderr_tail, child.host))
    if spare is not None:
        group.send_if_alive(child, ("assume", None, {"rank": rank, "generation": group.generation,
                                                     "gpu": group.starter.gpu_of(rank)}))
    if group.exec_id:       # running on every survivor (checked above): the replacement joins it
        _hand_over(group, child, rank)


def salvage(group: Supervisor, rank: int, answered: Callable[[Any], bool], timeout: float) -> list:
    """``rank`` died and cannot be replaced: tell the survivors, which wait for a heal, that none is coming and
    that the lowest live rank among them is to save what it holds. Returns what that rank sent until
    ``answered(item)`` (its word that it saved, or could not), its death, or ``timeout`` s; [] when no survivor
    is left or nothing runs."""
    survivors = [c for c in group.children if c.rank != rank and c.process.poll() is None]
    if not survivors or not group.exec_id:
        return []
    saver = survivors[0]
    for survivor in survivors:
        group.send_if_alive(survivor, ("heal", group.exec_id, {"generation": group.generation, "salvage": saver.rank}))
    sent: list = []

    def done() -> bool | None:
        while saver.inbox["data"]:
            sent.append(saver.inbox["data"].popleft())
            if answered(sent[-1]):
                return True
        return True if saver.process.poll() is not None else None
    group.link.wait_for(done, time.monotonic() + timeout)
    return sent


def _reap(old: ChildProcess) -> None:
    """Make sure the dead child is dead and reaped, and its last stderr lines read."""
    if old.process.poll() is None:
        old.process.kill()
    old.process.wait()
    old.reader.join(timeout=1.0)


def _hand_over(group: Supervisor, child: ChildProcess, rank: int) -> None:
    """The running exec to the new child, the heal notice to every survivor."""
    group.send_if_alive(child, ("exec", group.exec_id, group.call))
    notice = {"generation": group.generation, "replaced": rank}
    for survivor in group.children:
        if survivor is not child:
            group.send_if_alive(survivor, ("heal", group.exec_id, notice))
