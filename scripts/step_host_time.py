"""Is a training step bound by the host (Python and kernel launches) or by the GPU, and what does each
piece of synchronisation cost on the host? Per rank: wall time per step against host time per step.

Each window runs ``--steps`` steps after a barrier; "host" is the time until the last step's call
returns, "wall" the time until the GPU has finished too. host ~ wall: the host is the bottleneck.
host < wall on some ranks only: those ranks waited on the GPU for slower ranks (a collective).

Variants (a name may be repeated with a suffix, e.g. ``none-again``, to see drift):
  none      TrainStep on FlatParameters, no synchronisation
  hooks     none + an empty post-accumulate-grad hook per parameter (the price of Python hooks)
  flat      one all-reduce of the flat gradient after backward
  bucketed  BucketedGradientAveraging (default 25 MB buckets)
  param8    parameter averaging every 8 steps
  ddp       torch DistributedDataParallel, as in bench_vs_ddp.py
  +fusedopt torch.optim.SGD(fused=True) per parameter instead of the default (foreach)
  +flatopt  fused SGD on the flat buffer as one parameter

    python scripts/step_host_time.py --gpus 4 --variants none flat param8 ddp none-again
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_vs_ddp import autocast_for, build, spec_for  # noqa: E402

BASES = ("none", "hooks", "flat", "bucketed", "param8", "ddp")


def make_step(variant: str, spec: dict, comm):
    """A step function for ``variant`` and the hooks to remove afterwards."""
    import torch
    from harness.flat import FlatParameters
    from harness.step import TrainStep
    from harness.sync import BucketedGradientAveraging, GradientAveraging, ParameterAveraging, Synchroniser
    from models import loss_fn
    model, optimizer, x, y = build(spec)
    flat = FlatParameters(model)
    if "fusedopt" in variant:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    if "flatopt" in variant:
        whole = torch.nn.Parameter(flat.params[0])
        whole.grad = flat.grads[0]
        optimizer = torch.optim.SGD([whole], lr=0.01, momentum=0.9, fused=True)
    base = next(b for b in BASES if variant.startswith(b))
    if base == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, device_ids=[0], gradient_as_bucket_view=True, static_graph=True)

        def ddp_step():
            loss = loss_fn(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return ddp_step, []
    sync = {"flat": lambda: GradientAveraging(comm, flat),
            "bucketed": lambda: BucketedGradientAveraging(comm, flat),
            "param8": lambda: ParameterAveraging(comm, flat, every=8)}.get(base, lambda: Synchroniser(comm, flat))()
    hooks = [p.register_post_accumulate_grad_hook(lambda p: None) for p in model.parameters()] if base == "hooks" else []
    train_step = TrainStep(model, optimizer, flat, sync, loss_fn, autocast_for(spec))
    done = [0]

    def step():
        train_step(x, y)
        done[0] += 1
        sync.after_step(done[0])
    return step, hooks


def worker(ctx, model_name: str, variants: list[str], windows: int, steps: int) -> dict:
    import torch
    from harness.comm.store import init_torch_distributed
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    comm = ctx.communicator()
    init_torch_distributed(ctx, "nccl")
    spec = spec_for(model_name)
    out = {}
    for variant in variants:
        comm.barrier()
        step, hooks = make_step(variant, spec, comm)
        for _ in range(20):
            step()
        walls, hosts = [], []
        for _ in range(windows):
            torch.cuda.synchronize()
            comm.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            host = time.perf_counter()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - start) / steps * 1e3)
            hosts.append((host - start) / steps * 1e3)
        out[variant] = (statistics.median(walls), statistics.median(hosts))
        for hook in hooks:
            hook.remove()
        del step
        torch.cuda.empty_cache()
    torch.distributed.destroy_process_group()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="steps per timed window")
    parser.add_argument("--variants", nargs="+", default=["none", "hooks", "flat", "bucketed", "param8", "ddp"])
    args = parser.parse_args()
    unknown = [v for v in args.variants if not v.startswith(BASES)]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; each must start with one of {', '.join(BASES)}")
    from harness import Parent
    with Parent() as parent:
        kids = parent.fork(args.gpus, gpus=list(range(args.gpus)))
        kids.exec(worker, args.model, args.variants, args.windows, args.steps)
        results = kids.wait()
    print(f"{args.model} on {args.gpus} GPUs, {args.windows} windows x {args.steps} steps; "
          "per rank: wall ms / host ms per step")
    for variant in args.variants:
        print(f"{variant:20} " + "  ".join(f"{r[variant][0]:.3f}/{r[variant][1]:.3f}" for r in results))


if __name__ == "__main__":
    main()
