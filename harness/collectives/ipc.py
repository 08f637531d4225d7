"""Memory and signals shared by the workers of one GPU: CUDA IPC, or shared memory on the CPU.

Each member of a local group owns one *slot*, a buffer every other member maps. On a GPU the
slot is its own cudaMalloc allocation exported with cudaIpcGetMemHandle (memory from torch's
caching allocator would not do: it sub-allocates, and a handle maps a whole allocation), and
each member has an interprocess CUDA event. On the CPU (where tests run the same protocol) slots
are files in /dev/shm and copies are synchronous, so no events are needed.

Ordering works by signals. A member *publishes* round r by recording its event on its current
stream, then writing r into its flag, a word in a small shared page. A peer *acquires* it by
waiting on the host until the flag reaches r, then making its own stream wait for the event.
The host flag is needed because cudaStreamWaitEvent waits for the event's latest record at the
time of the call: without it, a peer could wait on the previous round's record and run ahead.
"""
from __future__ import annotations

import contextlib
import functools
import mmap
import os
import tempfile
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch

FLAG_STRIDE = 8           # int64 words between two members' flags: one 64-byte cache line each
MIN_SLOT_BYTES = 1 << 20
SPIN_SECONDS = 1e-3       # busy-wait this long for a flag (peers are usually microseconds away)
NAP_SECONDS = 50e-6       # then sleep between checks, handing the core to others


def _shm_file(nbytes: int) -> tuple[str, mmap.mmap]:
    """A new file of ``nbytes`` in shared memory (/dev/shm where there is one), mapped read-write."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="harness-", dir=directory)
    try:
        os.ftruncate(fd, nbytes)
        return path, mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _map(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class HostMemory:
    """Slots in shared host memory, for CPU workers; copies are synchronous, so signals need no events."""

    def allocate(self, nbytes: int) -> tuple[str, torch.Tensor]:
        path, mapped = _shm_file(nbytes)
        return path, torch.frombuffer(mapped, dtype=torch.uint8)

    def open(self, handle: str, nbytes: int) -> torch.Tensor:
        return torch.frombuffer(_map(handle, nbytes), dtype=torch.uint8)

    def forget(self, handle: str) -> None:
        """Every member has mapped the slot: its name is no longer needed (the memory stays)."""
        os.unlink(handle)

    def release(self, slots: list[torch.Tensor]) -> None:
        pass                     # mappings go with their last tensor

    def new_event(self) -> tuple[None, None]:
        return None, None

    def open_event(self, handle: None) -> None:
        return None

    def record(self, event: Any) -> None:
        pass

    def wait(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def ordered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def close_events(self, mine: Any, peers: list) -> None:
        pass


class _DeviceBytes:
    """A raw device allocation seen by torch as a uint8 tensor (through the CUDA array interface)."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "strides": None, "version": 2}


class CudaIpcMemory:
    """Slots in device memory shared through CUDA IPC, ordered by interprocess events (cupy's runtime)."""

    EVENT_FLAGS = 0x2 | 0x4          # cudaEventDisableTiming | cudaEventInterprocess

    def __init__(self):
        from .nccl import _current_raw_stream, _nccl
        _nccl()                            # CuPy missing: the same install hint as for NCCL
        from cupy.cuda import runtime
        self._rt, self._stream = runtime, functools.partial(_current_raw_stream, torch.cuda.current_device())
        self._own = torch.cuda.Stream()
        self._pointers: dict[int, tuple[int, bool]] = {}     # id(tensor) -> (pointer, owned)

    def _tensor(self, pointer: int, nbytes: int, owned: bool) -> torch.Tensor:
        tensor = torch.as_tensor(_DeviceBytes(pointer, nbytes), device=torch.device("cuda", torch.cuda.current_device()))
        if tensor.data_ptr() != pointer:
            raise RuntimeError("torch copied a shared device buffer instead of wrapping it; the slots would not be shared")
        self._pointers[id(tensor)] = (pointer, owned)
        return tensor

    def allocate(self, nbytes: int) -> tuple[bytes, torch.Tensor]:
        pointer = self._rt.malloc(nbytes)
        return self._rt.ipcGetMemHandle(pointer), self._tensor(pointer, nbytes, owned=True)

    def open(self, handle: bytes, nbytes: int) -> torch.Tensor:
        return self._tensor(self._rt.ipcOpenMemHandle(handle), nbytes, owned=False)

    def forget(self, handle: bytes) -> None:
        pass

    def release(self, slots: list[torch.Tensor]) -> None:
        """Unmap the peers' slots and free our own (the group has synchronised: nobody uses them)."""
        for slot in slots:
            pointer, owned = self._pointers.pop(id(slot))
            (self._rt.free if owned else self._rt.ipcCloseMemHandle)(pointer)

    def new_event(self) -> tuple[int, bytes]:
        event = self._rt.eventCreateWithFlags(self.EVENT_FLAGS)
        return event, self._rt.ipcGetEventHandle(event)

    def open_event(self, handle: bytes) -> int:
        return self._rt.ipcOpenEventHandle(handle)

    def record(self, event: int) -> None:
        self._rt.eventRecord(event, self._stream())

    def wait(self, event: int) -> None:
        self._rt.streamWaitEvent(self._stream(), event, 0)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    @contextlib.contextmanager
    def ordered(self) -> Iterator[None]:
        """Run a round on our own stream, after the caller's stream and before its next work."""
        caller = torch.cuda.current_stream()
        self._own.wait_stream(caller)
        with torch.cuda.stream(self._own):
            yield
        caller.wait_stream(self._own)

    def close_events(self, mine: int, peers: list) -> None:
        for event in [mine, *peers]:
            if event is not None:
                self._rt.eventDestroy(event)


