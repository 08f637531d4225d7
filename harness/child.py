"""A child worker: ``python -m harness.child``, started by ``harness.parent``.

The parent hands over everything through the environment (never argv, which ``ps`` shows):
the ZeroMQ endpoint, the run's signing key, the rank, the world size and its ``sys.path``. A child
started over ssh (``python -m harness.child --stdin``) reads them as a JSON line from stdin instead,
and exits when stdin ends or when the parent is silent for the heartbeat timeout: that is how a
child on another host learns that the parent, or the network between them, is gone.
The child then serves: it waits for ``exec`` messages, runs each shipped function as
``fn(ctx, *args, **kwargs)`` and reports the return value or the exception's traceback.

Messages, parent -> child: ("exec", id, (fn, args, kwargs)), ("data", id, obj), ("join", id, msg),
("exchange", tag, values), ("abort", id, reason), ("heal", id, notice), ("stop", None, None);
to remote children also ("heartbeat", None, None) and ("signal", None, signum); to a warm spare
("assume", None, {"rank", "generation", "gpu"}), which makes it the replacement of that rank.
Child -> parent: ("hello", None, ready: no preloads), ("ready", None, None) once they are imported,
("heartbeat", None, None), ("print", id, text),
("yield", id, value), ("data", id, obj), ("exchange", tag, (ranks, value)), ("result", id, value),
("error", id, traceback_text). Ids are exec ids: what a failed exec left behind is dropped
rather than mistaken for the next exec's. Exchange tags carry the exec id for the same reason.
Either side turns an authentic message it cannot decode into an error for the current exec.
A "stop" that arrives while a function runs aborts it: the parent is ending the run.

SIGINT and SIGTERM never end a child: they are recorded as ``ctx.interrupted`` (the signal's
number) for the running function to act on; the parent decides when the run ends
(harness/resilience/interrupt.py).

Healing (a group forked with ``heal=True``): when a peer dies, the survivors' running function
is aborted as usual but need not end. It calls ``ctx.await_heal()``, which returns the parent's
notice once a replacement for the dead rank has been started, and goes on in a new *generation*:
exchange tags carry it, so nothing of the broken generation is mistaken for the new one's. The
replacement is a fresh child that starts the same exec with ``ctx.replacing`` set to that notice.
"""
from __future__ import annotations

import collections
import faulthandler
import functools
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from .control import timeline
from .control.link import HEARTBEAT_INTERVAL

_interrupted: int | None = None      # the last SIGINT or SIGTERM this process received


class PeerFailed(RuntimeError):
    """Raised in a child when another child of its group failed, so it cannot be waiting forever."""


