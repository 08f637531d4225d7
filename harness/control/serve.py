"""A child's serve loop: receive from the parent, run what it ships, send back what happened.

``Context`` (harness/child.py) holds the worker-side verbs; the ``Server`` it holds owns everything
the verbs do not show: the messages that arrive (sorted into inboxes by ``dispatch``, from
whichever thread read the socket: harness/control/link.py), the running exec's state (its id, its
abort, the resources and abort hooks its function registered), the heartbeats, and the loop that
runs each exec and reports its outcome. The verbs' blocking waits (``take``, ``exchange``,
``await_heal``) are here too, because each must end with ``PeerFailed`` once an abort arrives.

The wire protocol (each message is (kind, id, payload), signed: harness/control/wire.py):
parent -> child: ("exec", id, (fn, args, kwargs)), ("data", id, obj), ("join", id, msg),
("exchange", tag, values) (to rank ``to`` alone, where one is named), ("reply", id, answer), ("abort", id, reason),
("heal", id, notice), ("stop", None, None);
to remote children also ("heartbeat", None, None) and ("signal", None, signum); to a warm spare
("assume", None, {"rank", "generation", "gpu"}), which makes it the replacement of that rank.
Child -> parent: ("hello", None, ready: no preloads), ("ready", None, None) once they are imported,
("heartbeat", None, None), ("print", id, text),
("yield", id, value), ("data", id, obj), ("exchange", tag, (ranks, value, to)), ("request", id, (service, payload)),
("result", id, value),
("error", id, traceback_text). Ids are exec ids: what a failed exec left behind is dropped
rather than mistaken for the next exec's. Exchange tags carry the exec id for the same reason.
An exchange's values travel sealed (``wire.Sealed``): the parent relays them unopened.
Either side turns an authentic message it cannot decode into an error for the current exec.
A "stop" that arrives while a function runs aborts it: the parent is ending the run.
The parent's side is harness/control/mailbox.py (what arrives) and supervise.py (what it sends).

SIGINT and SIGTERM never end a child: they are recorded (``record_signal``) for the running function
to read as ``ctx.interrupted``; the parent decides when the run ends (harness/resilience/interrupt.py).
"""
from __future__ import annotations

import collections
import faulthandler
import os
import time
import traceback
from typing import Any, Callable, Sequence

import zmq

from ..plugins import import_factory, preload as import_preloads
from . import timeline, wire
from .endpoint import secure
from .errors import PeerFailed
from .lifeline import Lifeline
from .link import HEARTBEAT_INTERVAL, Link, identity_of

_interrupted: int | None = None      # the last SIGINT or SIGTERM this process received


def record_signal(signum: int, _frame: Any) -> None:
    """The handler of SIGINT and SIGTERM in a child, and what a forwarded "signal" message does."""
    global _interrupted
    _interrupted = signum


def last_signal() -> int | None:
    return _interrupted


