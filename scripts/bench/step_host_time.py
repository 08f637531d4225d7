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
  ddp       torch DistributedDataParallel, as in scripts/bench/vs_ddp.py
  +fusedopt torch.optim.SGD(fused=True) per parameter instead of the default (foreach)
  +flatopt  fused SGD on the flat buffer as one parameter

    python -m scripts.bench.step_host_time --gpus 4 --variants none flat param8 ddp none-again
"""
from __future__ import annotations

import argparse

from scripts.bench.common import join, spec_for, time_windows
from scripts.bench.vs_ddp import make_variant

BASES = {"none": "independent", "hooks": "independent", "flat": "harness-flat", "bucketed": "harness",
         "param8": "harness-param8", "ddp": "ddp"}     # this script's name: vs_ddp.py's variant


def make_step(variant: str, spec: dict, comm):
    """vs_ddp.py's step for ``variant``'s base, with its extras; returns (step, what to keep
    alive, hooks to remove afterwards)."""
    import torch
    base = next(b for b in BASES if variant.startswith(b))
    step, keep = make_variant(BASES[base], spec, comm)
    extras = [e for e in ("fusedopt", "flatopt") if e in variant]
    if base == "ddp":
        if extras:
            raise ValueError(f"{variant}: +fusedopt and +flatopt apply to the harness's own steps, not to ddp")
        return step, keep, []
    model, train_step = keep
    if "fusedopt" in extras:
        train_step.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    if "flatopt" in extras:
        whole = torch.nn.Parameter(train_step.flat.params[0])
        whole.grad = train_step.flat.grads[0]
        train_step.optimizer = torch.optim.SGD([whole], lr=0.01, momentum=0.9, fused=True)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: None) for p in model.parameters()] if base == "hooks" else []
    return step, keep, hooks


def worker(ctx, model_name: str, variants: list[str], windows: int, steps: int) -> dict:
    import statistics

    import torch
    comm = join(ctx)
    spec = spec_for(model_name)
    out = {}
    for variant in variants:
        comm.barrier()
        step, keep, hooks = make_step(variant, spec, comm)
        walls, hosts = time_windows(step, 20, windows, steps, before_window=comm.barrier)
        out[variant] = (statistics.median(walls) * 1e3, statistics.median(hosts) * 1e3)
        for hook in hooks:
            hook.remove()
        del step, keep
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
    unknown = [v for v in args.variants if not v.startswith(tuple(BASES))]
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
