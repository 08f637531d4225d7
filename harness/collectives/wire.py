"""What the asynchronous server's pushes and pulls carry (``--mode async --outer-dtype``).

A push is a worker's pseudo-gradient; a pull is the anchor the server answers with. At fp32 both go as
they are: the push as fp32 tensors, the pull as the anchor itself, so ``--max-staleness 0`` is
synchronous DiLoCo bit for bit. With a compressed dtype both go through the codecs of
harness/collectives/compress.py, flattened into one vector (1 byte an element for int8, 2 for bf16 and
fp16, against 4), because on a slow link the exchange, a push and then a pull, is what a worker waits for:

- a push carries its rounding error into the worker's next push (error feedback, as param mode's
  exchanges do: harness/collectives/outer.py);
- a pull carries the change of the anchor since what that worker holds (the server's *view* of it);
  both sides add the decoded change, so the worker's anchor is the server's view of it exactly, and what
  rounding left out (anchor - view) goes with the next pull. The join of a new run and the run's end send
  the anchor itself; a checkpoint's or a stop's release sends the change as any answer does (so a run
  stopped and resumed is the uninterrupted one bit for bit). The checkpoint keeps the server's anchor, and
  each worker's own state its view, which its join brings back (the checkpoint's model is rank 0's view:
  the anchor within a rounding of its last change).
"""
from __future__ import annotations

from typing import Any

import torch

from .compress import Codec, encode_with_feedback


def _moved(payload: Any, device: torch.device | str) -> Any:
    """A codec's payload (a tensor, or a tuple holding tensors) on ``device``."""
    if isinstance(payload, tuple):
        return tuple(_moved(part, device) for part in payload)
    return payload.to(device) if isinstance(payload, torch.Tensor) else payload


class Wire:
    """Encodes pushes and pulls with ``codec`` (an fp32 codec sends them as they are)."""

    def __init__(self, codec: Codec):
        self.codec = codec

    @property
    def compressed(self) -> bool:
        return self.codec.name != "fp32"

    def send(self, vectors: list[torch.Tensor], carry: list[torch.Tensor] | None = None) -> Any:
        """``vectors`` (plus ``carry``, the error left out before) as one encoded vector, on the host;
        ``carry`` then holds what this encoding leaves out."""
        payload = encode_with_feedback(self.codec, vectors, carry) if carry is not None else \
            self.codec.encode(torch.cat([v.float() for v in vectors]))
        return _moved(payload, "cpu")

    def received(self, payload: Any, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """The vectors ``send`` encoded, decoded in float32 on the device of ``like`` and cut to its sizes."""
        decoded = self.codec.decoded(_moved(payload, like[0].device))
        return list(decoded.split([t.numel() for t in like]))

    def nbytes(self, payload: Any) -> int:
        return self.codec.nbytes(payload)
