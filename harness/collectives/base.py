"""What every backend shares: argument checks and the public method set.

All checks run before any collective is entered, so a bad call raises on the calling rank
only; the control plane then tells the other ranks, whose collectives are aborted (NCCL) or
whose process is ended (gloo, whose sockets cannot be interrupted), so nobody waits forever.
Backends implement the underscored primitives on checked, contiguous tensors. A primitive
returns the backend's pending operation (gloo: a started ``Work``; NCCL: a launcher, since the
stream it goes on depends on ``async_op``) and ``_finish`` turns that into the caller's result.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

OPS = ("sum", "avg", "max", "min", "prod")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8)


class Work:
    """Handle of an asynchronous collective; ``wait()`` orders the caller after it."""

    def __init__(self, wait: Callable[[], None] = lambda: None):
        self._wait = wait
        self._done = False

    def wait(self) -> None:
        if not self._done:
            self._done = True
            self._wait()


class Communicator:
    backend = "base"
    device_type = "cpu"

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.aborted: str | None = None

    # -- public API --------------------------------------------------------------------------

    def all_reduce(self, t: torch.Tensor, op: str = "sum", out: torch.Tensor | None = None,
                   async_op: bool = False) -> Work | None:
        self._check(t, "t")
        self._check_op(op, t)
        if out is not None:
            self._check_out(out, t, t.numel())
        return self._finish(self._all_reduce(t, out if out is not None else t, op), async_op)

    def broadcast(self, t: torch.Tensor, root: int = 0, async_op: bool = False) -> Work | None:
        self._check(t, "t")
        self._check_root(root)
        return self._finish(self._broadcast(t, root), async_op)

    def reduce(self, t: torch.Tensor, root: int = 0, op: str = "sum", out: torch.Tensor | None = None,
               async_op: bool = False) -> Work | None:
        """The result lands in ``out`` (or ``t``) on ``root`` only; other ranks' buffers are unchanged."""
        self._check(t, "t")
        self._check_op(op, t)
        self._check_root(root)
        if out is not None:
            self._check_out(out, t, t.numel())
        return self._finish(self._reduce(t, out if out is not None else t, op, root), async_op)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor, async_op: bool = False) -> Work | None:
        """``out`` holds every rank's ``t`` in rank order (``size * t.numel()`` elements)."""
        self._check(t, "t")
        self._check_out(out, t, self.size * t.numel())
        return self._finish(self._all_gather(out, t), async_op)

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str = "sum",
                       async_op: bool = False) -> Work | None:
        """Reduce ``t`` over ranks; rank r keeps chunk r (``out.numel() == t.numel() / size``)."""
        self._check(t, "t")
        self._check_op(op, t)
        if t.numel() % self.size:
            raise ValueError(f"reduce_scatter: t has {t.numel()} elements, not divisible by {self.size} ranks")
        self._check_out(out, t, t.numel() // self.size)
        return self._finish(self._reduce_scatter(out, t, op), async_op)

    def shift(self, out: torch.Tensor, t: torch.Tensor, async_op: bool = False) -> Work | None:
        """A ring shift: ``t`` goes to rank + 1, ``out`` receives rank - 1's (modulo the size; a world
        of one copies). --zero's replica of each shard on the next rank is kept this way."""
        self._check(t, "t")
        self._check_out(out, t, t.numel())
        if self.size == 1:
            out.copy_(t)
            return Work() if async_op else None
        return self._finish(self._shift(out, t), async_op)

    def barrier(self) -> None:
        """Returns on every rank once all ranks have reached it."""
        self.check_alive()
        self._barrier()

    def abort(self, reason: str = "aborted") -> None:
        """Make pending and future collectives fail; safe to call from another thread."""
        if self.aborted is None:
            self.aborted = reason
            self._abort()

    def close(self) -> None:
        """Release the communicator; called for you when the child's function returns."""
        self._close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- checks --------------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise if this communicator was aborted; also before work that uses it outside its own
        methods (a CUDA graph's replay of its collectives)."""
        if self.aborted is not None:
            raise RuntimeError(f"{self.backend} communicator of rank {self.rank} was aborted: {self.aborted}")

    def _check(self, t: Any, name: str) -> None:
        self.check_alive()
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != self.device_type:
            raise ValueError(f"{name} is on {t.device} but the {self.backend} backend needs "
                             f"{self.device_type} tensors; move it with .to(ctx.device)")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in DTYPES)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous; pass {name}.contiguous() (collectives need one buffer)")

    def _check_out(self, out: Any, t: torch.Tensor, numel: int) -> None:
        self._check(out, "out")
        if out.dtype != t.dtype:
            raise TypeError(f"out has dtype {out.dtype} but t has {t.dtype}; they must match")
        if out.numel() != numel:
            raise ValueError(f"out has {out.numel()} elements; this collective needs {numel}")

    def _check_op(self, op: Any, t: torch.Tensor) -> None:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not supported; choose one of {', '.join(OPS)}")
        if op == "avg" and not t.is_floating_point():
            raise TypeError(f"op='avg' needs a floating-point tensor, got {t.dtype}; use 'sum' and divide")

    def _check_root(self, root: Any) -> None:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root={root!r} is out of range: ranks are 0..{self.size - 1}")

    def _finish(self, pending: Any, async_op: bool) -> Work | None:
        if async_op:
            return pending
        pending.wait()
        return None

    # -- backend primitives: each returns a pending operation for _finish ------------------------

    def _all_reduce(self, t: torch.Tensor, out: torch.Tensor, op: str) -> Any: raise NotImplementedError
    def _broadcast(self, t: torch.Tensor, root: int) -> Any: raise NotImplementedError
    def _reduce(self, t: torch.Tensor, out: torch.Tensor, op: str, root: int) -> Any: raise NotImplementedError
    def _all_gather(self, out: torch.Tensor, t: torch.Tensor) -> Any: raise NotImplementedError
    def _reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> Any: raise NotImplementedError
    def _shift(self, out: torch.Tensor, t: torch.Tensor) -> Any: raise NotImplementedError
    def _barrier(self) -> None: raise NotImplementedError
    def _abort(self) -> None: raise NotImplementedError
    def _close(self) -> None: raise NotImplementedError
