"""What one push and pull of --mode async costs a GPU worker, piece by piece, for a model of N parameters.

A round of async mode stops the worker's inner steps for: its pseudo-gradient (anchor - parameters on the
device, copied to the host), the trip to the parent (framing and signing, harness/control/wire.py, then the
ZeroMQ socket), the server's outer step and the copy of the anchor it answers with
(harness/collectives/server.py), the trip back, and the answer copied into the device's anchor and
parameters. Each piece is timed alone here (the median of ``--repeats``), so that the figure of a whole
round in a training run (its progress records) can be taken apart.

    python -m scripts.bench.exchange --params 124000000 --out bench/results/DATE-DEVICE/exchange.json
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable

from scripts.bench.common import bench_record, write_json


def timed(piece: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """The median seconds of ``piece`` over ``repeats`` calls, after one untimed call."""
    piece()
    sync()
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        piece()
        sync()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def round_trip(ctx, repeats: int) -> None:
    """A child's side of ``transport``: send what it receives straight back."""
    for _ in range(repeats + 1):
        ctx.send(ctx.receive())


def transport(vectors: list, repeats: int) -> float:
    """Parent to child and back through the harness's channel, the path of a push and its answer."""
    from harness import Parent
    with Parent() as parent:
        kids = parent.fork(1)
        kids.exec(round_trip, repeats)

        def trip():
            kids.send(vectors)
            kids.receive()
        seconds = timed(trip, repeats)
        kids.wait()
    return seconds


def server_step(vectors: list, dtype: str, repeats: int) -> float:
    """One worker's push applied by the server and answered (fp32: the anchor whole; else the encoded change)."""
    from harness.collectives.compress import make_codec
    from harness.collectives.outer import OuterOptimizer
    from harness.collectives.server import ParameterServer, Plan
    from harness.collectives.wire import Wire
    wire = Wire(make_codec(dtype))
    server = ParameterServer(1, OuterOptimizer(), 100, 1, Plan(100 * (repeats + 2)), wire=wire)
    server.join(0, {"anchor": [v.clone() for v in vectors], "momentum": None, "version": 0})
    carry = [v.new_zeros(v.shape) for v in vectors] if wire.compressed else None
    pushes = iter(range(100, 100 * (repeats + 2), 100))
    return timed(lambda: server.push(0, next(pushes), 100, wire.send(vectors, carry) if carry else vectors), repeats)


def device_pieces(n: int, repeats: int) -> dict[str, float]:
    """The worker's own pieces on its GPU: the pseudo-gradient to the host (pageable, as the worker copies it,
    and into pinned memory), and an answer from the host into the anchor and the parameters."""
    import torch
    anchor, params = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    served = torch.randn(n)
    sync = torch.cuda.synchronize

    def adopt():
        anchor.copy_(served)
        params.copy_(anchor)
    return {"pseudo_gradient_s": timed(lambda: (anchor - params).cpu(), repeats, sync),
            "pseudo_gradient_pinned_s": timed(lambda: pinned.copy_(anchor - params), repeats, sync),
            "adopt_s": timed(adopt, repeats, sync)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=124_000_000, help="model parameters (default GPT-2's 124M)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args()
    import torch
    from harness.control import wire
    vectors = [torch.randn(args.params)]
    key = wire.new_key()
    pieces = {"torch_threads": torch.get_num_threads(),
              "sign_s": timed(lambda: wire.sign(key, wire.dumps(vectors)), args.repeats),
              "transport_s": transport(vectors, args.repeats),
              **{f"server_{dtype}_s": server_step(vectors, dtype, args.repeats) for dtype in ("fp32", "bf16")}}
    if torch.cuda.is_available():
        pieces.update(device_pieces(args.params, args.repeats))
    write_json(args.out, bench_record(params=args.params, fp32_bytes=4 * args.params, **pieces))
    print(pieces)


if __name__ == "__main__":
    main()
