"""What a worker builds from a TrainConfig: its data, model, optimizer, synchroniser and batches.

Every rank builds the same model from the same seed; the parent builds it too, on the meta device, to
check the options (harness/training/checks.py), and Test.py builds it to evaluate a checkpoint.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import torch

from harness.collectives.async_worker import AsyncSynchroniser
from harness.collectives.flat import FlatParameters
from harness.collectives.compress import make_codec
from harness.collectives.outer import OuterOptimizer, OuterSynchroniser
from harness.collectives.server import ParameterServer, Plan
from harness.collectives.shards import Replica, ShardedGradients, ShardLayout
from harness.collectives.sync import BucketedGradientAveraging, GradientAveraging, ParameterAveraging, Synchroniser
from harness.collectives.wire import Wire
from harness.data.bad_samples import RunCount
from harness.data.batch import Batch, call_model
from harness.data.pipeline import ResidentBatches, StreamedBatches, is_streamed
from harness.training.config import TrainConfig
from harness.training.losses import Loss
from harness.training.optim import build_optimizer, rate_on_device, zero_momentum
from harness.training.step import make_capturable


def load_data(config: TrainConfig) -> Any:
    """The run's train / validation / test splits (``datasets.Data``); streamed ones are only scanned."""
    from harness.checkout.datasets import open_data
    return open_data(config.dataset, config.data_dir, seed=config.seed, val_fraction=config.val_fraction,
                     **config.dataset_options)


def make_model(config: TrainConfig, info: Any, device: torch.device) -> torch.nn.Module:
    """The run's model, initialised from its seed (every rank builds the same one)."""
    from harness.checkout.models import build_model
    torch.manual_seed(config.seed)
    model = build_model(config.model, info, **config.model_options).to(device)
    if device.type == "cuda" and info.kind == "image":
        model = model.to(memory_format=torch.channels_last)
    return model


