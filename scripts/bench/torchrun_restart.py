"""What torchrun does about a dead worker, timed beside healing in place (scripts/soak_heal.py).

torchrun's elastic agent answers a dead worker by stopping every worker and starting them all
again (``--max-restarts``); the new workers resume from the last checkpoint the training script
wrote. This runs that, the way a torchrun + DDP user writes it: one process per GPU, DDP, rank 0
saving a checkpoint every --save-every steps with torch.save, every start resuming from it. The
model and its synthetic batch are scripts/bench/common.py's, so the figures sit beside the
harness's. A worker (not rank 0) gets SIGKILL --kills times, each once training has gone on after
the last restart (after a random number of updates, up to --save-every). One JSON row per kill: restart_s (from the kill to the end of the first update
after the restart, which includes the new workers' start-up, NCCL set-up and the checkpoint load)
and steps_lost (updates done before the kill that the restart must redo).

    python -m scripts.bench.torchrun_restart --gpus 2 --model resnet50 --kills 3 --out rows.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from scripts.bench.common import (ROOT, append_jsonl, autocast_for, bench_record, build, module_command, spec_for,
                                  subprocess_env)


def worker(model: str, steps: int, save_every: int, work: Path) -> None:
    """One torchrun worker: resume from ``work``/ckpt.pt if it is there, train to ``steps``, rank 0
    logs each update ("restart step time") and saves every ``save_every`` updates."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from harness.checkout.models import loss_fn
    local = int(os.environ["LOCAL_RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.cuda.set_device(local)
    (work / f"pid-{restart}-{local}").write_text(str(os.getpid()))
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    spec = spec_for(model)
    net, optimizer, x, y = build(spec)
    checkpoint, step = work / "ckpt.pt", 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cuda", weights_only=False)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    net = DistributedDataParallel(net, device_ids=[local], gradient_as_bucket_view=True)
    autocast = autocast_for(spec)
    rank = dist.get_rank()
    with open(work / "steps.log", "a") as log:
        while step < steps:
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0:
                loss.item()     # the update is done when it is logged
                log.write(f"{restart} {step} {time.time()}\n")
                log.flush()
                if step % save_every == 0:
                    tmp = checkpoint.with_suffix(".tmp")
                    torch.save({"model": net.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
                    os.replace(tmp, checkpoint)
    dist.destroy_process_group()


def logged(work: Path) -> list[tuple[int, int, float]]:
    path = work / "steps.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(r), int(s), float(t)) for r, s, t in (line.split() for line in lines if line.count(" ") == 2)]


def measure(gpus: int, model: str, kills: int, steps: int, save_every: int,
            report: Callable[[dict], None] = print, time_limit: float = 540) -> list[dict]:
    """The rows, each also given to ``report`` as soon as it is measured; after ``time_limit`` s the run
    is ended and torchrun's stderr shown."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="torchrun-restart-") as tmp:
        work = Path(tmp)
        command = module_command("torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                                 f"--max-restarts={kills}", "-m", __spec__.name, "--worker", "--model", model,
                                 "--steps", str(steps), "--save-every", str(save_every), "--work", str(work))
        # stderr to a file, not a pipe: nobody reads a pipe during the run, and once it is full torchrun
        # and its workers block on their next message
        errors = (work / "stderr.log").open("w+")
        run = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=errors,
                               start_new_session=True)
        deadline, rng = time.monotonic() + time_limit, random.Random(0)
        for restart in range(kills):
            wait = rng.randint(1, save_every)
            while run.poll() is None and time.monotonic() < deadline:
                mine = [s for r, s, _ in logged(work) if r == restart]
                if len(mine) >= wait and (work / f"pid-{restart}-1").exists():
                    break
                time.sleep(0.05)
            if run.poll() is not None or time.monotonic() >= deadline:
                break
            last = max(s for r, s, _ in logged(work) if r == restart)
            killed = time.time()
            os.kill(int((work / f"pid-{restart}-1").read_text()), signal.SIGKILL)
            while run.poll() is None and time.monotonic() < deadline \
                    and not any(r == restart + 1 for r, _, _ in logged(work)):
                time.sleep(0.05)
            after = [(s, t) for r, s, t in logged(work) if r == restart + 1]
            if not after:
                break
            rows.append({"model": model, "gpus": gpus, "launcher": "torchrun", "kill": restart + 1,
                         "restart_s": after[0][1] - killed, "steps_lost": last - (after[0][0] - 1)})
            report(rows[-1])
        if run.poll() is None:      # what is left of the run is not measured
            os.killpg(run.pid, signal.SIGKILL)
            for pid_file in work.glob("pid-*"):     # torchrun starts each worker in a session of its own
                pid = int(pid_file.read_text())
                try:
                    if str(work).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():   # not a reused pid
                        os.kill(pid, signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        run.wait()
        errors.seek(0)
        err = errors.read()
        if len(rows) < kills:
            raise RuntimeError(f"torchrun's run ended after {len(rows)} of {kills} kills:\n{err[-3000:]}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--model", default="resnet50", help="a scripts/bench/common.py model: mlp, resnet50, gpt2-124m")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--steps", type=int, default=100000, help="the run's length (it is ended once the kills are measured)")
    p.add_argument("--save-every", type=int, default=100, help="rank 0 saves every this many updates")
    p.add_argument("--out", default=None, help="append the JSON rows to this file")
    p.add_argument("--time-limit", type=float, default=540, help="end the run after this many seconds")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.model, args.steps, args.save_every, Path(args.work))
        return
    def report(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if args.out:
            append_jsonl(args.out, bench_record(**row))
    measure(args.gpus, args.model, args.kills, args.steps, args.save_every, report, args.time_limit)


if __name__ == "__main__":
    main()
