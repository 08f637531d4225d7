"""Collectives for several workers per GPU: combine on the GPU through CUDA IPC, then NCCL among leaders.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the workers sharing a GPU form a
local group (comm/ipc.py) whose first rank, the leader, is the only one in the NCCL communicator
across GPUs. A collective is one *round* for the group:

1. every member copies its input into its slot and publishes the round;
2. the leader waits for every member's slot, combines them into its own slot, runs the NCCL
   collective on that, and publishes the result;
3. every member waits for the result and copies its part out of the leader's slot.

Everything stays on the GPU and is ordered by CUDA events; the host only waits for the flags that
say an event was recorded. A member cannot overwrite its slot before the leader read it (its next
copy is queued behind its wait for the leader's result), nor the leader its slot before every
member copied the result out (the leader's next round waits for the members' next publication,
which they make after copying out). The same protocol runs on the CPU over shared memory and gloo,
which is how CI tests it.

A round's GPU work goes on the communicator's own stream, which first waits for the caller's
stream and which the caller's stream then waits for: the cross-process ordering above holds only
if each process uses one stream for every round, whatever stream the caller (or autograd, in a
gradient hook) is on. ``async_op=True`` returns a handle that is already complete on the host. all_gather and
reduce_scatter are built on the all-reduce (zero-padded, or then sliced), which moves more bytes
than necessary (and turns -0.0 into 0.0 in all_gather); training needs only all_reduce and
broadcast. "avg" sums in the tensor's dtype and then divides.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import torch

from .base import Communicator, Work
from .ipc import CudaIpcMemory, HostMemory, LocalGroup

_COMBINE = {"sum": torch.Tensor.add_, "avg": torch.Tensor.add_, "prod": torch.Tensor.mul_,
            "max": lambda acc, x: torch.maximum(acc, x, out=acc), "min": lambda acc, x: torch.minimum(acc, x, out=acc)}


class _Leaders:
    """The context as the leaders' communicator sees it: leaders renumbered 0..G-1, exchanges among them."""

    def __init__(self, ctx: Any, leaders: list[int]):
        self._ctx, self._ranks = ctx, leaders
        self.rank, self.world_size = leaders.index(ctx.rank), len(leaders)
        self.gpu, self.device, self.host, self.address = ctx.gpu, ctx.device, ctx.host, ctx.address

    def exchange(self, tag: str, value: Any) -> list:
        return self._ctx.exchange(tag, value, ranks=self._ranks)

    def unique_tag(self, prefix: str) -> str:
        return self._ctx.unique_tag("leaders/" + prefix)      # counted apart from the whole group's tags

    def on_abort(self, hook: Callable[[str], None]) -> Callable[[], None]:
        return self._ctx.on_abort(hook)


