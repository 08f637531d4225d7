"""The parent's mailbox: what the children send, put where the group's verbs look for it.

Every message a child sends (the protocol is listed in harness/control/serve.py) reaches ``dispatch``
from whichever thread read the socket (harness/control/link.py). It is matched to a child by its
current identity, so a replaced child's old one is nobody's, and to the running exec by its id, so
what a failed exec left behind is never mistaken for the next one's. Yields and data wait in the
child's inboxes until ``take`` hands them to ``join``/``receive``; a result or error becomes the
child's outcome; an error is reported to the supervisor (harness/control/supervise.py). Exchanges
(``ctx.exchange``, the communicators' rendezvous) meet here: once every member has sent its value,
each gets them all. Requests (``ctx.request``) go to the service the group registered under their
name (``serve``), which returns the answers now due, to this child or to others it held back.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

from .spawn import ChildProcess
from .supervise import Supervisor

log = logging.getLogger("harness")


class Mailbox:
    """Sorts what a group's children send into their records (``dispatch``) and hands it out (``take``)."""

    def __init__(self, group: Supervisor):
        self._group = group
        self._exchanges: dict[str, tuple[list[int], dict[int, Any]]] = {}   # tag -> (ranks, values so far)
        self._services: dict[str, Callable[[int, Any], list[tuple[int, Any]]]] = {}

    def serve(self, name: str, handler: Callable[[int, Any], list[tuple[int, Any]]]) -> None:
        """Answer the children's requests to ``name`` with ``handler(rank, payload)``, which returns the
        (rank, answer) pairs due now; it runs on the thread that reads the socket, so it must not wait."""
        self._services[name] = handler

    def take(self, box: str, ranks: Sequence[int] | None = None) -> list:
        """The next "yield" or "data" of each child of ``ranks`` (default: all), in that order,
        waiting for them under supervision. What arrived is handed out before the group's failure is
        raised (the next take, with nothing there, raises it): a record a worker sent just before another
        failed (rank 0's "saved", which a restart resumes from) is not lost. A child whose function
        returned sends nothing more."""
        children = [self._group.children[r] for r in ranks] if ranks is not None else self._group.children

        def ready():
            if all(c.inbox[box] for c in children):
                return True
            self._group.check()
            for child in children:
                if not child.inbox[box] and child.outcome is not None:   # it returned: nothing more will come
                    what = "yield_" if box == "yield" else "send"
                    raise RuntimeError(f"child {child.rank}'s function returned without calling ctx.{what}() "
                                       f"(or not as often as the parent waits for it); nothing will arrive")
            return None
        self._group.link.wait_for(ready)
        return [c.inbox[box].popleft() for c in children]

    def forget_exchanges(self) -> None:
        """A new exec or generation: an exchange of the old one that some member never joined is moot."""
        self._exchanges.clear()

    def dispatch(self, sender: bytes | None, message: tuple) -> None:
        group = self._group
        child = next((c for c in group.everyone() if c.identity == sender), None)
        if child is None:
            log.warning("dropped a message from unknown peer %r", sender)
            return
        child.last_seen = time.monotonic()
        kind, ident, payload = message
        if kind == "hello":
            child.connected, child.ready = True, bool(payload)
        elif kind == "ready":
            child.ready = True
        elif child is group.starter.spare:      # it runs nothing until it takes a dead rank's place
            return
        elif kind == "print":
            print(f"[{child.rank}] {payload}", flush=True)
        elif kind in ("yield", "data") and ident == group.exec_id:      # what older execs left is moot
            child.inbox[kind].append(payload)
        elif kind == "undecodable":
            group.record_error(child, "the parent could not decode a message from this child:\n" + payload,
                               still_running=True)
        elif kind == "error" and ident in (None, group.exec_id):        # None: the exec never decoded
            group.record_error(child, payload)
        elif kind == "result" and ident == group.exec_id and child.outcome is None:   # not after an error
            child.outcome = (ident, kind, payload)
        elif kind == "exchange":
            self._exchange(child, ident, payload)
        elif kind == "request" and ident == group.exec_id:
            self._request(child, ident, payload)

    def _request(self, child: ChildProcess, exec_id: int, payload: tuple[str, Any]) -> None:
        name, value = payload
        handler = self._services.get(name)
        if handler is None:
            self._group.record_error(child, f"ctx.request({name!r}): no such service; the parent serves "
                                            f"{sorted(self._services)} (register one with Children.serve)", still_running=True)
            return
        try:
            answers = handler(child.rank, value)
        except Exception as error:      # the service's refusal is this child's error, not the parent's crash
            self._group.record_error(child, f"ctx.request({name!r}) failed in the parent: {error}", still_running=True)
            return
        for rank, answer in answers:
            self._group.send_if_alive(self._group.children[rank], ("reply", exec_id, answer))

    def _exchange(self, child: ChildProcess, tag: str, payload: tuple[list[int] | None, Any, int | None]) -> None:
        """One member's value for exchange ``tag``; once every member's is in, the list goes to each of them, or
        to rank ``to`` alone (a gather: harness/child.py's ``Context.gather``)."""
        children = self._group.children
        ranks, value, to = payload
        ranks = list(range(len(children))) if ranks is None else ranks
        expected, values = self._exchanges.setdefault(tag, ((ranks, to), {}))
        if (ranks, to) != expected:
            self._group.record_error(child, f"exchange {tag!r}: this child lists ranks {ranks} (to {to}), another "
                                            f"listed {expected[0]} (to {expected[1]}); every member must pass the same",
                                     still_running=True)
            return
        values[child.rank] = value
        if all(r in values for r in ranks):
            del self._exchanges[tag]
            gathered = [values[r] for r in ranks]
            for r in ranks if to is None else [to]:
                self._group.send_if_alive(children[r], ("exchange", tag, gathered))