def make_optimizer(config: TrainConfig, params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    """The run's optimizer over ``params``: the model's, or this rank's shards of them (--zero)."""
    optimizer = build_optimizer(config.optimizer, params, lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay, nesterov=config.nesterov, impl=config.optimizer_impl)
    if device.type == "cuda":       # one arithmetic for Adam-like optimizers, eager or graphed
        make_capturable(optimizer)
    rate_on_device(optimizer)
    zero_momentum(optimizer)
    return optimizer


def autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """--amp's autocast (fp16 also scales the loss: harness/training/scaling.py). No cache of cast
    weights: a CUDA graph would replay stale ones."""
    if config.amp:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[config.amp]
        return torch.autocast(device.type, dtype=dtype, cache_enabled=False)
    return contextlib.nullcontext()


def outer_optimizer(config: TrainConfig) -> OuterOptimizer:
    """--outer-optimizer with its defaults: lr 0.7 and momentum 0.9 for nesterov (DiLoCo's), lr 1 for average."""
    nesterov = config.outer_optimizer == "nesterov"
    return OuterOptimizer(config.outer_optimizer, config.outer_lr or (0.7 if nesterov else 1.0),
                          config.outer_momentum if config.outer_momentum is not None else (0.9 if nesterov else 0.0))


def make_server(config: TrainConfig, steps_per_epoch: int) -> ParameterServer:
    """--mode async's parameter server, which the parent runs (harness/collectives/server.py). Its plan counts
    updates of all workers together: the run's (--max-steps, or --epochs' worth) times N, validations every
    --validate-every (else every epoch's) worth, checkpoints every --save-every epochs' and
    --save-every-steps' worth."""
    n = config.workers
    total = config.total_updates(steps_per_epoch)
    save_every = tuple(n * every for every in (config.save_every * steps_per_epoch, config.save_every_steps) if every)
    plan = Plan(n * total, n * (config.validate_every or steps_per_epoch), save_every, saves=bool(config.save))
    return ParameterServer(n, outer_optimizer(config), config.avg_every, config.max_staleness, plan,
                           ahead=config.outer_delay, past_bad_limit=RunCount(config.max_bad_samples).past,
                           wire=Wire(make_codec(config.outer_dtype)))


def flat_gradients(config: TrainConfig, world: int) -> bool:
    """Whether the gradients go into flat buffers (FlatParameters): only where grad mode averages or shards
    them, over more than one worker or with --zero 1 (whose world of one still runs the sharded path). Not
    with --zero 2, which keeps only its shard of them; not in param or async mode, which exchange parameters;
    not for a world of one that averages nothing. Those steps let autograd hand its gradients over, as a plain
    loop's does, and save an add kernel a parameter a micro-batch and a zeroing of the buffer an update."""
    averaged = config.mode == "grad" and (world > 1 or config.zero > 0)
    return averaged and config.zero < 2


def fused_accumulation(config: TrainConfig, flat: FlatParameters) -> bool:
    """Whether the micro-batches' gradients add up inside the compiled backward (harness/training/accumulation.py):
    compiled, more than one micro-batch an update, autograd's own gradients (not flat buffers), and no --zero 2,
    whose hooks reduce-scatter each micro-batch's gradient and so must see it alone."""
    return config.compile and config.grad_accum > 1 and not flat.flatten_grads and config.zero == 0


def make_synchroniser(config: TrainConfig, comm: Any, flat: FlatParameters,
                      optimizer: torch.optim.Optimizer, shards: ShardLayout | None = None,
                      report: Callable[[dict], None] | None = None, replica: Replica | None = None,
                      ctx: Any = None, served: dict | None = None, model: torch.nn.Module | None = None,
                      held: list[torch.Tensor] | None = None,
                      place: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)) -> Synchroniser:
    """A world of one has nothing to average: the base Synchroniser does nothing (no gradient hooks,
    no collectives), so one worker steps as a plain loop does; except with --zero, whose optimizer
    updates ``shards`` (then a world of one runs the sharded path, one piece a bucket), and param mode's
    outer optimizer (DiLoCo's outer momentum works on one worker too). ``report``: rank 0's outer_sync records;
    ``replica``: --zero's copy of the previous rank's shard, when the group heals in place; ``ctx`` and
    ``served`` (a checkpoint's server state), ``held`` (the anchor this rank saved) and ``place`` (where the rank
    stands in its data): --mode async's worker, which talks to the parent's server; ``model``: the
    model whose forward --zero's all-gathers overlap (not under --compile: the hooks that wait would break its graph)."""
    if flat.flatten_grads != flat_gradients(config, comm.size):
        raise ValueError(f"flat gradients {'kept' if flat.flatten_grads else 'not kept'} for a world of {comm.size} "
                         f"that {'does not need' if flat.flatten_grads else 'needs'} them (flat_gradients)")
    if config.mode == "async":
        return AsyncSynchroniser(flat, ctx.rank, ctx.world_size, ctx,
                                 lambda: ctx.interrupted, served, Wire(make_codec(config.outer_dtype)), held, place)
    if shards is not None:
        return ShardedGradients(comm, flat, shards, config.zero, replica, model=None if config.compile else model)
    if config.outer:
        return OuterSynchroniser(comm, flat, config.avg_every, outer_optimizer(config), make_codec(config.outer_dtype),
                                 config.fragments, config.outer_delay, report)
    if comm.size == 1:
        return Synchroniser(comm, flat)
    if config.mode == "param":
        return ParameterAveraging(comm, flat, config.avg_every, optimizer if config.avg_optimizer_state else None)
    if config.grad_sync == "flat":
        return GradientAveraging(comm, flat)
    reduce_dtype = torch.bfloat16 if config.reduce_dtype == "bf16" else None
    return BucketedGradientAveraging(comm, flat, config.bucket_mb, reduce_dtype)


def make_batches(split: Any, config: TrainConfig, rank: int, world: int, device: torch.device) -> Any:
    """An update's batches: with --grad-accum K, K micro-batches in one, which the step cuts apart. Rank r
    takes positions r, r+N, ... of the epoch's order, so the N workers' K micro-batches together are
    exactly one worker's batch of N*K*b."""
    batch = config.batch_size * config.grad_accum
    if is_streamed(split):
        return StreamedBatches(split, rank, world, batch, config.seed, device, config.data_workers)
    return ResidentBatches(split, rank, world, batch, config.seed, device)


def model_loss(model: torch.nn.Module, loss: Loss) -> Callable[[Batch], torch.Tensor]:
    """``batch -> loss(model on batch, batch)``: what the training step calls, and what --compile
    compiles, loss included, so that the compiler fuses the loss into the model's last layer (a
    language model's cross-entropy then never holds its logits in float32)."""
    def compute(batch: Batch) -> torch.Tensor:
        return loss(call_model(model, batch), batch)
    return compute


def model_output_loss(model: torch.nn.Module, loss: Loss) -> Callable[[Batch], tuple[Any, torch.Tensor]]:
    """``batch -> (the model's output, its loss)``: what validation calls. --compile compiles it too (a graph
    of its own: no gradients, eval mode), so that validating a language model does not hold its logits in
    float32 either; eagerly, that is the largest allocation of a run whose step is graphed."""
    def forward(batch: Batch) -> tuple[Any, torch.Tensor]:
        out = call_model(model, batch)
        return out, loss(out, batch)
    return forward
