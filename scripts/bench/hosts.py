"""Time to first step across hosts: this harness's one command against torchrun's multi-node recipe.

The hosts are Linux network namespaces on this machine, each with its own address and its own real
sshd (tests/helpers/netns_hosts.py, as the CI tests use them; needs root). Both sides start the same number
of CPU workers per host over the same ssh, and do the same work once started: build the same model,
wrap it (DDP, or this harness's flat buffers and bucketed gradient averaging), and take one step
(forward, backward with its gradient all-reduce over gloo, optimizer step). The clock runs from the
launch to the end of rank 0's first step.

- harness: one command on this machine (``--first-step-run harness``): its Parent starts every
  worker over ssh with torch preloaded, as ``Train.py --launcher ssh --hosts ...`` does.
- torchrun: its multi-node recipe is one command per host (``torchrun --nnodes H --node-rank K
  --master-addr <first host> ...``); all of them are started here at the same moment, over ssh.
  gloo is told each host's interface (GLOO_SOCKET_IFNAME), as a user of torchrun must.

The two alternate, ``--repeats`` times each; the medians are compared.

    sudo python -m scripts.bench.hosts --hosts 3 --per-host 2 --repeats 5 --out bench/results/DATE-DEVICE/first-step-hosts.json
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import (FIRST_STEP, ROOT, bench_record, first_step_stamp, module_command, subprocess_env,
                                  write_json)
from tests.helpers.netns_hosts import Hosts, why_not

RUN_TIMEOUT = 300


def first_step(comm: Any = None) -> None:
    """Build the model, wrap it (both wrappers first make every replica rank 0's), take one step.
    Without ``comm`` (a harness communicator): DDP under torchrun."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.functional.cross_entropy
    if comm is None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        loss_fn(model(x), y).backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"{FIRST_STEP} {time.time()}", flush=True)
        dist.destroy_process_group()
        return
    import contextlib
    from harness.collectives.flat import FlatParameters
    from harness.training.build import model_loss
    from harness.training.losses import default_loss
    from harness.training.step import TrainStep
    from harness.collectives.sync import BucketedGradientAveraging
    flat = FlatParameters(model)
    sync = BucketedGradientAveraging(comm, flat)
    sync.start()
    TrainStep(model, model_loss(model, default_loss), optimizer, flat, sync, contextlib.nullcontext)((x, y))


def harness_first_step(ctx: Any) -> float:
    """Runs in each harness worker: the step, and when it ended."""
    first_step(ctx.communicator())
    return time.time()


def run_harness(hosts: str) -> None:
    """Entry point of the harness's timed command: one Parent, every worker started over ssh."""
    from harness import Parent
    with Parent() as parent:
        kids = parent.fork(sum(int(h.rsplit(":", 1)[1]) for h in hosts.split(",")), launcher="ssh", hosts=hosts,
                           preload=("torch",))      # as Train.py's workers preload it
        kids.exec(harness_first_step)
        print(f"{FIRST_STEP} {kids.wait()[0]}", flush=True)


def time_harness(made: Hosts, per_host: int) -> float:
    hosts = ",".join(f"{address}:{per_host}" for address in made.addresses)
    start = time.time()
    out = subprocess.run(module_command(__spec__.name, "--first-step-run", "harness", "--host-list", hosts),
                         capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT,
                         env=subprocess_env(HARNESS_SSH=made.ssh))
    if out.returncode != 0:
        raise RuntimeError(f"the harness's run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return first_step_stamp(out.stdout, "the harness") - start


def time_torchrun(made: Hosts, per_host: int, port: int) -> float:
    nodes = len(made.addresses)
    ssh = made.ssh.split()
    commands = []
    for rank, address in enumerate(made.addresses):
        interface = f"{made.bridge}p{rank}"     # the namespace's end of its veth pair (tests/helpers/netns_hosts.py)
        torchrun = module_command("torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(rank),
                                  "--nproc-per-node", str(per_host), "--master-addr", made.addresses[0],
                                  "--master-port", str(port), "-m", __spec__.name, "--first-step-run", "ddp")
        commands.append(f"cd {shlex.quote(str(ROOT))} && GLOO_SOCKET_IFNAME={interface} "
                        f"PYTHONPATH={shlex.quote(str(ROOT))} OMP_NUM_THREADS=1 {shlex.join(torchrun)}")
    start = time.time()
    runs = [subprocess.Popen([*ssh, "-T", address, command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for address, command in zip(made.addresses, commands)]
    try:
        outputs = [run.communicate(timeout=RUN_TIMEOUT) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    failed = [(i, run.returncode, err) for i, (run, (_, err)) in enumerate(zip(runs, outputs)) if run.returncode]
    if failed:
        raise RuntimeError(f"torchrun failed on host {failed[0][0]} ({failed[0][1]}):\n{failed[0][2][-3000:]}")
    return first_step_stamp(outputs[0][0], "torchrun") - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3, help="network namespaces, each a host with its own sshd")
    parser.add_argument("--per-host", type=int, default=2, help="workers on each host")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--first-step-run", choices=("harness", "ddp"), help=argparse.SUPPRESS)
    parser.add_argument("--host-list", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_step_run == "harness":
        return run_harness(args.host_list)
    if args.first_step_run == "ddp":
        return first_step()

    reason = why_not()
    if reason:
        sys.exit(f"scripts.bench.hosts: cannot make hosts as network namespaces here: {reason}")
    times: dict[str, list[float]] = {"harness": [], "torchrun": []}
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        made = Hosts(Path(tmp), args.hosts)
        try:
            for repeat in range(args.repeats):
                times["harness"].append(time_harness(made, args.per_host))
                times["torchrun"].append(time_torchrun(made, args.per_host, 29500 + repeat))
                print(f"run {repeat + 1}/{args.repeats}: harness {times['harness'][-1]:.2f} s, "
                      f"torchrun {times['torchrun'][-1]:.2f} s", flush=True)
        finally:
            made.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"time to first step, {args.hosts} hosts x {args.per_host} CPU workers (gloo), median of {args.repeats}: "
          f"harness {medians['harness']:.2f} s, torchrun multi-node {medians['torchrun']:.2f} s "
          f"(harness / torchrun {medians['harness'] / medians['torchrun']:.2f})")
    if args.out:
        write_json(args.out, bench_record(
            hosts=args.hosts, workers_per_host=args.per_host, backend="gloo", transport="socket", seconds=times,
            median_s=medians, harness_vs_torchrun=medians["harness"] / medians["torchrun"]))


if __name__ == "__main__":
    main()
