"""The worker's training loop: one readable loop, run in every child by Train.py.

Each rank builds the same model from the same seed, trains on its shard (positions r, r+N, ...
of one seeded permutation per epoch, so N workers with batch b see exactly the samples one
worker with batch N*b would), and keeps in step through a Synchroniser. Rank 0 reports
progress to the parent with ``ctx.send`` and writes checkpoints; validation and the epoch's
loss are reduced over all ranks, so every rank takes the same early-stopping decision.

A run lasts ``--epochs`` or ``--max-steps`` updates and may be saved every N steps, mid-epoch.
A checkpoint records (epoch, step, position in the epoch) and every rank's random generators, so
"train 1000 steps" equals "train 600, stop, resume, train 400": the data order and each sample's
augmentation are functions of (seed, epoch, index) (harness/data/pipeline.py), not of the run's history.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import signal
import time
from typing import Any, Iterable

import torch

from harness.control import timeline
from harness.resilience.checkpoint import load_checkpoint, rng_state, set_rng_state
from harness.collectives import ncclstop
from harness.collectives.flat import FlatParameters
from harness.resilience.heal import Ticket, Where, hand_over, rejoin, rewind
from harness.resilience.interrupt import StopVote
from .metrics import worker_memory_mb
from .optim import build_optimizer, load_optimizer_state
from harness.data.pipeline import ResidentBatches, StreamedBatches, evaluation_batches, is_streamed
from harness.resilience.saver import BackgroundSaver
from .schedule import is_constant, learning_rate
from .step import make_capturable, make_step
from harness.collectives.sync import BucketedGradientAveraging, GradientAveraging, ParameterAveraging, Synchroniser

REPORT_EVERY_S = 0.5        # rank 0 sends a progress record at most this often
MEMORY_EVERY_S = 5.0        # and measures its memory (worker and loader processes) at most this often


def load_data(config: dict) -> Any:
    """The run's train / validation / test splits (``datasets.Data``); streamed ones are only scanned."""
    from harness.checkout.datasets import open_data
    return open_data(config["dataset"], config["data_dir"], seed=config["seed"],
                     val_fraction=config["val_fraction"], **config["dataset_options"])


def make_model(config: dict, info: Any, device: torch.device) -> torch.nn.Module:
    """The run's model, initialised from its seed (every rank builds the same one)."""
    from harness.checkout.models import build_model
    torch.manual_seed(config["seed"])
    model = build_model(config["model"], info, **config["model_options"]).to(device)
    if device.type == "cuda" and info.kind == "image":
        model = model.to(memory_format=torch.channels_last)
    return model


def build(config: dict, info: Any, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model(config, info, device)
    optimizer = build_optimizer(config["optimizer"], model.parameters(), lr=config["lr"],
                                momentum=config["momentum"], weight_decay=config["weight_decay"],
                                nesterov=config["nesterov"], impl=config["optimizer_impl"])
    if device.type == "cuda":       # one arithmetic for Adam-like optimizers, eager or graphed
        make_capturable(optimizer)
    return model, optimizer


def autocast(config: dict, device: torch.device):
    if config["amp"] == "bf16":     # no cache of cast weights: a CUDA graph would replay stale ones
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             config: dict, device: torch.device) -> tuple[float, float, int]:
    """(summed loss, correct predictions, predictions counted) over the batches."""
    from harness.checkout.models import loss_fn
    was_training = model.training
    model.eval()
    loss = correct = count = 0.0
    for xb, yb in batches:
        with autocast(config, device):
            out = model(xb)
        loss += loss_fn(out.float(), yb).item() * len(xb)
        correct += (out.argmax(-1) == yb).sum().item()
        count += yb.numel()
    model.train(was_training)
    return loss, correct, count


