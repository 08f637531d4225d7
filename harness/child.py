"""A child worker: ``python -m harness.child``, started by ``harness.parent``.

The parent hands over everything through the environment (never argv, which ``ps`` shows):
the ZeroMQ endpoint, the run's signing key, the rank, the world size and its ``sys.path``. A child
exits when its parent process ends (the parent, or the zygote that forked it) and, on another host,
when the parent is silent for the heartbeat timeout: that is how a child on another host learns that
the parent, or the network between them, is gone (harness/control/lifeline.py). The child then
serves: it waits for ``exec`` messages, runs each shipped function as ``fn(ctx, *args, **kwargs)`` and
reports the return value or the exception's traceback. This file holds ``Context``, the verbs that
function calls; the serve loop and the wire protocol are in harness/control/serve.py.

SIGINT and SIGTERM never end a child: they are recorded as ``ctx.interrupted`` (the signal's
number) for the running function to act on; the parent decides when the run ends
(harness/resilience/interrupt.py). A "stop" from the parent while a function runs aborts it.

Healing (a group forked with ``heal=True``): when a peer dies, the survivors' running function
is aborted as usual but need not end. It calls ``ctx.await_heal()``, which returns the parent's
notice once a replacement for the dead rank has been started, and goes on in a new *generation*:
exchange tags carry it, so nothing of the broken generation is mistaken for the new one's. The
replacement is a fresh child that starts the same exec with ``ctx.replacing`` set to that notice.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
from typing import Any, Callable, Sequence

from .control import serve, timeline
from .control.errors import PeerFailed
from .control.prefixed import prefix_output

__all__ = ["Context", "PeerFailed", "main"]

RECEIVE_HINT = 60.0         # seconds a ctx.receive() waits before it says what it waits for


class Context:
    """A child's side of the API: ``rank``, ``world_size``, ``device``, ``yield_``, ``receive``,
    ``send``, ``print``, ``exchange``, ``request``, and ``communicator`` for collectives. ``link_factory(server)``
    makes the link to the parent for the serve loop (harness/control/serve.py) this context holds."""

    def __init__(self, rank: int, world_size: int, gpu: str | None,
                 link_factory: Callable[[serve.Server], Any]):
        self.rank = rank
        self.world_size = world_size
        self.gpu = gpu                      # the physical GPU id this child is pinned to, or None
        self.generation = int(os.environ.get("HARNESS_GENERATION", "0"))
        # A replacement's heal notice ({"generation", "replaced"}): the exec it joins is under way.
        self.replacing: dict | None = {"generation": self.generation, "replaced": rank} if self.generation else None
        self.host = os.environ.get("HARNESS_HOST", "localhost")     # the launcher's name for this child's host
        self._endpoint = os.environ.get("HARNESS_ENDPOINT", "")
        self.marks = timeline.start("imported")    # the start-up timeline: interpreter and imports done
        self._server = serve.Server(self, link_factory)

    @property
    def interrupted(self) -> int | None:
        """The number of the last SIGINT or SIGTERM this child received, or None."""
        return serve.last_signal()

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
        self._server.post("yield", value)
        return self._server.take("join")

    def receive(self) -> Any:
        """The next object the parent sent to this child. One that waits ``RECEIVE_HINT`` s says so, once, in
        the parent's output: a parent that went on to ``wait()`` sends nothing more, and both would wait for ever."""
        return self._server.take("data", RECEIVE_HINT, f"ctx.receive() has waited {RECEIVE_HINT:.0f} s for the parent "
                                 "to send; the parent sends with send() or scatter(), and sends nothing more once it "
                                 "waits in wait() or join()")

    def send(self, obj: Any) -> None:
        """Send ``obj`` to the parent; returns once its buffers have left this process."""
        self._server.post("data", obj)

    def print(self, *args: Any, sep: str = " ") -> None:
        """Printed by the parent, prefixed with this child's rank."""
        self._server.post("print", sep.join(str(a) for a in args))

    def exchange(self, tag: str, value: Any, ranks: Sequence[int] | None = None) -> list:
        """All-gather through the parent: every child of ``ranks`` (default: all) calls it with the same
        tag; returns their values in the order of ``ranks``. Collectives use it to hand out the NCCL
        unique id and gloo's address; workers sharing a GPU, their IPC handles."""
        return self._server.exchange(tag, self._members(ranks), value)

    def gather(self, tag: str, value: Any, to: int = 0, ranks: Sequence[int] | None = None) -> list | None:
        """``exchange``, but only rank ``to`` gets the values (in the order of ``ranks``); the others get None
        and go on at once, and ``to``'s own value never leaves it. For what one rank writes: a checkpoint's
        every-rank parts, which an all-gather would copy to every rank (N times the part each)."""
        members = self._members(ranks)
        if to not in (range(self.world_size) if members is None else members):
            raise ValueError(f"to={to} is not a member of ranks={members if members is not None else 'all'}; "
                             "gather to one of them")
        return self._server.exchange(tag, members, value, to=to)

    def _members(self, ranks: Sequence[int] | None) -> list[int] | None:
        """``ranks`` as a list, checked: increasing, in the world, this child among them (None: everyone)."""
        if ranks is None:
            return None
        ranks = list(ranks)
        if sorted(set(ranks)) != ranks or not all(isinstance(r, int) and 0 <= r < self.world_size for r in ranks):
            raise ValueError(f"ranks={ranks}: must be increasing ranks in 0..{self.world_size - 1}, each once")
        if self.rank not in ranks:
            raise ValueError(f"ranks={ranks} leaves out this child (rank {self.rank}); only members exchange")
        return ranks

    def request(self, service: str, payload: Any) -> Any:
        """Ask the parent's ``service`` (registered with ``Children.serve``) and block until it answers; the
        service may hold the answer back (the parameter server does, to bound staleness)."""
        self.ask(service, payload)
        return self.answer()

    def ask(self, service: str, payload: Any) -> None:
        """``request``'s first half: send, and go on; ``answer()`` takes the reply. One request at a time:
        the replies carry no name, so nothing else may be asked before this one's answer is taken."""
        self._server.post("request", (service, payload))

    def answer(self) -> Any:
        """The reply to the request ``ask`` sent, once it has come."""
        return self._server.take("reply")

    def answered(self) -> bool:
        """Whether the reply to the request ``ask`` sent has come (``answer`` then returns at once)."""
        return self._server.arrived("reply")

    def unique_tag(self, prefix: str) -> str:
        """prefix-0, prefix-1, ... counted afresh in each exec, so every rank that calls this in the
        same order gets the same tag, even after an earlier exec failed half-way on some rank."""
        tags = self._server.tags
        count = tags.get(prefix, 0)
        tags[prefix] = count + 1
        return f"{prefix}-{count}"

    def on_abort(self, hook: Callable[[str], None]) -> Callable[[], None]:
        """Call ``hook(reason)`` (from the housekeeping thread) when a peer fails; returns a remover."""
        hooks = self._server.abort_hooks
        hooks.append(hook)
        return lambda: hooks.remove(hook) if hook in hooks else None

    def own(self, resource: Any) -> None:
        """Close ``resource`` (anything with ``close()``) when the current function returns."""
        self._server.owned.append(resource)

    def release(self, resource: Any) -> None:
        """Close an owned ``resource`` now (a broken generation's communicator, say) and forget it."""
        if resource in self._server.owned:
            self._server.owned.remove(resource)
        resource.close()

    def await_heal(self, grace: float = 5.0) -> dict | None:
        """After an error on this rank in a group forked with ``heal=True``: if the parent reports a
        failed peer within ``grace`` s, wait for it to start the replacement and return its notice
        ({"generation", "replaced"}): this rank is now in the new generation, no longer aborted, and
        must open a new communicator. None if no peer failed: the error was this rank's own. A notice with
        "salvage" (the failed peer's host is lost) says no replacement is coming.
        Raises PeerFailed if the parent gives up healing and stops the run instead."""
        notice = self._server.await_heal(grace)
        if notice is not None:
            self.generation = notice["generation"]
        return notice

    def follow_heal(self, generation: int) -> None:
        """A survivor of a group forked ``independent``, which no death aborts and so never awaits a heal, has
        learned from the running code that the group is in ``generation`` now: from here on its exchanges are that
        generation's, their tags counted afresh, as the replacement's are."""
        if generation > self.generation:
            self.generation, self._server.tags = generation, {}

    def communicator(self, backend: str | None = None, **options: Any):
        """Collective call on every child: a communicator over all ranks ("nccl" on GPU children,
        "gloo" on CPU children unless ``backend`` says otherwise)."""
        from .collectives import open_communicator
        return open_communicator(self, backend, **options)


def main() -> None:
    """``python -m harness.child``: take the parent's settings, serve it until it says stop, exit."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, serve.record_signal)
    env = os.environ
    sys.path[:] = json.loads(env.pop("HARNESS_SYS_PATH", "[]")) or sys.path
    key = bytes.fromhex(env.pop("HARNESS_KEY"))
    endpoint = env["HARNESS_ENDPOINT"]
    ctx = Context(int(env["HARNESS_RANK"]), int(env["HARNESS_WORLD_SIZE"]), env.get("HARNESS_GPU") or None,
                  lambda server: serve.connect(server, endpoint, key))
    prefix_output(lambda: ctx.rank)
    ctx._server.serve([m for m in env.pop("HARNESS_PRELOAD", "").split(",") if m])
    # Stopped, with every owned resource released and every message sent: skip the interpreter's
    # teardown of torch and CUDA (most of a second, which the parent would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