class Context:
    """A child's side of the API: ``rank``, ``world_size``, ``device``, ``yield_``, ``receive``,
    ``send``, ``print``, and ``communicator`` for collectives."""

    def __init__(self, rank: int, world_size: int, gpu: str | None, link_factory: Callable[["Context"], Any]):
        self.rank = rank
        self.world_size = world_size
        self.gpu = gpu                      # the physical GPU id this child is pinned to, or None
        self._inbox: dict[str, collections.deque] = {k: collections.deque() for k in ("exec", "data", "join")}
        self._exchanges: dict[str, list] = {}
        self._abort_hooks: list[Callable[[str], None]] = []
        self._owned: list[Any] = []          # closed when the current function returns
        self._exec_id: int | None = None
        self._aborted: str | None = None
        self._aborts: dict[int, str] = {}      # exec id -> reason; an abort may overtake its exec
        self._tags: dict[str, int] = {}
        self.generation = int(os.environ.get("HARNESS_GENERATION", "0"))
        # A replacement's heal notice ({"generation", "replaced"}): the exec it joins is under way.
        self.replacing: dict | None = {"generation": self.generation, "replaced": rank} if self.generation else None
        self._heal_notice: dict | None = None
        self._stopping = False
        self._running = False
        self._preloading = False
        self._last_heartbeat = 0.0
        self._parent_pid = int(os.environ.get("HARNESS_PARENT_PID", os.getppid()))
        self.host = os.environ.get("HARNESS_HOST", "localhost")     # the launcher's name for this child's host
        self._endpoint = os.environ.get("HARNESS_ENDPOINT", "")
        self._parent_timeout = float(os.environ.get("HARNESS_HEARTBEAT_TIMEOUT", "inf"))
        self._heard = time.monotonic()      # when the parent was last heard from
        # HARNESS_STALL_DUMP_S: if housekeeping (heartbeats) stalls this long, every thread's stack goes to
        # stderr, to see what starved the heartbeats of a worker the parent then reports as hung.
        self._stall_dump = float(os.environ.get("HARNESS_STALL_DUMP_S", "0"))
        self.marks = timeline.start("imported")    # the start-up timeline: interpreter and imports done
        self._link = link_factory(self)

    @property
    def interrupted(self) -> int | None:
        """The number of the last SIGINT or SIGTERM this child received, or None."""
        return _interrupted

    @functools.cached_property
    def address(self) -> str:
        """This child's address where its peers can reach it: loopback when the group runs on one
        machine; across hosts, the address of its interface on the route to the parent."""
        if not self._endpoint.startswith("tcp://"):
            return "127.0.0.1"
        from .launch.launchers import address_toward
        return address_toward(self._endpoint[len("tcp://"):].rsplit(":", 1)[0])

    @property
    def device(self):
        """This child's GPU (``cuda:0``: it sees only its own; a warm spare that took a rank's place sees
        its group's GPUs), or ``cpu``."""
        import torch
        if self.gpu is None:
            return torch.device("cpu")
        return torch.device("cuda", os.environ["CUDA_VISIBLE_DEVICES"].split(",").index(self.gpu))

    def yield_(self, value: Any = None) -> Any:
        """Hand ``value`` to the parent and block until it joins; returns the join message."""
        self._post("yield", value)
        return self._next("join")

    def receive(self) -> Any:
        """The next object the parent sent to this child."""
        return self._next("data")

    def send(self, obj: Any) -> None:
        """Send ``obj`` to the parent; returns once its buffers have left this process."""
        self._post("data", obj)

    def print(self, *args: Any, sep: str = " ") -> None:
        """Printed by the parent, prefixed with this child's rank."""
        self._post("print", sep.join(str(a) for a in args))

    def exchange(self, tag: str, value: Any, ranks: Sequence[int] | None = None) -> list:
        """All-gather through the parent: every child of ``ranks`` (default: all) calls it with the same
        tag; returns their values in the order of ``ranks``. Collectives use it to hand out the NCCL
        unique id and gloo's address; workers sharing a GPU, their IPC handles."""
        if ranks is not None:
            ranks = list(ranks)
            if sorted(set(ranks)) != ranks or not all(isinstance(r, int) and 0 <= r < self.world_size for r in ranks):
                raise ValueError(f"ranks={ranks}: must be increasing ranks in 0..{self.world_size - 1}, each once")
            if self.rank not in ranks:
                raise ValueError(f"ranks={ranks} leaves out this child (rank {self.rank}); only members exchange")
        tag = f"{self._exec_id}.{self.generation}/{tag}"
        self._link.send(("exchange", tag, (ranks, value)))
        return self._link.wait_for(lambda: self._check_abort() or self._exchanges.pop(tag, None))

    def unique_tag(self, prefix: str) -> str:
        """prefix-0, prefix-1, ... counted afresh in each exec, so every rank that calls this in the
        same order gets the same tag, even after an earlier exec failed half-way on some rank."""
        count = self._tags.get(prefix, 0)
        self._tags[prefix] = count + 1
        return f"{prefix}-{count}"

    def on_abort(self, hook: Callable[[str], None]) -> Callable[[], None]:
        """Call ``hook(reason)`` (from the housekeeping thread) when a peer fails; returns a remover."""
        self._abort_hooks.append(hook)
        return lambda: self._abort_hooks.remove(hook) if hook in self._abort_hooks else None

    def own(self, resource: Any) -> None:
        """Close ``resource`` (anything with ``close()``) when the current function returns."""
        self._owned.append(resource)

    def release(self, resource: Any) -> None:
        """Close an owned ``resource`` now (a broken generation's communicator, say) and forget it."""
        if resource in self._owned:
            self._owned.remove(resource)
        resource.close()

    def await_heal(self, grace: float = 5.0) -> dict | None:
        """After an error on this rank in a group forked with ``heal=True``: if the parent reports a
        failed peer within ``grace`` s, wait for it to start the replacement and return its notice
        ({"generation", "replaced"}): this rank is now in the new generation, no longer aborted, and
        must open a new communicator. None if no peer failed: the error was this rank's own.
        Raises PeerFailed if the parent gives up healing and stops the run instead."""
        if self._link.wait_for(lambda: self._aborted, time.monotonic() + grace) is None:
            return None

        def notice():
            if self._stopping:
                raise PeerFailed("the parent stopped the run instead of healing it")
            return self._heal_notice
        found = self._link.wait_for(notice)
        self._heal_notice, self._aborted, self._tags = None, None, {}
        self.generation = found["generation"]
        return found

    def communicator(self, backend: str | None = None, **options: Any):
        """Collective call on every child: a communicator over all ranks ("nccl" on GPU children,
        "gloo" on CPU children unless ``backend`` says otherwise)."""
        from .collectives import open_communicator
        return open_communicator(self, backend, **options)

    # -- plumbing -------------------------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        tracker = self._link.send((kind, self._exec_id, payload))
        if tracker is not None:
            tracker.wait()    # the caller may reuse the object's memory once this returns

    def _check_abort(self) -> None:
        if self._aborted is not None:
            raise PeerFailed(self._aborted)

    def _next(self, kind: str) -> Any:
        box = self._inbox[kind]

        def ready():
            self._check_abort()
            return (box.popleft(),) if box else None
        return self._link.wait_for(ready)[0]

    def dispatch(self, _sender: bytes | None, message: tuple) -> None:
        kind, ident, payload = message
        self._heard = time.monotonic()
        if kind == "heartbeat":
            return
        if kind == "signal":
            _record_signal(payload, None)
        elif kind == "assume":      # a spare becomes a dead rank's replacement; its exec follows
            self.rank, self.generation, self.gpu = payload["rank"], payload["generation"], payload["gpu"] or None
            self.replacing = {"generation": self.generation, "replaced": self.rank}
            timeline.mark(self.marks, "assumed")
            os.environ["HARNESS_RANK"] = str(self.rank)
        elif kind == "exchange":
            self._exchanges[ident] = payload
        elif kind == "abort":
            if ident == self._exec_id:
                if self._aborted is None:
                    self._abort(payload)
            elif self._exec_id is None or ident > self._exec_id:   # overtook its exec: apply when it starts
                self._aborts.setdefault(ident, payload)
        elif kind == "heal":
            if ident == self._exec_id:
                self._heal_notice = payload
        elif kind == "stop":
            self._stopping = True
            if self._preloading:
                os._exit(0)     # nothing has run yet: no need to wait for an import to finish
            if self._running and self._aborted is None:
                self._abort("the parent stopped the run")
        elif kind == "undecodable":
            self._link.send(("error", self._exec_id, "this child could not decode a message from the parent:\n"
                             + payload))
        else:
            self._inbox[kind].append((ident, payload) if kind == "exec" else payload)

    def _abort(self, reason: str) -> None:
        self._aborted = reason
        for hook in list(self._abort_hooks):
            hook(reason)

    def housekeeping(self) -> None:
        if self._stall_dump:     # re-armed each tick: fires only if this thread stalls that long
            faulthandler.dump_traceback_later(self._stall_dump)
        if os.getppid() != self._parent_pid:
            _remove_socket_directory(self._endpoint)
            os._exit(1)   # the parent is gone: nobody will ever stop us, and our GPU must be freed
        now = time.monotonic()
        if now - self._heard > self._parent_timeout:
            _exit_because(f"nothing heard from the parent for {now - self._heard:.0f} s: it or the network is gone")
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = now
            self._link.send(("heartbeat", None, None))

    # -- the serve loop ------------------------------------------------------------------------

    def serve(self, preload: Sequence[str] = ()) -> None:
        self._link.send(("hello", None, not preload))
        self._link.start()
        self._preloading = True
        for module in preload:      # while the parent still prepares the first exec
            try:
                importlib.import_module(module)
            except Exception:       # the exec that needs it will raise the error itself, to the parent
                pass
        self._preloading = False
        self._link.send(("ready", None, None))
        while True:
            work = self._link.wait_for(lambda: "stop" if self._stopping else (
                self._inbox["exec"].popleft() if self._inbox["exec"] else None))
            if work == "stop":
                return
            self._run(*work)

    def _run(self, exec_id: int, call: tuple) -> None:
        fn, args, kwargs = call
        self._exec_id, self._aborted, self._tags = exec_id, self._aborts.pop(exec_id, None), {}
        self._inbox["join"].clear()
        self._running = True
        try:
            outcome = ("result", fn(self, *args, **kwargs))
        except BaseException:
            outcome = ("error", traceback.format_exc())
        self._running, self.replacing = False, None
        try:
            self._link.send((outcome[0], exec_id, outcome[1]))
        except Exception:
            self._link.send(("error", exec_id, "the return value could not be sent back:\n" + traceback.format_exc()))
        if outcome[0] == "error":
            # A collective of ours may be in flight: never wait on it. Aborting it fails the peers' at
            # once, so it comes after our error is on its way: the parent reports the cause first.
            self._abort_owned()
        self._release()

    def _abort_owned(self) -> None:
        for resource in self._owned:
            if hasattr(resource, "abort"):
                try:
                    resource.abort("the function on this rank raised")
                except Exception:
                    traceback.print_exc()

    def _release(self) -> None:
        while self._owned:
            try:
                self._owned.pop().close()
            except Exception:
                traceback.print_exc()
        self._abort_hooks.clear()


