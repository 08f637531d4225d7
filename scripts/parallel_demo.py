"""The Lua `parallel` examples, in Python: fork, exec, a yield/join loop ended by join("break"),
send/receive of arrays, and printing from children.

    python -m scripts.parallel_demo [--children 4]
"""
import argparse

import numpy as np

from harness import Parent


def worker(ctx):
    ctx.print(f"hello from child {ctx.rank} of {ctx.world_size}")
    step = 0
    while True:
        order = ctx.yield_(step)              # wait for the parent to join us
        if order == "break":
            break
        data = ctx.receive()                  # an array from the parent
        ctx.send(data.sum() * (ctx.rank + 1))
        step += 1
    ctx.print(f"child {ctx.rank} leaving after {step} steps")
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with Parent() as parent:
        kids = parent.fork(args.children)
        print(f"forked {len(kids)} children: pids {kids.pids}")
        kids.exec(worker)
        for step in range(args.steps):
            print(f"step {step}: children yielded {kids.join('continue')}")
            kids.send(np.ones(1000))
            print(f"step {step}: children sent back {kids.receive()}")
        print(f"children yielded {kids.join('break')}; told them to break")
        print(f"children returned {kids.wait()}")


if __name__ == "__main__":
    main()
