"""One training step, eager or replayed from a CUDA graph.

``TrainStep`` runs forward, backward, the synchroniser and the optimizer as ordinary calls.
``GraphedTrainStep`` captures that same step once, after warm-up, in a CUDA graph and replays it:
one launch instead of hundreds, which is what small models need (their step is shorter than the
CPU time spent launching its kernels). Capture needs static shapes and addresses, so the batch is
copied into fixed input tensors before each replay. The gradient all-reduce is captured too: NCCL
kernels go on the capturing stream, and the bucket side stream forks from and joins back into it.
Warm-up runs on a side stream, as graph capture requires, and also creates the optimizer's state
(momentum buffers) before capture so that their addresses are fixed. Then it is undone
(``Rewind``), so a graphed run trains exactly as an eager one: same updates, same checkpoints.

With ``accum=K`` (--grad-accum) a step is one update from K micro-batches: the batch it is given
(K times the per-worker batch) is cut into K chunks, each chunk's loss is divided by K and
backpropagated, and only the last backward synchronises (``Synchroniser.no_sync``). Graphed, the
whole update, all K forward and backward passes, is one graph.

``make_step`` decides: ``cuda_graph=None`` (Train.py's default) graphs wherever it can (GPU workers,
an optimizer without host-side state, a communicator without host signalling, a model that
captures) and otherwise runs eagerly, saying why once; ``True`` is the same, asked for by name;
``False`` never graphs.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
from typing import Any, Callable

import torch

from harness.collectives.flat import FlatParameters
from harness.data.batch import Batch, chunk, copy_into, tensors, tree_map
from harness.collectives.sync import Synchroniser

WARMUP_STEPS = 3
# Updates a GPU worker that heals may have queued on the device ahead of the host (harness/resilience/heal.py).
HEAL_DEPTH = int(os.environ.get("HARNESS_HEAL_DEPTH", "2"))


class InFlight:
    """At most ``depth`` updates queued on the device: each call records the end of the update just
    issued and waits for the one ``depth`` updates back. Why a healing worker bounds it: a CUDA graph
    lets the host queue replay after replay, each with its collectives, and all of them run after a
    peer's death. Unbounded, survivors of GPT-2 died of "illegal memory access" right after the peer's
    SIGKILL (5 of 6 kills on 2 x H200); bounded at 2, 8 of 8 healed. The likely reason: the driver frees
    a dead process's memory, and an NCCL kernel started afterwards may write into it through NVLink (a
    sender with credits writes before it looks at the abort flag). With two in flight the device does
    not wait for the host, which issues a replay in microseconds (no cost measured on GPT-2)."""

    def __init__(self, depth: int):
        self.depth, self._ends = depth, collections.deque()

    def __call__(self) -> None:
        end = torch.cuda.Event()
        end.record()
        self._ends.append(end)
        if len(self._ends) > self.depth:
            self._ends.popleft().synchronize()      # releases the GIL: the heartbeat thread goes on


class TrainStep:
    """``model``: the module whose state a graph's warm-up puts back; ``compute(batch)``: the loss of a
    (micro-)batch, the model's forward and the loss in one call (compiled together under --compile).
    A batch is an (x, y) pair, a dict or a tuple of tensors (harness/data/batch.py)."""

    static = False      # whether every update replays the forward of the first (a graph's: Synchroniser.before_forward)

    def __init__(self, model: torch.nn.Module, compute: Callable[[Batch], torch.Tensor],
                 optimizer: torch.optim.Optimizer, flat: FlatParameters, sync: Synchroniser,
                 autocast: Callable[[], Any], clip: float | None = None, accum: int = 1, ticket: Any = None,
                 scaler: Any = None):
        self.model, self.compute, self.optimizer, self.flat, self.sync = model, compute, optimizer, flat, sync
        self.autocast, self.clip, self.accum = autocast, clip, accum
        self.scaler = scaler        # --amp fp16: the loss scale (harness/training/scaling.py)
        self.ticket = ticket        # a GPU worker that heals: the update applies only if it completed (heal.Ticket)
        self.in_flight = InFlight(HEAL_DEPTH) if ticket is not None else None
        self.grad_norm: torch.Tensor | None = None     # before clipping, of the last update (with ``clip``)

    def __call__(self, batch: Batch) -> torch.Tensor:
        """One update; returns the (detached) mean loss without synchronising the device (a worker that
        heals waits for the update ``HEAL_DEPTH`` back)."""
        loss = self.run(batch)
        if self.in_flight is not None:
            self.in_flight()
        return loss

    def run(self, batch: Batch) -> torch.Tensor:
        """Issue one update: forward, backward, synchronisation, the optimizer's step."""
        self.sync.zero_grad()
        self.sync.before_forward(self.static)
        parts = [batch] if self.accum == 1 else chunk(batch, self.accum)
        loss = None
        for index, part in enumerate(parts):     # only the last micro-batch's backward synchronises
            with self.sync.no_sync() if index < len(parts) - 1 else contextlib.nullcontext():
                part_loss = self.backward(part)
            loss = part_loss if loss is None else loss + part_loss
        self.sync.after_backward()
        grads, followers = self.sync.update_grads(), self.sync.follower_grads()
        if self.scaler is not None:     # unscaled before clipping; an overflowing update is skipped
            self.scaler.unscale_(grads + followers, self.sync.combine)
        if self.clip is not None:
            self.grad_norm = clip_grad_norm(grads, self.clip, self.sync.combine, followers)
        self.sync.before_step()
        if self.ticket is not None:     # after the last collective the step reads (sharded: norm and flag)
            self.ticket.punch()
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.step()
        self.sync.after_update()
        return loss

    def release(self) -> None:
        """Let go of what holds the communicator's collectives (a graph does; an eager step, nothing)."""

    def backward(self, batch: Batch) -> torch.Tensor:
        """Forward and backward on one (micro-)batch, accumulating into the flat gradients."""
        with self.autocast():
            loss = self.compute(batch)
        if self.accum > 1:
            loss = loss / self.accum
        self.sync.before_backward()
        (loss if self.scaler is None else self.scaler.scaled(loss)).backward()
        return loss.detach()


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float,
                   combine: Callable[[torch.Tensor, str], None] | None = None,
                   followers: list[torch.Tensor] = ()) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on the gradients the optimizer reads (the flat buffers, a few; or
    autograd's own, one a parameter), with multi-tensor kernels and no host synchronisation, so a CUDA graph
    captures it. Returns the global norm before clipping. ``combine``: where ``grads`` are this rank's
    shards, the squared norm is summed over the ranks (one all-reduce of a scalar), so every rank clips by
    the same norm. ``followers`` are scaled alike without counting in the norm (another rank's shard,
    replicated). On CPUs the squares are summed in float64: a sum in float32 depends on how the gradients
    are cut (whole buffers, or --zero's pieces) and on the CPU's vector width, and a clipping scale that
    differs in its last bit grows, within ten AdamW updates of an MLP, past what equal runs may differ by (1e-6);
    in float64 the scale comes out the same. On GPUs the float64 copy would cost memory and time."""
    dtype = torch.float64 if grads[0].device.type == "cpu" else torch.float32
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2, dtype=dtype)))
    if combine is not None:
        square = norm * norm
        combine(square, "sum")
        norm = square.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in (*grads, *followers):
        by_dtype.setdefault(g.dtype, []).append(g)
    for kind, group in by_dtype.items():
        torch._foreach_mul_(group, scale.to(kind))
    return norm


def _aside(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in host memory."""
    return tensor.detach().to("cpu", copy=True)


class Rewind:
    """What warm-up updates change, put back afterwards: parameters and buffers, the optimizers' state
    (the rank's, and --zero's replica's), ``tensors`` outside the model that they update (the replica's
    own parameters), and the random generators. State an optimizer created during warm-up (its first step's
    momentum or Adam moments) is zeroed in place, not dropped: the graph holds its address, and zero
    is what the step after it computes from (fresh Adam moments are zeros; SGD's momentum without
    dampening becomes the gradient either way). The weights are copied to host memory: a GPU copy (GPT-2:
    474 MB) was held through the warm-up's largest activations and made the run's peak (--zero 2 on 2 x
    H200: 15266 MB, 14708 without it). The optimizer state there is (a resumed or healed worker's) stays on
    the GPU: 1.4 GB of GPT-2's weights and AdamW moments took 1.2 s to copy out and back through pageable
    host memory against 5 ms on the GPU, which would have slowed every heal by as much."""

    def __init__(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                 tensors: list[torch.Tensor] = ()):
        self.model, self.optimizers, self.tensors = model, optimizers, list(tensors)
        self.weights = {k: _aside(v) for k, v in model.state_dict().items()}
        self.kept = [_aside(t) for t in self.tensors]
        self.state = [{p: {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
                       for p, state in optimizer.state.items()} for optimizer in optimizers]
        self.rng = torch.get_rng_state(), torch.cuda.get_rng_state()

    @torch.no_grad()
    def restore(self) -> None:
        for k, v in self.model.state_dict().items():
            v.copy_(self.weights[k])
        for t, kept in zip(self.tensors, self.kept):
            t.copy_(kept)
        for optimizer, saved in zip(self.optimizers, self.state):
            self._restore(optimizer, saved)
        torch.set_rng_state(self.rng[0])
        torch.cuda.set_rng_state(self.rng[1])

    @staticmethod
    def _restore(optimizer: torch.optim.Optimizer, saved: dict) -> None:
        for p, state in optimizer.state.items():
            before = saved.get(p, {})
            for k, v in list(state.items()):
                if torch.is_tensor(v):
                    v.copy_(before[k]) if k in before else v.zero_()
                elif k in before:
                    state[k] = before[k]
                else:
                    del state[k]


class GraphedTrainStep(TrainStep):
    static = True

    def __init__(self, *args: Any, example: Batch, **options: Any):
        """Warm up (real updates, with real collectives, on every rank alike), undo them; ``capture`` next."""
        super().__init__(*args, **options)
        self.batch = tree_map(torch.Tensor.clone, example)       # the graph's inputs, at fixed addresses
        followers = self.sync.follower_optimizers()
        rewind = Rewind(self.model, [self.optimizer, *followers],
                        [p for follower in followers for group in follower.param_groups for p in group["params"]])
        applied = self.ticket.count.clone() if self.ticket is not None else None
        scaled = self.scaler.state_dict() if self.scaler is not None else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                super().run(self.batch)
        torch.cuda.current_stream().wait_stream(side)
        rewind.restore()
        if applied is not None:         # warm-up's updates were undone: not applied after all
            self.ticket.count.copy_(applied)
        if scaled is not None:          # and the loss scale they moved
            self.scaler.load_state_dict(scaled)
        self.flat.zero_grad()           # warm-up's gradients too, where autograd's own are kept (a world of one)
        torch.cuda.empty_cache()        # warm-up's activations: the graph allocates its own
        self.graph = torch.cuda.CUDAGraph()

    def capture(self) -> None:
        """Record one step. Nothing runs while recording, collectives included, so a rank whose
        capture fails has not fallen out of step with the others. Thread-local capture: only this
        thread's CUDA calls must be capturable, not those that other threads of the process (the
        loaders' pin-memory thread) make meanwhile."""
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.loss = super().run(self.batch)

    def run(self, batch: Batch) -> torch.Tensor:
        shapes = [t.shape for t in tensors(batch)]
        if shapes != [t.shape for t in tensors(self.batch)]:
            raise ValueError(f"a batch of shapes {shapes} under a CUDA graph captured for "
                             f"{[t.shape for t in tensors(self.batch)]}: its inputs must keep their shapes; "
                             "pass --no-cuda-graph")
        copy_into(self.batch, batch)
        self.sync.comm.check_alive()        # the graph holds the communicator's collectives
        self.graph.replay()
        return self.loss

    def release(self) -> None:
        """Free the graph. NCCL ties a communicator's resources to each graph that captured its
        collectives and lets go of them when the graph goes, so a graph must go before its
        communicator is destroyed: after it, freeing the graph touched freed memory (SIGSEGV on
        2 x H200), and destroying a live communicator first waited on the graph for ever."""
        self.graph.reset()


def make_step(model, compute, optimizer, flat, sync, autocast, cuda_graph: bool | None = None,
              example: Batch | None = None, say: Callable[[str], None] = print,
              clip: float | None = None, accum: int = 1, ticket: Any = None, scaler: Any = None) -> TrainStep:
    """A graphed step where possible (``cuda_graph`` None or True; see the module's docstring),
    otherwise an eager one, with a message saying why (asked for by name, even on the CPU).
    ``clip``: clip the averaged gradients to this global norm before the optimizer's step.
    ``accum``: micro-batches per update (the batches given are ``accum`` times the micro-batch).
    ``ticket``: heal.Ticket, the guard of a GPU worker's updates when the group heals in place.
    ``scaler``: scaling.LossScaler, --amp fp16's loss scale."""
    args = (model, compute, optimizer, flat, sync, autocast)
    eager = functools.partial(TrainStep, *args, clip=clip, accum=accum, ticket=ticket, scaler=scaler)
    if cuda_graph is False:
        return eager()
    if example is None or tensors(example)[0].device.type != "cuda":
        if cuda_graph:
            say("--cuda-graph needs GPU workers; running eagerly")
        return eager()
    if not getattr(optimizer, "graph_safe", True):
        say(f"CUDA graph: {type(optimizer).__name__} keeps host-side state a graph would freeze; running eagerly")
        return eager()
    if not getattr(sync.comm, "graph_safe", True):
        say("CUDA graph: workers sharing a GPU signal each other from the host, which a graph cannot "
            "replay; running eagerly")
        return eager()
    for each in (optimizer, *sync.follower_optimizers()):
        make_capturable(each)
    step = GraphedTrainStep(*args, example=example, clip=clip, accum=accum, ticket=ticket, scaler=scaler)
    problem = None
    try:
        step.capture()
    except Exception as error:          # capture refuses some models (host syncs, dynamic shapes)
        problem = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    captured = torch.tensor([0 if problem else 1], device=tensors(example)[0].device)
    sync.comm.all_reduce(captured, op="min")       # every rank graphed, or none: steps must pair up
    if captured.item():
        return step
    sync.reset()
    say(f"CUDA graph: this model could not be captured on every rank ({problem or 'failed on another rank'}); "
        "running eagerly (--no-cuda-graph skips the attempt)")
    return eager()


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Adam-like optimizers keep their step count on the host unless ``capturable``: move it to the
    parameters' device, as a graph needs (the update's arithmetic is the same)."""
    for group in optimizer.param_groups:
        if group.get("capturable") is False:
            group["capturable"] = True
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device)