def _connect(ctx: Context, endpoint: str, key: bytes):
    import zmq
    from .control.endpoint import secure
    from .control.link import Link, identity_of
    socket = zmq.Context.instance().socket(zmq.DEALER)
    secure(socket, os.environ)
    spare = os.environ.pop("HARNESS_IDENTITY", "")      # a warm spare's, until it takes a rank's place
    socket.setsockopt(zmq.IDENTITY, spare.encode() or identity_of(ctx.rank, ctx.generation))
    socket.setsockopt(zmq.LINGER, 10_000)
    socket.connect(endpoint)
    return Link(socket, key, ctx.dispatch, ctx.housekeeping)


def _record_signal(signum: int, _frame: Any) -> None:
    global _interrupted
    _interrupted = signum


def _remove_socket_directory(endpoint: str) -> None:
    """A parent that was killed could not remove its private socket directory; its children do.
    Each removes the socket it was given, and the directory once empty (the last one out)."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    for remove in (os.unlink, os.rmdir):
        try:
            remove(path)
        except OSError:
            return
        path = os.path.dirname(path)


def _exit_because(reason: str) -> None:
    sys.stderr.write(f"harness child on {os.environ.get('HARNESS_HOST', 'localhost')}: {reason}; exiting\n")
    sys.stderr.flush()
    os._exit(1)


def _environment_from_stdin() -> None:
    """``--stdin`` (a child started over ssh): the environment comes as one JSON line, and then stdin
    stays open for as long as the parent's ssh client runs."""
    os.environ.update(json.loads(sys.stdin.buffer.readline() or b"{}"))

    def watch() -> None:
        while sys.stdin.buffer.read(65536):
            pass
        _exit_because("the parent's ssh session ended")
    threading.Thread(target=watch, name="harness-stdin", daemon=True).start()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _record_signal)
    if "--stdin" in sys.argv[1:]:
        _environment_from_stdin()
    env = os.environ
    sys.path[:] = json.loads(env.pop("HARNESS_SYS_PATH", "[]")) or sys.path
    key = bytes.fromhex(env.pop("HARNESS_KEY"))
    endpoint = env["HARNESS_ENDPOINT"]
    ctx = Context(int(env["HARNESS_RANK"]), int(env["HARNESS_WORLD_SIZE"]), env.get("HARNESS_GPU") or None,
                  lambda c: _connect(c, endpoint, key))
    try:
        ctx.serve([m for m in env.pop("HARNESS_PRELOAD", "").split(",") if m])
    finally:
        ctx._link.close(linger_ms=10_000)
    # Stopped, with every owned resource released and every message sent: skip the interpreter's
    # teardown of torch and CUDA (most of a second, which the parent would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