def local_groups(keys: Sequence[Hashable]) -> list[list[int]]:
    """Ranks with equal keys (e.g. GPU ids) form a group; groups in order of their first rank."""
    groups: dict[Hashable, list[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


class HierarchicalCommunicator(Communicator):
    """Collective call on every child. ``keys[r]`` names rank r's group (its GPU): ranks with equal
    keys share memory; ``backend`` ("nccl" or "gloo") connects the groups' leaders."""

    graph_safe = False      # rounds wait on host flags: a captured CUDA graph would replay none of that

    def __init__(self, ctx: Any, keys: Sequence[Hashable], backend: str = "nccl"):
        super().__init__(ctx.rank, ctx.world_size)
        if len(keys) != ctx.world_size:
            raise ValueError(f"keys has {len(keys)} entries; it needs one per rank ({ctx.world_size})")
        self.backend = f"{backend} with shared-memory groups"
        self.device_type = "cuda" if backend == "nccl" else "cpu"
        groups = local_groups(keys)
        members = next(g for g in groups if ctx.rank in g)
        prefix = f"group{members[0]}/"
        if backend == "nccl":
            torch.cuda.set_device(ctx.device)
        memory = CudaIpcMemory() if backend == "nccl" else HostMemory()
        self.group = LocalGroup(ctx.rank, members, memory,
                                lambda tag, value: ctx.exchange(ctx.unique_tag(prefix + tag), value, ranks=members),
                                lambda: self.aborted)
        self.leaders: Communicator | None = None
        if self.group.index == 0 and len(groups) > 1:
            if backend == "nccl":
                from .nccl import NcclCommunicator as Outer
            else:
                from .gloo import GlooCommunicator as Outer
            self.leaders = Outer(_Leaders(ctx, [g[0] for g in groups]))
        self._group_of = {rank: i for i, g in enumerate(groups) for rank in g}
        self._remove_hook = ctx.on_abort(self.abort)

    # -- one round: members -> leader -> (leaders' collective) -> members ---------------------------

    def _run(self, t: torch.Tensor, result_numel: int, leader_work: Callable[[torch.Tensor], None],
             deliver: Callable[[torch.Tensor], None] | None, contributes: bool = True) -> Work:
        """``leader_work(acc)`` fills the leader's slot (``result_numel`` elements) from the members'
        slots; ``deliver(result)`` copies this rank's part out of it."""
        group = self.group
        group.new_round()
        group.reserve(max(t.numel(), result_numel) * t.element_size())
        with group.ordered():
            if group.index == 0:
                for member in range(1, group.size):
                    group.acquire(member)
                leader_work(group.slot(0, t.dtype, result_numel))
                group.publish()
            else:
                if contributes:
                    group.slot(group.index, t.dtype, t.numel()).copy_(t.view(-1))
                group.publish()
                group.acquire(0)
            if deliver is not None:
                deliver(group.slot(0, t.dtype, result_numel))
        self.check_alive()
        return Work()

    def _member_input(self, member: int, t: torch.Tensor) -> torch.Tensor:
        """On the leader: a member's input of this round (the leader's own is ``t`` itself)."""
        return t.view(-1) if member == 0 else self.group.slot(member, t.dtype, t.numel())

    def _reduce_into(self, acc: torch.Tensor, t: torch.Tensor, op: str) -> None:
        acc.copy_(t.view(-1))
        for member in range(1, self.group.size):
            _COMBINE[op](acc, self._member_input(member, t))
        if self.leaders is not None:
            self.leaders.all_reduce(acc, op="sum" if op == "avg" else op)
        if op == "avg":
            acc.div_(self.size)

    # -- primitives ----------------------------------------------------------------------------

    def _all_reduce(self, t, out, op):
        return self._run(t, t.numel(), lambda acc: self._reduce_into(acc, t, op),
                         lambda result: out.view(-1).copy_(result))

    def _reduce(self, t, out, op, root):
        deliver = (lambda result: out.view(-1).copy_(result)) if self.rank == root else None
        return self._run(t, t.numel(), lambda acc: self._reduce_into(acc, t, op), deliver)

    def _reduce_scatter(self, out, t, op):
        chunk = out.numel()
        return self._run(t, t.numel(), lambda acc: self._reduce_into(acc, t, op),
                         lambda result: out.view(-1).copy_(result[self.rank * chunk:(self.rank + 1) * chunk]))

    def _broadcast(self, t, root):
        root_group = self._group_of[root]

        def leader_work(acc: torch.Tensor) -> None:
            if root in self.group.members:
                acc.copy_(self._member_input(self.group.members.index(root), t))
            if self.leaders is not None:
                self.leaders.broadcast(acc, root=root_group)
        deliver = None if self.rank == root else (lambda result: t.view(-1).copy_(result))
        return self._run(t, t.numel(), leader_work, deliver, contributes=self.rank == root)

    def _all_gather(self, out, t):
        n = t.numel()

        def leader_work(acc: torch.Tensor) -> None:
            acc.zero_()                         # zero-padded: the all-reduce adds one value to zeros in each place
            for member, rank in enumerate(self.group.members):
                acc[rank * n:(rank + 1) * n].copy_(self._member_input(member, t))
            if self.leaders is not None:
                self.leaders.all_reduce(acc)
        return self._run(t, self.size * n, leader_work, lambda result: out.view(-1).copy_(result))

    def _barrier(self) -> None:
        token = torch.zeros(1, device=self.device_type)
        self.all_reduce(token)
        if self.device_type == "cuda":
            torch.cuda.current_stream().synchronize()
        self.check_alive()

    def _abort(self) -> None:
        if self.leaders is not None:
            self.leaders.abort(self.aborted or "aborted")

    def _close(self) -> None:
        # The abort hook stays until the group is closed: closing waits for the other members,
        # and only an abort ends that wait when one of them failed.
        if self.device_type == "cuda" and self.aborted is None:
            torch.cuda.synchronize()        # rounds ran on the group's stream: finish them before NCCL goes
        try:
            if self.leaders is not None:
                self.leaders.close()
        finally:
            try:
                self.group.close()
            finally:
                self._remove_hook()