class Server:
    """The child's side of the wire for one ``Context``: what arrived, the running exec, the loop."""

    def __init__(self, ctx: Any, link_factory: Callable[["Server"], Any]):
        self.ctx = ctx
        self.inbox: dict[str, collections.deque] = {k: collections.deque() for k in ("exec", "data", "join", "reply")}
        self.exchanges: dict[str, list] = {}
        self.abort_hooks: list[Callable[[str], None]] = []
        self.owned: list[Any] = []          # closed when the current function returns
        self.tags: dict[str, int] = {}      # ctx.unique_tag's counts, afresh in each exec and generation
        self.exec_id: int | None = None
        self.aborted: str | None = None
        self._aborts: dict[int, str] = {}      # exec id -> reason; an abort may overtake its exec
        self._heal_notice: dict | None = None
        self._stopping = False
        self._running = False
        self._preloading = False
        self._last_heartbeat = 0.0
        self._lifeline = Lifeline()
        # HARNESS_STALL_DUMP_S: if housekeeping (heartbeats) stalls this long, every thread's stack goes to
        # stderr, to see what starved the heartbeats of a worker the parent then reports as hung.
        self._stall_dump = float(os.environ.get("HARNESS_STALL_DUMP_S", "0"))
        self.link = link_factory(self)

    # -- what the verbs wait for -----------------------------------------------------------------

    def post(self, kind: str, payload: Any) -> None:
        """Send (kind, the running exec's id, payload); returns once its buffers have left this process."""
        tracker = self.link.send((kind, self.exec_id, payload))
        if tracker is not None:
            tracker.wait()    # the caller may reuse the object's memory once this returns

    def take(self, kind: str, hint_after: float | None = None, hint: str = "") -> Any:
        """The next "data", "join" or "reply" from the parent; PeerFailed if the exec is aborted meanwhile.
        ``hint_after``: once nothing has come for that many seconds, ``hint`` goes to the parent's output (once)."""
        box = self.inbox[kind]

        def ready():
            self._check_abort()
            return (box.popleft(),) if box else None
        if hint_after is not None:
            got = self.link.wait_for(ready, deadline=time.monotonic() + hint_after)
            if got is not None:
                return got[0]
            self.post("print", hint)
        return self.link.wait_for(ready)[0]

    def arrived(self, kind: str) -> bool:
        """Whether a "reply" (or another ``take``-able ``kind``) is here, without waiting for one."""
        return self.link.wait_for(lambda: self._check_abort() or bool(self.inbox[kind]) or None,
                                  deadline=time.monotonic()) is not None

    def exchange(self, tag: str, ranks: list[int] | None, value: Any, to: int | None = None) -> list | None:
        """Send ``value`` to the parent's exchange ``tag`` (of this exec and generation); the values of
        every member once all have sent theirs. ``to``: only that rank gets them (a gather): the others
        return None at once, and ``to`` sends no value, keeping its own in the list (it never travels)."""
        tag = f"{self.exec_id}.{self.ctx.generation}/{tag}"
        root = to == self.ctx.rank
        self.link.send(("exchange", tag, (ranks, None if root else wire.Sealed.of(value), to)))
        if to is not None and not root:
            return None
        sealed = self.link.wait_for(lambda: self._check_abort() or self.exchanges.pop(tag, None))
        values = [None if v is None else v.open() for v in sealed]
        if root:
            values[(ranks or list(range(self.ctx.world_size))).index(to)] = value
        return values

    def await_heal(self, grace: float) -> dict | None:
        """The heal notice, once a peer's failure (reported within ``grace`` s) has been healed; None if
        none was reported. Clears the abort: the exec goes on in the notice's generation."""
        if self.link.wait_for(lambda: self.aborted, time.monotonic() + grace) is None:
            return None

        def notice():
            if self._stopping:
                raise PeerFailed("the parent stopped the run instead of healing it")
            return self._heal_notice
        found = self.link.wait_for(notice)
        self._heal_notice, self.aborted, self.tags = None, None, {}
        return found

    def _check_abort(self) -> None:
        if self.aborted is not None:
            raise PeerFailed(self.aborted)

    # -- what arrives ----------------------------------------------------------------------------

    def dispatch(self, _sender: bytes | None, message: tuple) -> None:
        kind, ident, payload = message
        self._lifeline.heard()
        if kind == "heartbeat":
            return
        if kind == "signal":
            record_signal(payload, None)
        elif kind == "assume":      # a spare becomes a dead rank's replacement; its exec follows
            self._assume(payload)
        elif kind == "exchange":
            self.exchanges[ident] = payload
        elif kind == "abort":
            if ident == self.exec_id:
                if self.aborted is None:
                    self._abort(payload)
            elif self.exec_id is None or ident > self.exec_id:   # overtook its exec: apply when it starts
                self._aborts.setdefault(ident, payload)
        elif kind == "heal":
            if ident == self.exec_id:
                self._heal_notice = payload
        elif kind == "stop":
            self._stopping = True
            if self._preloading:
                os._exit(0)     # nothing has run yet: no need to wait for an import to finish
            if self._running and self.aborted is None:
                self._abort("the parent stopped the run")
        elif kind == "undecodable":
            self.link.send(("error", self.exec_id, "this child could not decode a message from the parent:\n"
                            + payload))
        else:
            self.inbox[kind].append((ident, payload) if kind == "exec" else payload)

    def _assume(self, place: dict) -> None:
        ctx = self.ctx
        ctx.rank, ctx.generation, ctx.gpu = place["rank"], place["generation"], place["gpu"] or None
        ctx.replacing = {"generation": ctx.generation, "replaced": ctx.rank}
        timeline.mark(ctx.marks, "assumed")
        os.environ.update(HARNESS_RANK=str(ctx.rank), HARNESS_GENERATION=str(ctx.generation))

    def _abort(self, reason: str) -> None:
        self.aborted = reason
        for hook in list(self.abort_hooks):
            hook(reason)

    def housekeeping(self) -> None:
        if self._stall_dump:     # re-armed each tick: fires only if this thread stalls that long
            faulthandler.dump_traceback_later(self._stall_dump)
        self._lifeline.check()
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = now
            self.link.send(("heartbeat", None, None))

    # -- the loop --------------------------------------------------------------------------------

    def serve(self, preload: Sequence[str] = ()) -> None:
        """Say hello, import ``preload`` while the parent prepares the first exec, then run each exec
        as it comes until the parent says stop; the link is closed on the way out."""
        try:
            self.link.send(("hello", None, not preload))
            self.link.start()
            self._preloading = True
            import_preloads(preload)
            self._preloading = False
            self.link.send(("ready", None, None))
            while True:
                work = self.link.wait_for(lambda: "stop" if self._stopping else (
                    self.inbox["exec"].popleft() if self.inbox["exec"] else None))
                if work == "stop":
                    return
                self._run(*work)
        finally:
            self.link.close(linger_ms=10_000)

    def _run(self, exec_id: int, call: tuple) -> None:
        fn, args, kwargs = call
        # The socket thread handles aborts under the link's lock: one for this exec that comes now is then
        # either kept for it (``_aborts``) and taken here, or applied after, never lost between the two.
        with self.link.lock:
            self.exec_id, self.aborted, self.tags = exec_id, self._aborts.pop(exec_id, None), {}
        self.inbox["join"].clear()
        self.inbox["reply"].clear()
        self._running = True
        try:
            fn = import_factory(fn, "exec", "(ctx, *args, **kwargs)") if isinstance(fn, str) else fn
            outcome = ("result", fn(self.ctx, *args, **kwargs))
        except BaseException:
            outcome = ("error", traceback.format_exc())
        self._running, self.ctx.replacing = False, None
        try:
            self.link.send((outcome[0], exec_id, outcome[1]))
        except Exception:
            self.link.send(("error", exec_id, "the return value could not be sent back:\n" + traceback.format_exc()))
        if outcome[0] == "error":
            # A collective of ours may be in flight: never wait on it. Aborting it fails the peers' at
            # once, so it comes after our error is on its way: the parent reports the cause first.
            self._abort_owned()
        self._release()

    def _abort_owned(self) -> None:
        for resource in self.owned:
            if hasattr(resource, "abort"):
                try:
                    resource.abort("the function on this rank raised")
                except Exception:
                    traceback.print_exc()

    def _release(self) -> None:
        while self.owned:
            try:
                self.owned.pop().close()
            except Exception:
                traceback.print_exc()
        self.abort_hooks.clear()


def connect(server: Server, endpoint: str, key: bytes) -> Link:
    """The child's link to the parent: a DEALER socket under its identity (a warm spare's own until it
    takes a rank's place), CURVE if the group is encrypted."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    secure(socket, os.environ)
    spare = os.environ.pop("HARNESS_IDENTITY", "")      # a warm spare's, until it takes a rank's place
    socket.setsockopt(zmq.IDENTITY, spare.encode() or identity_of(server.ctx.rank, server.ctx.generation))
    socket.setsockopt(zmq.LINGER, 10_000)
    socket.connect(endpoint)
    return Link(socket, key, server.dispatch, server.housekeeping)
