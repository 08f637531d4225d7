"""Framing: Python objects <-> signed ZeroMQ frame lists.

A message travels as ``[signature + header, *buffers]``:

* ``header`` is a cloudpickle (protocol 5) of the object. Large contiguous buffers (numpy arrays,
  CPU torch tensors) are taken out of band as extra frames, so a 1 GiB array is sent from its own
  memory, not from a pickled copy, and received into the frame ZeroMQ already allocated.
* ``signature`` (the first 32 bytes) is HMAC-SHA256 under the run's key over the length-prefixed header and buffers.
  The receiver checks it before unpickling anything: unpickling an unauthenticated frame is
  remote code execution. Buffers of many MiB are hashed in chunks on a thread pool (hashlib
  releases the GIL) and the HMAC covers the chunk digests, which is as strong as SHA-256's
  collision resistance and several times faster on a many-core host.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import marshal
import os
import pickle
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import cloudpickle

KEY_BYTES = 32
SIGNATURE_BYTES = 32
IN_BAND_MAX = 64 * 1024          # smaller buffers stay inside the header: a frame costs more than a copy
CHUNK = 4 * 1024 * 1024          # unit of parallel hashing
PARALLEL_MIN = 4 * CHUNK         # below this, one sequential pass is faster than the pool

_pool: ThreadPoolExecutor | None = None


class BadSignature(Exception):
    """A frame set failed authentication; it was not unpickled."""


def new_key() -> bytes:
    import secrets
    return secrets.token_bytes(KEY_BYTES)


def _hash_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="wire-hash")
    return _pool


def _sha256(view: memoryview) -> bytes:
    return hashlib.sha256(view).digest()


def sign(key: bytes, frames: Sequence[Any]) -> bytes:
    """HMAC-SHA256 over length-prefixed frames; large frames enter as their chunk digests."""
    if len(frames) == 1 and (size := memoryview(frames[0]).nbytes) < IN_BAND_MAX:
        # A control message: the one-shot C digest costs a microsecond, the streaming object ten.
        return hmac.digest(key, size.to_bytes(8, "little") + frames[0], "sha256")
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        view = memoryview(frame).cast("B")
        mac.update(len(view).to_bytes(8, "little"))
        if len(view) < PARALLEL_MIN:
            mac.update(view)
        else:
            chunks = [view[i:i + CHUNK] for i in range(0, len(view), CHUNK)]
            mac.update(b"".join(_hash_pool().map(_sha256, chunks)))
    return mac.digest()


def _rebuild_tensor(buffer: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool,
                    parameter: bool = False) -> Any:
    import torch
    dt = getattr(torch, dtype)
    raw = memoryview(buffer).cast("B")
    if len(raw) == 0:
        tensor = torch.empty(shape, dtype=dt)
    else:
        tensor = torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(shape)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def _reduce_tensor(tensor: Any) -> tuple:
    """Send a tensor's bytes out of band. CUDA tensors arrive as CPU tensors (the parent has no GPU)."""
    data = tensor.detach().cpu().contiguous()
    raw = data.reshape(-1).view(__import__("torch").uint8).numpy()
    dtype = str(data.dtype).removeprefix("torch.")
    parameter = isinstance(tensor, __import__("torch").nn.Parameter)
    return _rebuild_tensor, (pickle.PickleBuffer(raw), dtype, tuple(data.shape), tensor.requires_grad, parameter)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")   # never import torch just to send a message
        if torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
            return _reduce_tensor(obj)
        if type(obj) is types.CodeType:
            # cloudpickle names the file of code it sends by value "<dynamic-code>", so a child's traceback
            # through the user's script would not say where; marshal keeps the file (both ends run one Python)
            return marshal.loads, (marshal.dumps(obj),)
        return super().reducer_override(obj)


_PLAIN = (type(None), bool, int, float, str, bytes)


def _is_plain(obj: Any) -> bool:
    """Control messages such as ("join", 3, None): the stdlib pickler does them 6x faster."""
    return type(obj) in _PLAIN or (type(obj) is tuple and all(type(x) in _PLAIN for x in obj))


def dumps(obj: Any) -> list[Any]:
    """Pickle ``obj`` into ``[header, *buffers]``; buffers are zero-copy views of the object's memory."""
    if _is_plain(obj):
        return [pickle.dumps(obj, protocol=5)]
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < IN_BAND_MAX:
            return True
        buffers.append(raw)
        return False

    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=out_of_band).dump(obj)
    return [stream.getbuffer(), *buffers]


class Sealed:
    """A value pickled by its sender for another child: the parent relays exchanges between children without
    opening them, so it never imports what they hold (torch, for a checkpoint's random generators). Its frames
    travel out of band in the message that carries it."""

    def __init__(self, frames: Sequence[Any]):
        self.frames = list(frames)

    @classmethod
    def of(cls, value: Any) -> "Sealed":
        return cls(dumps(value))

    def open(self) -> Any:
        return pickle.loads(self.frames[0], buffers=self.frames[1:])

    def __reduce__(self) -> tuple:
        return Sealed, ([pickle.PickleBuffer(frame) for frame in self.frames],)


def pack(key: bytes, obj: Any) -> list[Any]:
    header, *buffers = dumps(obj)
    return [sign(key, [header, *buffers]) + header, *buffers]


def unpack(key: bytes, frames: Sequence[Any]) -> Any:
    """Verify, then unpickle. Raises BadSignature without unpickling when the check fails."""
    views = [memoryview(f) for f in frames]
    if not views or views[0].nbytes <= SIGNATURE_BYTES:
        raise BadSignature(f"no signed header ({len(views)} frames)")
    signature, header = views[0][:SIGNATURE_BYTES], views[0][SIGNATURE_BYTES:]
    if not hmac.compare_digest(signature, sign(key, [header, *views[1:]])):
        raise BadSignature("signature mismatch")
    return pickle.loads(header, buffers=views[1:])
