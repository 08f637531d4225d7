"""One ZeroMQ socket shared by the API thread and a housekeeping thread.

ZeroMQ sockets are not thread-safe, but may move between threads across a full memory barrier.
A lock is that barrier. While the API thread is blocked (join, receive, yield_) it holds the lock
and reads the socket itself, so a round trip costs no thread hand-off. While the API thread is
busy elsewhere (training, or the user's code in the parent) the housekeeping thread takes the
lock every tick to send heartbeats, notice deaths and act on aborts. Both read through ``pump``,
so every message is handled by one dispatcher whichever thread received it.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any, Callable, TypeVar

import zmq

from . import wire

T = TypeVar("T")
log = logging.getLogger("harness")

TICK = 0.1   # seconds between housekeeping passes, and the longest a blocked wait sleeps in poll
HEARTBEAT_INTERVAL = 1.0     # seconds between a child's heartbeats (and the parent's, to remote children)
# Plain ints: pyzmq's flag enums cost microseconds per frame.
_SNDMORE, _EVENTS, _POLLIN = int(zmq.SNDMORE), int(zmq.EVENTS), int(zmq.POLLIN)


def identity_of(rank: int, generation: int) -> bytes:
    """A child's ZeroMQ identity: its rank, and the generation it was started in (a replacement's
    identity is new, so no other peer can take over a rank's by connecting under its name)."""
    return f"{rank}:{generation}".encode() if generation else str(rank).encode()


class Link:
    def __init__(self, socket: zmq.Socket, key: bytes,
                 dispatch: Callable[[bytes | None, Any], None], housekeeping: Callable[[], None]):
        self.socket = socket
        self.key = key
        self.lock = threading.RLock()
        self._dispatch = dispatch
        self._housekeeping = housekeeping
        self._router = socket.type == zmq.ROUTER
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLIN)
        self._last_housekeeping = 0.0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._housekeeper, name="harness-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, obj: Any, to: bytes | None = None) -> zmq.MessageTracker | None:
        """Sign and send; returns a tracker when frames were sent without copying (else None).

        Signing happens outside the lock so a large message does not stall the other thread."""
        frames = wire.pack(self.key, obj)
        zero_copy = len(frames) > 1          # [signature + header, *out-of-band buffers]
        if to is not None:
            frames.insert(0, to)
        with self.lock:
            if not zero_copy:
                for frame in frames[:-1]:
                    self.socket.send(frame, _SNDMORE)
                self.socket.send(frames[-1])
                return None
            return self.socket.send_multipart(frames, copy=False, track=True)

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for messages, dispatch all that are waiting, then housekeep."""
        with self.lock:
            if self._poller.poll(int(timeout * 1000)):
                # Asking for the events is cheaper than raising zmq.Again after the last message.
                while self.socket.getsockopt(_EVENTS) & _POLLIN:
                    self._receive(self.socket.recv_multipart(copy=False))
            now = time.monotonic()
            if now - self._last_housekeeping >= TICK / 2:
                self._last_housekeeping = now
                self._housekeeping()

    def _receive(self, frames: list[zmq.Frame]) -> None:
        sender = frames[0].bytes if self._router else None
        body = [f.buffer for f in frames[1 if self._router else 0:]]
        try:
            obj = wire.unpack(self.key, body)
        except wire.BadSignature as error:
            log.warning("dropped a frame set from %r: %s (not unpickled)", sender, error)
            return
        except Exception:
            # Authentic but undecodable (say, a class the receiver cannot import). Whoever waits
            # for it must hear so, or it would wait forever.
            obj = ("undecodable", None, traceback.format_exc())
        self._dispatch(sender, obj)

    def wait_for(self, ready: Callable[[], T | None], deadline: float | None = None) -> T | None:
        """Pump until ``ready()`` returns something other than None (checked under the lock, so a
        message the housekeeping thread dispatched is never missed); None once ``deadline`` passes."""
        while True:
            with self.lock:
                value = ready()
                if value is not None:
                    return value
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self.pump(TICK)

    def _housekeeper(self) -> None:
        while not self._closed.wait(TICK):
            if self.lock.acquire(blocking=False):
                try:
                    self.pump(0)
                except Exception:
                    if self._closed.is_set():
                        return
                    log.exception("housekeeping failed; continuing")
                finally:
                    self.lock.release()

    def close(self, linger_ms: int = 0) -> None:
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self.lock:
            self.socket.close(linger=linger_ms)
