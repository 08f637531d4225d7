"""Control-plane benchmark (not a test): this harness against multiprocessing Pipes, same run.

* join/yield round trip with N children: the parent joins, every child yields back (median).
* throughput: send a SIZE MiB numpy array to each of N children and receive it back.
* for reference, the floor of the transport: bare pyzmq ROUTER/DEALER over ipc doing the same
  join/yield round trip with no signing, no pickling and no supervision.

    python -m scripts.bench.control [--children 4] [--mib 256] [--rounds 200] [--json out.json]
"""
import argparse
import multiprocessing as mp
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from harness import Parent
from scripts.bench.common import bench_record, write_json


def harness_child(ctx, rounds, transfers):
    for _ in range(rounds + 1):
        ctx.yield_()
    for _ in range(transfers):
        ctx.send(ctx.receive())


def pipe_child(conn, rounds, transfers):
    for _ in range(rounds + 1):
        conn.recv()
        conn.send(None)
    for _ in range(transfers):
        conn.send(conn.recv())


def zmq_child(endpoint, rank, rounds):
    import zmq
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, str(rank).encode())
    socket.connect(endpoint)
    socket.send(b"hello")
    for _ in range(rounds + 1):
        socket.recv()
        socket.send(b"yield")


def time_bare_zmq(n, rounds):
    import tempfile
    import zmq
    endpoint = f"ipc://{tempfile.mkdtemp()}/bench"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(endpoint)
    procs = [mp.get_context("spawn").Process(target=zmq_child, args=(endpoint, r, rounds)) for r in range(n)]
    for proc in procs:
        proc.start()
    for _ in range(n):
        router.recv_multipart()
    latencies = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        for r in range(n):
            router.send_multipart([str(r).encode(), b"join"])
        for _ in range(n):
            router.recv_multipart()
        latencies.append(time.perf_counter() - start)
    for proc in procs:
        proc.join()
    router.close()
    return statistics.median(latencies[1:])


def time_harness(n, rounds, arrays):
    with Parent() as parent:
        kids = parent.fork(n)
        kids.exec(harness_child, rounds, len(arrays))
        kids.join()                               # warm up: every child is running
        latencies = []
        for _ in range(rounds):
            start = time.perf_counter()
            kids.join()
            latencies.append(time.perf_counter() - start)
        seconds = []
        for arr in arrays:
            start = time.perf_counter()
            kids.send(arr)
            back = kids.receive()
            seconds.append(time.perf_counter() - start)
            assert all(np.array_equal(b, arr) for b in back)
        kids.wait()
    return statistics.median(latencies), seconds


def time_pipes(n, rounds, arrays):
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(n):
        here, there = ctx.Pipe()
        proc = ctx.Process(target=pipe_child, args=(there, rounds, len(arrays)))
        proc.start()
        pipes.append(here)
        procs.append(proc)
    for p in pipes:
        p.send(None)
    for p in pipes:
        p.recv()
    latencies = []
    for _ in range(rounds):
        start = time.perf_counter()
        for p in pipes:
            p.send(None)
        for p in pipes:
            p.recv()
        latencies.append(time.perf_counter() - start)
    seconds = []
    for arr in arrays:
        start = time.perf_counter()
        for p in pipes:
            p.send(arr)
        back = [p.recv() for p in pipes]
        seconds.append(time.perf_counter() - start)
        assert all(np.array_equal(b, arr) for b in back)
    for proc in procs:
        proc.join()
    return statistics.median(latencies), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--transfers", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.random(args.mib * 2**20 // 8) for _ in range(args.transfers)]
    moved = 2 * args.children * args.mib * 2**20          # each array goes to every child and back
    results = {}
    for name, run in (("multiprocessing", time_pipes), ("harness", time_harness)):
        latency, seconds = run(args.children, args.rounds, arrays)
        results[name] = {"join_yield_median_us": latency * 1e6, "transfer_median_s": statistics.median(seconds),
                         "throughput_GBps": moved / statistics.median(seconds) / 1e9}
    results["bare pyzmq (reference)"] = {"join_yield_median_us": time_bare_zmq(args.children, args.rounds) * 1e6}
    results["ratio"] = {
        "latency (multiprocessing / harness)": results["multiprocessing"]["join_yield_median_us"]
        / results["harness"]["join_yield_median_us"],
        "throughput (harness / multiprocessing)": results["harness"]["throughput_GBps"]
        / results["multiprocessing"]["throughput_GBps"],
    }
    results["setup"] = {"children": args.children, "mib": args.mib, "rounds": args.rounds,
                        "transfers": args.transfers, "machine": platform.machine(),
                        "cpus": mp.cpu_count(), "python": platform.python_version()}
    print(f"{'':17}{'join/yield median':>20}{f'{args.mib} MiB x {args.children} out+back':>28}")
    for name in ("multiprocessing", "harness"):
        r = results[name]
        print(f"{name:17}{r['join_yield_median_us']:>17.1f} us{r['transfer_median_s']:>17.3f} s "
              f"({r['throughput_GBps']:.2f} GB/s)")
    print(f"{'bare pyzmq':17}{results['bare pyzmq (reference)']['join_yield_median_us']:>17.1f} us"
          "   (transport floor: no signing, pickling or supervision)")
    for label, value in results["ratio"].items():
        print(f"ratio {label}: {value:.2f}")
    if args.json:
        write_json(args.json, bench_record(**results))


if __name__ == "__main__":
    main()
