"""Port of the seed's parallel-nccl.lua: every child fills its send buffer with its rank (the lead,
rank 0, holds 10 for Broadcast), runs each collective and prints expected against received.
Exits non-zero on any mismatch. GPU children use NCCL, CPU children gloo.

    python -m scripts.collectives_demo                  # 4 CPU workers
    python -m scripts.collectives_demo --gpus all       # one worker per GPU
    python -m scripts.collectives_demo --gpus 0,1 --workers 2
"""
import argparse
import sys

from harness import Parent
from harness.launch.placement import resolve_gpus

N = 8
LEAD_VALUE = 10.0


def demo(ctx):
    import torch
    comm = ctx.communicator()
    rank, size, dev = ctx.rank, ctx.world_size, ctx.device
    total = size * (size - 1) / 2
    send = lambda: torch.full((N,), float(rank), device=dev)  # noqa: E731
    rows = []

    def record(name, expected, got):
        rows.append((name, expected, got.tolist()))

    recv = torch.zeros(N, device=dev)
    comm.reduce(send(), root=0, out=recv)
    record("Reduce (out of place)", [total] * N if rank == 0 else [0.0] * N, recv)
    buf = send()
    comm.reduce(buf, root=0)
    record("Reduce (in place)", [total] * N if rank == 0 else [float(rank)] * N, buf)
    recv = torch.zeros(N, device=dev)
    comm.all_reduce(send(), out=recv)
    record("AllReduce (out of place)", [total] * N, recv)
    buf = send()
    comm.all_reduce(buf)
    record("AllReduce (in place)", [total] * N, buf)
    buf = torch.full((N,), LEAD_VALUE if rank == 0 else float(rank), device=dev)
    comm.broadcast(buf, root=0)
    record("Broadcast", [LEAD_VALUE] * N, buf)
    recv = torch.zeros(N * size, device=dev)
    comm.all_gather(recv, send())
    record("AllGather", [float(r) for r in range(size) for _ in range(N)], recv)
    recv = torch.zeros(N // size if N % size == 0 else 1, device=dev)
    full = torch.full((recv.numel() * size,), float(rank), device=dev)
    comm.reduce_scatter(recv, full)
    record("ReduceScatter", [total] * recv.numel(), recv)
    return comm.backend, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default=None, help="'all' or comma-separated GPU indices; default: CPU workers")
    parser.add_argument("--workers", type=int, default=None, help="number of workers (default: one per GPU, or 4)")
    args = parser.parse_args()
    gpus = resolve_gpus(args.gpus)
    workers = args.workers or len(gpus) or 4
    failures = 0
    with Parent() as parent:
        kids = parent.fork(workers, gpus=gpus or None)
        kids.exec(demo)
        for rank, (backend, rows) in enumerate(kids.wait()):
            for name, expected, got in rows:
                ok = expected == got
                failures += not ok
                print(f"[{backend}] rank {rank} {name:26} expected {expected[:4]}... got {got[:4]}... "
                      f"{'OK' if ok else 'MISMATCH'}")
    print(f"{'all collectives match' if not failures else f'{failures} mismatches'} ({workers} workers)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
