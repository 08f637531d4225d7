"""Compressed pseudo-gradients for DiLoCo's outer step (``--outer-dtype``), exchanged and averaged.

Each codec turns a float32 vector into what goes on the wire (``encode``), says what every peer will
decode from it (``decoded``, so the sender can carry the rounding error into its next exchange: error
feedback, harness/collectives/outer.py), and starts the exchange (``exchange``), which returns a
function that waits for it and gives the average over the ranks, in float32.

- ``fp32``: an all-reduce ("avg") of the vector itself: 4 bytes an element.
- ``bf16`` / ``fp16``: an all-reduce ("sum") in that dtype, divided after: 2 bytes an element.
- ``int8``: each chunk of ``CHUNK`` elements scaled by its largest magnitude to -127..127 and rounded;
  integers cannot be summed over ranks without overflow, so the ranks all-gather the bytes and the
  float32 scales and every rank decodes and averages them: 1 byte an element (plus 4 per chunk), and
  N-1 payloads received rather than an all-reduce's 2(N-1)/N, which suits the 2 to 8 hosts of slow links.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .base import Communicator

DTYPES = ("fp32", "bf16", "fp16", "int8")
CHUNK = 1024        # int8: elements sharing one scale


class Codec:
    name = "fp32"

    def encode(self, x: torch.Tensor) -> Any:
        return x.clone()

    def decoded(self, payload: Any) -> torch.Tensor:
        return payload

    def nbytes(self, payload: Any) -> int:
        return payload.nbytes

    def exchange(self, comm: Communicator, payload: Any) -> Callable[[], torch.Tensor]:
        work = comm.all_reduce(payload, op="avg", async_op=True)
        return lambda: (work.wait(), payload)[1]


class HalfCodec(Codec):
    def __init__(self, dtype: torch.dtype, name: str):
        self.dtype, self.name = dtype, name

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)

    def decoded(self, payload: torch.Tensor) -> torch.Tensor:
        return payload.float()

    def exchange(self, comm: Communicator, payload: torch.Tensor) -> Callable[[], torch.Tensor]:
        work = comm.all_reduce(payload, op="sum", async_op=True)
        return lambda: (work.wait(), payload.float().div_(comm.size))[1]


class Int8Codec(Codec):
    name = "int8"

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        chunks = torch.nn.functional.pad(x, (0, -x.numel() % CHUNK)).view(-1, CHUNK)
        scales = chunks.abs().amax(dim=1) / 127
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(chunks / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        return codes, scales, x.numel()

    def decoded(self, payload: tuple[torch.Tensor, torch.Tensor, int]) -> torch.Tensor:
        codes, scales, numel = payload
        return (codes.float() * scales[..., None]).flatten()[:numel]

    def nbytes(self, payload: tuple[torch.Tensor, torch.Tensor, int]) -> int:
        return payload[0].nbytes + payload[1].nbytes

    def exchange(self, comm: Communicator, payload: tuple[torch.Tensor, torch.Tensor, int]) -> Callable[[], torch.Tensor]:
        codes, scales, numel = payload
        every_code = torch.empty((comm.size, *codes.shape), dtype=torch.uint8, device=codes.device)
        every_scale = torch.empty((comm.size, *scales.shape), dtype=scales.dtype, device=scales.device)
        works = [comm.all_gather(every_code, codes.view(torch.uint8), async_op=True),
                 comm.all_gather(every_scale, scales, async_op=True)]

        def average() -> torch.Tensor:
            for work in works:
                work.wait()
            values = every_code.view(torch.int8).float() * every_scale[..., None]
            return values.mean(dim=0).flatten()[:numel]
        return average


def encode_with_feedback(codec: Codec, vectors: list[torch.Tensor], carry: list[torch.Tensor]) -> Any:
    """``vectors`` plus ``carry`` (what earlier encodings left out), flattened into one float32 vector and
    encoded; ``carry`` then holds what this encoding leaves out (error feedback: nothing is lost, only late)."""
    whole = torch.cat([v.float() + c for v, c in zip(vectors, carry)])
    payload = codec.encode(whole)
    left = whole - codec.decoded(payload)
    for c, piece in zip(carry, left.split([c.numel() for c in carry])):
        c.copy_(piece)
    return payload


def make_codec(dtype: str) -> Codec:
    if dtype not in DTYPES:
        raise ValueError(f"outer dtype '{dtype}': choose one of {', '.join(DTYPES)}")
    return {"fp32": Codec(), "bf16": HalfCodec(torch.bfloat16, "bf16"), "fp16": HalfCodec(torch.float16, "fp16"),
            "int8": Int8Codec()}[dtype]