class LocalGroup:
    """The workers of one GPU: their slots, events and flags. Collective call on the group's members.

    ``members`` are global ranks, the leader first; ``exchange(tag, value)`` all-gathers among them
    (through the parent); ``aborted()`` returns a reason once the run is lost, ending any wait.
    """

    def __init__(self, rank: int, members: list[int], memory: HostMemory | CudaIpcMemory,
                 exchange: Callable[[str, Any], list], aborted: Callable[[], str | None]):
        self.members, self.index, self.size = members, members.index(rank), len(members)
        self._memory, self._exchange, self._aborted = memory, exchange, aborted
        self.capacity, self.slots, self.round = 0, [], 0
        flags_bytes = FLAG_STRIDE * 8 * self.size
        flags_path, flags = _shm_file(flags_bytes) if self.index == 0 else (None, None)
        self._event, event_handle = memory.new_event()
        try:
            paths, handles = zip(*exchange("group-init", (flags_path, event_handle)))
            self._flags_map = flags or _map(paths[0], flags_bytes)
            self._flags = np.frombuffer(self._flags_map, dtype=np.int64)
            self._peer_events = [None if i == self.index else memory.open_event(h) for i, h in enumerate(handles)]
            exchange("group-ready", None)                # every member has mapped the flags
        finally:
            if flags_path is not None:
                os.unlink(flags_path)
        self._closed = False

    def slot(self, member: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The first ``numel`` elements of a member's slot, as ``dtype``."""
        return self.slots[member][:numel * dtype.itemsize].view(dtype)

    def reserve(self, nbytes: int) -> None:
        """Grow every member's slot to hold ``nbytes``; all members call it with the same size."""
        if nbytes <= self.capacity:
            return
        capacity = max(nbytes, 2 * self.capacity, MIN_SLOT_BYTES)
        self._memory.synchronize()                 # our last rounds on the old slots are over
        handle, mine = self._memory.allocate(capacity)
        try:
            handles = self._exchange("group-slots", handle)      # (everyone has synchronised too)
            old = self.slots
            self.slots = [mine if i == self.index else self._memory.open(h, capacity) for i, h in enumerate(handles)]
            self._memory.release([s for i, s in enumerate(old) if i != self.index])
            self._exchange("group-slots-open", None)   # nobody maps the old slots any more, all map the new
        finally:
            self._memory.forget(handle)
        self._memory.release(old[self.index:self.index + 1])
        self.capacity = capacity

    def new_round(self) -> None:
        """Every member starts each collective with this, so rounds are numbered alike."""
        self.round += 1

    def publish(self) -> None:
        """Our slot (or, for the leader, the result) is written as of this round."""
        self._memory.record(self._event)
        self._flags[self.index * FLAG_STRIDE] = self.round

    def acquire(self, member: int) -> None:
        """Order what we do next after ``member``'s publication of this round."""
        self._await_flag(member, self.round)
        self._memory.wait(self._peer_events[member])

    def _await_flag(self, member: int, round_: int) -> None:
        flag, flags = member * FLAG_STRIDE, self._flags
        if flags[flag] >= round_:
            return
        busy_until = time.perf_counter() + SPIN_SECONDS
        while flags[flag] < round_:
            if time.perf_counter() < busy_until:
                continue
            reason = self._aborted()
            if reason is not None:
                raise RuntimeError(f"rank {self.members[self.index]} stopped waiting for rank "
                                   f"{self.members[member]} of its GPU: {reason}")
            time.sleep(NAP_SECONDS)

    def ordered(self) -> contextlib.AbstractContextManager:
        """Wrap a round: its GPU work goes on one stream of ours, ordered with the caller's."""
        return self._memory.ordered()

    def close(self) -> None:
        """Collective call on the members. After an abort it frees nothing: our streams may wait
        forever on a dead peer's event, so freeing (which synchronises) could hang; the parent
        stops a group whose member died, and the driver reclaims the memory with the process."""
        if self._closed or self._aborted() is not None:
            return
        self._closed = True
        self._memory.synchronize()
        mine = self.slots[self.index:self.index + 1]
        self._memory.release([s for i, s in enumerate(self.slots) if i != self.index])
        # A barrier through the flags alone: the function has returned, so the parent may already
        # be starting the next one and must not be asked for an exchange.
        self.new_round()
        self._flags[self.index * FLAG_STRIDE] = self.round
        for member in range(self.size):
            self._await_flag(member, self.round)
        self._memory.release(mine)                  # nobody maps our slot any more
        self.slots = []
        self._memory.close_events(self._event, [e for e in self._peer_events if e is not None])