def make_synchroniser(config: dict, comm: Any, flat: FlatParameters, optimizer: torch.optim.Optimizer) -> Synchroniser:
    if config["mode"] == "param":
        return ParameterAveraging(comm, flat, config["avg_every"], optimizer if config["avg_optimizer_state"] else None)
    if config["grad_sync"] == "flat":
        return GradientAveraging(comm, flat)
    reduce_dtype = torch.bfloat16 if config["reduce_dtype"] == "bf16" else None
    return BucketedGradientAveraging(comm, flat, config["bucket_mb"], reduce_dtype)


def make_batches(split: Any, config: dict, rank: int, world: int, device: torch.device) -> Any:
    """An update's batches: with --grad-accum K, K micro-batches in one, which the step cuts apart. Rank r
    takes positions r, r+N, ... of the epoch's order, so the N workers' K micro-batches together are
    exactly one worker's batch of N*K*b."""
    batch = config["batch_size"] * config["grad_accum"]
    if is_streamed(split):
        return StreamedBatches(split, rank, world, batch, config["seed"], device, config["data_workers"])
    return ResidentBatches(split, rank, world, batch, config["seed"], device)


def train_worker(ctx: Any, config: dict) -> dict:
    """Runs in every child. Returns a summary with the final parameter checksum."""
    from harness.checkout.models import loss_fn

    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = config["tf32"]
    rank, world, lead = ctx.rank, ctx.world_size, ctx.rank == 0
    marks = {**ctx.marks, "exec": time.time()}
    data = load_data(config)
    timeline.mark(marks, "data")
    replacing = ctx.replacing is not None     # a dead rank's replacement: the survivors hand it their state
    state = load_checkpoint(config["resume"], map_location=device) if config["resume"] and not replacing else None
    # Where the data stands: epochs completed, updates done, and batches done in the current epoch.
    epoch, step, position = (state["epoch"], state["step"], state.get("position", 0)) if state else (0, 0, 0)
    batches = make_batches(data.train, config, rank, world, device)
    ctx.own(batches)
    stream = batches.epoch(epoch, position)     # loader processes start now, while the model is built
    model, optimizer = build(config, data.info, device)
    flat = FlatParameters(model)
    # --compile: the training step runs the compiled model. It is compiled over the flat views, and the
    # gradient hooks stay on the parameters, outside the compiled graph; evaluation runs eagerly.
    forward = torch.compile(model) if config["compile"] else model
    timeline.mark(marks, "model")
    comm = ctx.communicator()
    timeline.mark(marks, "communicator")
    if state:
        model.load_state_dict(state["model"])
        load_optimizer_state(optimizer, state["optimizer"])
        if position:        # mid-epoch: dropout and the like go on from where the generators were
            set_rng_state(state["rng"][rank], device)
    interrupted = 0

    if position >= batches.steps_per_epoch:
        raise ValueError(f"--resume {config['resume']} stopped after batch {position} of an epoch, but an epoch "
                         f"has {batches.steps_per_epoch} batches now; resume with the data it was trained on")
    total = config["max_steps"] or config["epochs"] * batches.steps_per_epoch
    samples_per_update = config["batch_size"] * config["grad_accum"] * world
    best_error, stale = state.get("early_stop", (math.inf, 0)) if state else (math.inf, 0)
    stop, saved_at = None, step if state else None
    last_report, memory, memory_at, first = time.monotonic(), None, -math.inf, step + 1

    def validate() -> float | None:
        nonlocal best_error, stale, stop
        if data.val is None:
            return None
        sync.finish()
        # The training batch: a language model's logits (batch x block x vocabulary) are what fills memory.
        _, correct, count = evaluate(model, evaluation_batches(data.val, rank, world, config["batch_size"], device,
                                                               config["data_workers"]), config, device)
        totals = torch.tensor([correct, count], dtype=torch.float64, device=device)
        comm.all_reduce(totals)
        error = 1.0 - (totals[0] / totals[1]).item()
        if error < best_error - 1e-12:
            best_error, stale = error, 0
        else:
            stale += 1
        if config["target_error"] is not None and error <= config["target_error"]:
            stop = f"validation error {error:.2%} reached the target {config['target_error']:.2%}"
        elif config["patience"] and stale >= config["patience"]:
            stop = f"no improvement in {stale} validations (patience {config['patience']})"
        if lead:
            ctx.send({"event": "validation", "epoch": epoch, "step": step, "val_error": error})
        return error

    saver = BackgroundSaver()
    ctx.own(saver)

    def save() -> None:
        """Every rank takes part (the replicas are made consistent, each rank's generators gathered);
        rank 0 snapshots the state and writes it in the background, and reports when it is on disk."""
        nonlocal saved_at
        if not config["save"] or saved_at == step:
            return
        sync.finish()
        if train_step.ticket is not None and train_step.ticket.applied() != step:
            raise RuntimeError(f"update {step} did not complete on every rank")     # a peer died: heal
        generators = ctx.exchange(ctx.unique_tag("rng"), rng_state(device))
        if lead:
            saved = {"event": "saved", "epoch": epoch, "step": step, "path": config["save"]}
            saver.save(config["save"], {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "epoch": epoch, "step": step, "position": position,
                                        "rng": generators, "early_stop": (best_error, stale), "config": config},
                       done=lambda: ctx.send(saved))
        saved_at = step

    def save_due() -> bool:
        return bool(config["save_every_steps"]) and step % config["save_every_steps"] == 0

    example = None
    if config["cuda_graph"] is not False and device.type == "cuda":    # the graph's static inputs: the first batch
        example = next(stream)
        stream = itertools.chain([example], stream)
    scheduled = not is_constant(config["lr_schedule"], config["warmup_steps"])   # a graph would freeze the lr

    def reseed(*where: int) -> None:
        """This rank's generators, from (seed, rank, *where): each rank's own, the same after a resume."""
        torch.manual_seed(hash((config["seed"], rank, *where)) & (2**63 - 1))

    def attach(start: bool) -> tuple[Synchroniser, StopVote, Any]:
        """What keeps this rank in step through ``comm``: the synchroniser (``start``: first making every
        replica rank 0's), the stop vote, and the training step (a CUDA graph captures the communicator;
        GPU workers that heal guard each update with a ticket, harness/resilience/heal.py, and graph their step only
        where NCCL can revoke a communicator, harness/collectives/ncclstop.py)."""
        sync = make_synchroniser(config, comm, flat, optimizer)
        if start:
            sync.start()
        ticket = Ticket(comm, optimizer, step) if config["heal"] and device.type == "cuda" else None
        graph = config["cuda_graph"] if not scheduled and (ticket is None or ncclstop.can_revoke()) else False
        return sync, StopVote(ctx, comm, device), make_step(
            forward, optimizer, flat, sync, loss_fn, lambda: autocast(config, device), graph, example=example,
            say=lambda message: ctx.print(message) if lead else None, clip=config["clip_grad"],
            accum=config["grad_accum"], ticket=ticket)

    def heal(where: Where | None, phases: dict, queued: int | None = None) -> None:
        """This rank's part once the group has a replacement for a dead rank (harness/resilience/heal.py): take the
        donor's state and place, and go on from there. ``where`` is None on the replacement itself.
        ``phases``: when this rank reached each phase of the heal; ``queued``: updates it had issued past
        the last one applied. The lead reports every rank's."""
        nonlocal epoch, step, position, best_error, stale, sync, vote, train_step, stream, saved_at
        began = time.monotonic()
        place, summary = hand_over(ctx, comm, flat, optimizer, where, average=config["mode"] == "param")
        timeline.mark(phases, "handed_over")
        epoch, step, position = place.epoch, place.step, place.position
        best_error, stale = place.best_error, place.stale
        if position == batches.steps_per_epoch:
            epoch, position = epoch + 1, 0
        sync, vote, train_step = attach(start=False)
        timeline.mark(phases, "attached")
        stream, saved_at = None, step
        reseed(epoch, step)
        every = ctx.exchange("heal-phases", (phases, queued))
        if lead:
            ctx.send({"event": "healed", "step": step, "epoch": epoch, "generation": ctx.generation,
                      "hand_over_s": time.monotonic() - began, "mode": config["mode"],
                      "phases": [p for p, _ in every], "queued": [q for _, q in every], **summary})

    if replacing:
        heal(None, marks)
    else:
        sync, vote, train_step = attach(start=True)

    def lr_at(update: int) -> float:
        return learning_rate(update, config["lr"], config["lr_schedule"], total, config["warmup_steps"],
                             config["min_lr"])

    model.train()
    while step < total and stop is None:
        try:
            if position == 0:   # dropout and other randomness: different on each rank, the same after a resume
                reseed(epoch)
            stream = stream or batches.epoch(epoch, position)
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            epoch_start, val_error, done = time.monotonic(), None, 0
            for x, y in stream:
                if scheduled:
                    for group in optimizer.param_groups:
                        group["lr"] = lr_at(step)
                loss = train_step(x, y)
                step, position, done = step + 1, position + 1, done + 1
                sync.after_step(step)
                interrupted = interrupted or vote.poll(step)
                if interrupted and stop is None:
                    stop = f"interrupted by {signal.Signals(interrupted).name}"
                loss_sum += loss.double()
                if step == first:       # one synchronisation, so that the mark is when the step really ended
                    first_loss = loss.item()
                    timeline.mark(marks, "first_step")
                    if lead:
                        ctx.send({"event": "first_step", "step": step, "loss": first_loss})
                if lead and time.monotonic() - last_report >= REPORT_EVERY_S:
                    last_report = time.monotonic()
                    if last_report - memory_at >= MEMORY_EVERY_S:
                        memory, memory_at = worker_memory_mb(), last_report
                    ctx.send({"event": "step", "epoch": epoch, "step": step, "loss": loss.item(), "rss_mb": memory,
                              "samples_per_s": done * samples_per_update / (last_report - epoch_start),
                              "lr": lr_at(step - 1),
                              **({"grad_norm": train_step.grad_norm.item()} if config["clip_grad"] else {})})
                if config["validate_every"] and step % config["validate_every"] == 0:
                    val_error = validate()
                if save_due() and position < batches.steps_per_epoch:     # an epoch's end saves below
                    save()
                if stop is not None or step >= total:
                    break
            stream = None
            ended = position == batches.steps_per_epoch
            if ended:
                epoch, position = epoch + 1, 0
            totals = torch.stack([loss_sum, torch.tensor(float(done), dtype=torch.float64, device=device)])
            comm.all_reduce(totals)
            if not config["validate_every"] and stop is None and (ended or step >= total):
                val_error = validate()
            if lead and ended:
                ctx.send({"event": "epoch", "epoch": epoch, "step": step, "train_loss": (totals[0] / totals[1]).item(),
                          "val_error": val_error, "seconds": time.monotonic() - epoch_start, "lr": lr_at(step - 1)})
            if stop is not None or step >= total or save_due() \
                    or (ended and config["save_every"] and epoch % config["save_every"] == 0):
                save()
        except RuntimeError as error:     # a collective failed: a dead peer (then heal), or this rank's own error
            if not config["heal"]:
                raise
            phases = {"failed": time.time()}
            sync.close()
            comm = rejoin(ctx, comm, error, forget=train_step.release)
            timeline.mark(phases, "rejoined")
            ticket, train_step, vote = train_step.ticket, None, None
            if comm is None:
                raise
            where = Where(epoch, step, position, best_error, stale)
            if ticket is not None:
                where = rewind(where, ticket.applied(), batches.steps_per_epoch)
            heal(where, phases, queued=step - where.step)

    sync.finish()
    saver.wait()
    if lead:
        ctx.send({"event": "done", "epoch": epoch, "step": step, "stop": stop, "signal": interrupted or None})
    return {"rank": rank, "checksum": flat.checksum(), "step": step, "epoch": epoch, "memory_mb": worker_memory_mb(),
            "marks": marks, "interrupted": interrupted or None}
