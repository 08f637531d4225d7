"""The worker's training loop, run in every child by Train.py (``train_worker``).

Each rank builds the same model from the same seed, trains on its shard (positions r, r+N, ...
of one seeded permutation per epoch, so N workers with batch b see exactly the samples one
worker with batch N*b would), and keeps in step through a Synchroniser. Rank 0 reports
progress to the parent with ``ctx.send`` and writes checkpoints; validation and the epoch's
loss are reduced over all ranks, so every rank takes the same early-stopping decision (--mode async:
each rank alone, and the parent's parameter server decides how many updates each rank runs, when it
validates, saves and stops: harness/collectives/async_worker.py; the parent writes its checkpoints
from every worker's part: harness/resilience/gathered.py).

A run lasts ``epochs`` or ``max_steps`` updates and may be saved every N steps, mid-epoch.
A checkpoint records (epoch, step, position in the epoch) and every rank's random generators, so
"train 1000 steps" equals "train 600, stop, resume, train 400": the data order and each sample's
augmentation are functions of (seed, epoch, index) (harness/data/pipeline.py), not of the run's history.

Reading order: ``train_worker`` -> ``Worker.train`` (the run) -> ``Worker.epoch`` (one epoch) ->
``Worker.update`` (one update and its reports); ``validate``, ``save`` and ``heal`` are named steps
the loop takes. Where the run stands is one dataclass, ``RunState``.
"""
from __future__ import annotations

import itertools
import math
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch

from harness.collectives import nccl, ncclstop
from harness.collectives.async_worker import ServerVote, Solo, to_server
from harness.collectives.flat import FlatParameters
from harness.collectives.shards import Replica, ShardLayout
from harness.control import timeline
from harness.control.errors import PeerFailed
from harness.data.bad_samples import Tally
from harness.data.pipeline import EvaluationBatches
from harness.resilience.checkpoint import layout, load_checkpoint, rng_state, set_rng_state, to_host
from harness.resilience.heal import Salvage, Ticket, Where, hand_over, hand_over_anchor, rejoin, rewind
from harness.resilience.interrupt import StopVote
from harness.resilience.saver import BackgroundSaver
from harness.resilience.shard_heal import Progress, hand_over_shards
from harness.training.build import (autocast, flat_gradients, load_data, make_batches, make_model, make_optimizer,
                                    make_synchroniser, model_loss, model_output_loss)
from harness.training.config import TrainConfig
from harness.training.losses import make_loss
from harness.training.evaluation import evaluate
from harness.training.metrics import memory_usage, worker_memory_mb
from harness.training.optim import load_optimizer_state, set_lr
from harness.training.profiling import StepProfiler
from harness.training.scaling import LossScaler
from harness.training.schedule import is_constant, learning_rate
from harness.training.sharded_state import gather_state, load_state
from harness.training.step import make_step

REPORT_EVERY_S = 0.5        # rank 0 sends a progress record at most this often
MEMORY_EVERY_S = 5.0        # and measures its memory (worker and loader processes) at most this often


@dataclass
class RunState:
    """Where this rank's run stands: epochs completed, updates done, batches done in the current
    epoch, the early-stopping record, why it stops (None: it goes on), the update last saved and the
    signal that interrupted it (0: none)."""
    epoch: int = 0
    step: int = 0
    position: int = 0
    best_error: float = math.inf
    stale: int = 0
    stop: str | None = None
    saved_at: int | None = None
    interrupted: int = 0
    diverged: str | None = None

    def where(self) -> Where:
        return Where(self.epoch, self.step, self.position, self.best_error, self.stale)

    def go_to(self, place: Where, steps_per_epoch: int) -> None:
        """Continue from ``place`` (a heal's donor's): its epoch and update, nothing saved since."""
        self.epoch, self.step, self.position = place.epoch, place.step, place.position
        self.best_error, self.stale, self.saved_at = place.best_error, place.stale, place.step
        if self.position == steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0


def train_worker(ctx: Any, config: TrainConfig) -> dict:
    """Runs in every child. Returns a summary with the final parameter checksum."""
    return Worker(ctx, config).train()


class Worker:
    """One rank's run: what it built (data, model, optimizer, communicator) and where it stands."""

    def __init__(self, ctx: Any, config: TrainConfig):
        self.ctx, self.config, self.device = ctx, config, ctx.device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = config.tf32
        self.rank, self.world, self.lead = ctx.rank, ctx.world_size, ctx.rank == 0
        self.marks = {**ctx.marks, "exec": time.time()}
        self.data = load_data(config)
        timeline.mark(self.marks, "data")
        replacing = ctx.replacing is not None     # a dead rank's replacement: the survivors hand it their state
        saved = load_checkpoint(config.resume, map_location=self.device) if config.resume and not replacing else None
        self.asynchronous = config.mode == "async"
        self.saved_ranks = saved.get("ranks") if saved else None
        if saved:
            epoch, step, position = self.saved_place(saved)
            self.state = RunState(epoch, step, position, *saved.get("early_stop", (math.inf, 0)), saved_at=step)
        else:
            self.state = RunState()
        self.batches = make_batches(self.data.train, config, self.rank, self.world, self.device)
        # samples that failed to load: logged, counted (async mode: by each rank alone, no exchange to wait in)
        self.bad = Tally(ctx, config.max_bad_samples, alone=self.asynchronous,
                         report=to_server(ctx) if self.asynchronous else None)
        ctx.own(self.batches)
        self.stream = self.batches.epoch(self.state.epoch, self.state.position)   # loaders start while the model is built
        # validation's loaders start now too: never forked once the communicator runs (EvaluationBatches says why)
        self.evaluation = None if self.data.val is None else \
            EvaluationBatches(self.data.val, config.batch_size, self.device, config.data_workers)
        if self.evaluation is not None:
            ctx.own(self.evaluation)
        self.finishing = False      # the next epoch() first finishes an update a --zero heal left uncounted
        self.model = make_model(config, self.data.info, self.device)
        self.flat = FlatParameters(self.model, flatten_grads=flat_gradients(config, self.world))
        # --zero: this rank's optimizer updates its shards of the flat parameters (harness/collectives/shards.py)
        self.shards = ShardLayout(self.flat, self.world, self.rank, config.bucket_mb) if config.zero else None
        self.optimizer = make_optimizer(config, self.shards.pieces if self.shards else self.model.parameters(),
                                        self.device)
        # healing in place: a copy of the previous rank's shard, kept here (harness/resilience/shard_heal.py)
        self.replica = self.make_replica() if self.shards is not None and config.heal_in_place else None
        self.scaler = LossScaler(self.device) if config.amp == "fp16" else None     # kept through heals
        # compile: the training step runs the compiled model and loss. It is compiled over the flat views, and
        # the gradient hooks stay on the parameters, outside the compiled graph; validation compiles its own.
        loss = make_loss(config.loss)
        compute, forward = model_loss(self.model, loss), model_output_loss(self.model, loss)
        self.compute, self.forward = (torch.compile(compute), torch.compile(forward)) if config.compile else \
            (compute, forward)
        timeline.mark(self.marks, "model")
        # --mode async: workers share no collective (harness/collectives/async_worker.py), the server decides
        if self.replica is not None and self.device.type == "cuda":
            nccl.keep_graphs_unregistered()     # before the first communicator (its docstring says why)
        self.comm = Solo(self.device.type) if self.asynchronous else ctx.communicator()
        timeline.mark(self.marks, "communicator")
        if saved:
            self._restore(saved)
        self.saver = BackgroundSaver()
        ctx.own(self.saver)
        self.total = config.total_updates(self.batches.steps_per_epoch)
        self.samples_per_update = config.batch_size * config.grad_accum * self.world
        self.first = self.state.step + 1
        self.last_report, self.memory, self.memory_at = time.monotonic(), None, -math.inf
        self.example = self._graph_example()
        self.profiler = StepProfiler(config.profile if self.lead else None, self.state.step + config.profile_from,
                                     config.profile_updates, self.device)
        self.scheduled = not is_constant(config.lr_schedule, config.warmup_steps)
        # A graph replays the update with the rate it read at capture, unless the rate is a device tensor.
        self.frozen_lr = self.scheduled and not torch.is_tensor(self.optimizer.param_groups[0]["lr"])
        if replacing and self.asynchronous:
            self.rejoin_server()
        elif replacing:
            self.heal(None, self.marks)
        else:
            self.attach(start=True)

    def saved_place(self, saved: dict) -> tuple[int, int, int]:
        """The (epoch, update, position in the epoch) this rank resumes from: the checkpoint's, or where the
        rank's own part says it was (--mode async: each worker runs its own number of updates)."""
        mine = self.saved_ranks[self.rank % len(self.saved_ranks)] if self.saved_ranks else {}
        return tuple(mine.get("place") or (saved["epoch"], saved["step"], saved.get("position", 0)))

    def _restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        if self.shards is not None:
            load_state(self.optimizer, self.shards, saved["optimizer"], self.model)
            if self.replica is not None:
                load_state(self.replica.optimizer, self.replica.layout, saved["optimizer"], self.model)
        else:
            load_optimizer_state(self.optimizer, saved["optimizer"])
        if self.scaler is not None and saved.get("loss_scale"):     # older checkpoints: the initial scale
            self.scaler.load_state_dict(saved["loss_scale"][self.rank % len(saved["loss_scale"])])
        if self.state.position:        # mid-epoch: dropout and the like go on from where the generators were
            set_rng_state(saved["rng"][self.rank], self.device)
        if self.state.position >= self.batches.steps_per_epoch:
            raise ValueError(f"--resume {self.config.resume} stopped after batch {self.state.position} of an epoch, "
                             f"but an epoch has {self.batches.steps_per_epoch} batches now; resume with the data "
                             "it was trained on")

    def make_replica(self) -> Replica:
        """The layout of the previous rank's shard and an optimizer over it (ShardedGradients keeps it
        up to date)."""
        layout = ShardLayout(self.flat, self.world, (self.rank - 1) % self.world, self.config.bucket_mb, replica=True)
        return Replica(layout, make_optimizer(self.config, layout.pieces, self.device))

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """This rank's optimizer, and its replica's (--zero, healing in place)."""
        return [self.optimizer] + ([self.replica.optimizer] if self.replica is not None else [])

    def _graph_example(self) -> tuple | None:
        """A CUDA graph's static inputs: the first batch, put back in front of the stream."""
        if self.config.cuda_graph is False or self.device.type != "cuda":
            return None
        example = next(self.stream)
        self.stream = itertools.chain([example], self.stream)
        return example

    def attach(self, start: bool) -> None:
        """What keeps this rank in step through ``comm``: the synchroniser (``start``: first making every
        replica rank 0's), the stop vote, and the training step (a CUDA graph captures the communicator;
        GPU workers that heal guard each update with a ticket, harness/resilience/heal.py, and graph their
        step only where NCCL can revoke a communicator, harness/collectives/ncclstop.py)."""
        config = self.config
        # each rank's own part of the checkpoint (param mode's outer optimizer; async mode's server state on rank 0)
        mine = self.saved_ranks[self.rank % len(self.saved_ranks)] if start and self.saved_ranks else None
        self.sync = make_synchroniser(config, self.comm, self.flat, self.optimizer, self.shards,
                                      report=self.ctx.send if self.lead else None, replica=self.replica,
                                      ctx=self.ctx, served=mine.get("server") if mine else None, model=self.model,
                                      held=mine.get("anchor") if mine else None, place=self.place)
        if start:
            self.sync.start()
        if mine:
            self.sync.load_state_dict(mine)
            load_optimizer_state(self.optimizer, mine["optimizer"])
        guarded = config.heal_in_place and self.device.type == "cuda" and not self.asynchronous    # async: no collective
        ticket = Ticket(self.comm, self.optimizers(), self.state.step) if guarded else None
        if self.scaler is not None:     # after the ticket: the optimizer skips where either says so
            self.scaler.bind(*self.optimizers())
        graph = config.cuda_graph if not self.frozen_lr and (ticket is None or ncclstop.can_revoke()) else False
        if graph is not False and self.device.type == "cuda" and not getattr(self.data.train, "static_shapes", True):
            graph = False
            if self.lead:
                self.ctx.print("CUDA graph: the dataset's collate_fn may make batches of other shapes, which a "
                               "graph cannot replay; running eagerly")
        self.vote = ServerVote(self.sync) if self.asynchronous else StopVote(self.ctx, self.comm, self.device)
        self.train_step = make_step(
            self.model, self.compute, self.optimizer, self.flat, self.sync, lambda: autocast(config, self.device), graph,
            example=self.example, say=lambda message: self.ctx.print(message) if self.lead else None,
            clip=config.clip_grad, accum=config.grad_accum, ticket=ticket, scaler=self.scaler)
        # a graph's own inputs are the example of a later capture (a heal's): the first batch is not held as well
        self.example = getattr(self.train_step, "batch", self.example)

    def train(self) -> dict:
        """Epoch after epoch until the run's length or a stop; a failed collective heals the group (when
        the run heals in place) and the loop goes on from the donor's place."""
        self.model.train()
        # --mode async: a checkpoint the server asked for as this worker joined (one resumed at its own share, granted
        # nothing, or a dead worker's replacement at a consistent point) is this worker's too, before any update
        if self.asynchronous and self.save_due():
            self.save()
        while not self.over() and self.state.stop is None:
            try:
                self.epoch()
            except RuntimeError as error:     # a collective failed: a dead peer (then heal), or this rank's own error
                if not self.config.heal_in_place or self.asynchronous:     # async: survivors are never aborted
                    raise
                self.recover(error)
        self.sync.finish()      # first: an async worker that stopped alone (its bad samples) parks, so the others stop
        bad = self.bad.gather(self.state.step, final=True)     # the last updates' bad samples: every rank, also one
        self.state.stop = self.state.stop or bad                # that stopped alone (async), for the exchange in it
        self.saver.wait()
        self.bad.check(self.config.save)        # past --max-bad-samples: the error, now that the stop is saved
        s = self.state
        peak = torch.cuda.max_memory_reserved(self.device) / 2**20 if self.device.type == "cuda" else None
        if self.lead:
            self.ctx.send({"event": "done", "epoch": s.epoch, "step": s.step, "stop": s.stop,
                           "signal": s.interrupted or None, "diverged": s.diverged, "peak_gpu_mb": peak})
        return {"rank": self.rank, "checksum": self.flat.checksum(), "step": s.step, "epoch": s.epoch,
                "memory_mb": worker_memory_mb(), "marks": self.marks, "interrupted": s.interrupted or None,
                "diverged": s.diverged}

    def epoch(self) -> None:
        """The rest of the current epoch (or of the run), then its loss, validation, report and save."""
        s, config = self.state, self.config
        # a --zero heal may leave the update at this place applied but not counted: finish it first
        finishing, self.finishing = self.finishing, False
        if s.position == 0 and not finishing:   # dropout and the like: different on each rank, the same after a resume
            self.reseed(s.epoch)
        stream, self.stream = self.stream or self.batches.epoch(s.epoch, s.position + finishing), None
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        started, measured, done = time.monotonic(), None, 0
        for batch in itertools.chain([None], stream) if finishing else stream:
            if batch is None:       # the healed update: its loss is not here, so no report of it
                self.count(torch.zeros((), device=self.device))
            else:
                loss = self.update(batch)
                done += 1
                loss_sum += loss.double()
                self.report(loss, done, started)
            if self.validation_due():
                measured = self.validate()
            if self.save_due() and s.position < self.batches.steps_per_epoch:     # an epoch's end saves below
                self.save()
            if s.stop is not None or self.over():
                break
        ended = s.position == self.batches.steps_per_epoch
        if ended:
            s.epoch, s.position = s.epoch + 1, 0
        totals = torch.stack([loss_sum, torch.tensor(float(done), dtype=torch.float64, device=self.device)])
        self.comm.all_reduce(totals)
        if self.sync.evaluation_due(not config.validate_every and s.stop is None and (ended or self.over())):
            measured = self.validate()
        if self.lead and ended:
            self.ctx.send({"event": "epoch", "epoch": s.epoch, "step": s.step,
                           "train_loss": (totals[0] / totals[1]).item(), "val_error": None, **(measured or {}),
                           "seconds": time.monotonic() - started, "lr": self.lr_at(s.step - 1)})
        if s.stop is not None or self.over() or self.save_due(ended):
            self.save()

    def update(self, batch: Any) -> torch.Tensor:
        """One update (its micro-batches, the synchronisation, the optimizer), then the stop vote."""
        if self.scheduled:
            for optimizer in self.optimizers():
                set_lr(optimizer, self.lr_at(self.state.step))
        return self.count(self.train_step(batch))

    def count(self, loss: torch.Tensor) -> torch.Tensor:
        """What follows an applied update: count it, then the stop vote (``loss``: the update's, which
        the vote checks is finite)."""
        s = self.state
        s.step, s.position = s.step + 1, s.position + 1
        self.sync.after_step(s.step)
        if self.over():
            self.sync.end_of_run(s.step)
        self.profiler.after(s.step)
        signum, diverged = self.vote.poll(s.step, loss)
        s.interrupted = s.interrupted or signum
        if diverged:
            self.diverge(f"the loss is not finite by update {s.step}")
        elif s.interrupted and s.stop is None:
            s.stop = f"interrupted by {signal.Signals(s.interrupted).name}"
        bad = self.bad.after_update(s.step, self.batches)      # past --max-bad-samples: stop, save
        if bad and s.stop is None:
            s.stop = bad
            self.vote.bad_samples()         # --mode async: this worker's own count, so the server stops the others
        return loss

    def diverge(self, why: str) -> None:
        """Stop without saving: the last checkpoint, written before, is the last good one."""
        self.state.diverged = self.state.diverged or why
        self.state.stop = f"diverged: {self.state.diverged}"

    def report(self, loss: torch.Tensor, done: int, started: float) -> None:
        """The first step's mark (one synchronisation, so that it is when the step really ended), and
        rank 0's progress record every REPORT_EVERY_S."""
        s = self.state
        if s.step == self.first:
            first_loss = loss.item()
            timeline.mark(self.marks, "first_step")
            if self.lead:
                self.ctx.send({"event": "first_step", "step": s.step, "loss": first_loss})
            self.report_memory()
        if not self.lead or time.monotonic() - self.last_report < REPORT_EVERY_S:
            return
        self.last_report = time.monotonic()
        if self.last_report - self.memory_at >= MEMORY_EVERY_S:
            self.memory, self.memory_at = worker_memory_mb(), self.last_report
        self.ctx.send({"event": "step", "epoch": s.epoch, "step": s.step, "loss": loss.item(), "rss_mb": self.memory,
                       "samples_per_s": done * self.samples_per_update / (self.last_report - started),
                       "lr": self.lr_at(s.step - 1),
                       **({"grad_norm": self.train_step.grad_norm.item()} if self.config.clip_grad else {}),
                       **(self.scaler.report() if self.scaler is not None else {})})

    def report_memory(self) -> None:
        """After the first update, every rank's memory in one "memory" record of rank 0's. --mode async: one record
        a worker, through the server, for its workers share no collective (a worker granted a single update would
        wait in its push for one that waits here for it)."""
        mine = {"rank": self.rank, **memory_usage(self.flat, self.sync, self.optimizers(), self.device)}
        record = {"event": "memory", "zero": self.config.zero,
                  "largest_bucket_mb": self.shards.largest_bucket_mb() if self.shards is not None else None}
        if self.asynchronous:
            to_server(self.ctx)({**record, "ranks": [mine]})
        else:
            ranks = self.ctx.exchange(self.ctx.unique_tag("memory"), mine)
            if self.lead:
                self.ctx.send({**record, "ranks": ranks})

    def lr_at(self, update: int) -> float:
        c = self.config
        return learning_rate(self.sync.position(update), c.lr, c.lr_schedule, self.total, c.warmup_steps, c.min_lr)

    def reseed(self, *where: int) -> None:
        """This rank's generators, from (seed, rank, *where): each rank's own, the same after a resume."""
        torch.manual_seed(hash((self.config.seed, self.rank, *where)) & (2**63 - 1))

    def validate(self) -> dict | None:
        """The validation loss and error (None where the model has no predictions to count) over every
        rank's share, and the early-stopping decision the error, else the loss, makes."""
        s, config = self.state, self.config
        if self.data.val is None:
            return None
        self.sync.before_evaluation()
        # The training batch: a language model's logits (batch x block x vocabulary) are what fills memory.
        # --mode async: the one worker the server asked evaluates the whole split.
        failures: list[dict] = []
        batches = self.evaluation(*self.sync.evaluation_share(self.rank, self.world), failures)
        with self.sync.global_weights():
            totals = torch.tensor(evaluate(self.model, self.forward, batches, lambda: autocast(config, self.device)),
                                  dtype=torch.float64, device=self.device)
        self.bad.add("val", s.step, failures)
        self.comm.all_reduce(totals)
        loss_sum, correct, count, seen = totals.tolist()
        measured = {"val_error": 1.0 - correct / count if count else None, "val_loss": loss_sum / max(seen, 1)}
        error = measured["val_error"] if count else measured["val_loss"]
        if error < s.best_error - 1e-12:
            s.best_error, s.stale = error, 0
        else:
            s.stale += 1
        if config.target_error is not None and count and error <= config.target_error:
            s.stop = f"validation error {error:.2%} reached the target {config.target_error:.2%}"
        elif config.patience and s.stale >= config.patience:
            s.stop = f"no improvement in {s.stale} validations (patience {config.patience})"
        record = {"event": "validation", "epoch": s.epoch, "step": self.sync.position(s.step), **measured}
        self.sync.report_validation(record, self.ctx.send if self.lead else None)
        return measured

    def over(self) -> bool:
        """Whether this rank's run is over: after ``total`` updates (--mode async: when the server grants
        this worker no more; a fast worker runs more updates than a slow one)."""
        return self.sync.over(self.state.step, self.total)

    def validation_due(self) -> bool:
        """After an update: every --validate-every updates (--mode async: when the server asks this
        worker, every --validate-every updates of all workers' over N)."""
        every = self.config.validate_every
        return self.sync.evaluation_due(bool(every) and self.state.step % every == 0)

    def save_due(self, ended: bool = False) -> bool:
        """Every --save-every-steps updates, and at the end (``ended``) of every --save-every-th epoch
        (--mode async: when the server has parked every worker for a checkpoint)."""
        s, config = self.state, self.config
        return self.sync.checkpoint_due(
            bool(config.save_every_steps) and s.step % config.save_every_steps == 0
            or ended and bool(config.save_every) and s.epoch % config.save_every == 0)

    def save(self) -> None:
        """Every rank takes part (the replicas are made consistent, each rank's generators gathered);
        rank 0 snapshots the state and writes it in the background, and reports when it is on disk."""
        s, config = self.state, self.config
        if not config.save or s.diverged or not self.sync.ready_to_save(s.saved_at != s.step):
            return
        ticket = self.train_step.ticket
        if ticket is not None and ticket.applied() != s.step:
            raise RuntimeError(f"update {s.step} did not complete on every rank")     # a peer died: heal
        if not self.finite():
            self.diverge(f"the parameters are not finite at update {s.step}")
            return
        if self.asynchronous:       # to the parent, which writes it (harness/resilience/gathered.py): no exchange
            self.sync.save_part(self.part())
            s.saved_at = s.step
            return
        generators = self.ctx.exchange(self.ctx.unique_tag("rng"), rng_state(self.device))
        # every rank's (param mode's replicas scale apart; grad mode's alike)
        scales = self.ctx.exchange(self.ctx.unique_tag("loss-scale"), self.scaler.state_dict()) if self.scaler else None
        # as an unsharded optimizer's, whatever --zero: any number of workers resumes it
        optimizer = gather_state(self.optimizer, self.shards, self.comm, self.model) if self.shards is not None \
            else self.optimizer.state_dict() if self.lead else None
        local = self.sync.state_dict()      # every rank's own state (param mode's outer optimizer), or None
        ranks = None if local is None else self.ctx.exchange(self.ctx.unique_tag("ranks"), self.own_part(local))
        with self.sync.global_weights():    # the model the group agrees on (the snapshot is taken inside)
            if self.lead:
                self.write(s.where(), optimizer, generators, scales, ranks)
        s.saved_at = s.step

    def own_part(self, local: dict) -> dict:
        """This rank's own part of a checkpoint (``ranks``): its synchroniser's ``local`` state, its optimizer's and
        its place."""
        return {**local, "optimizer": to_host(self.optimizer.state_dict()), "place": self.place()}

    def part(self) -> dict:
        """--mode async: all that this worker adds to a checkpoint, for the parent to write: its own part, its
        generators and loss scale, and on rank 0 the model (the anchor), where it stands and the config."""
        part = {**self.own_part(self.sync.state_dict()), "rng": rng_state(self.device),
                "loss_scale": self.scaler.state_dict() if self.scaler is not None else None}
        if self.lead:
            with self.sync.global_weights():
                part["checkpoint"] = {"model": to_host(self.model.state_dict()), "where": self.state.where(),
                                      "config": self.config.to_dict()}
        return part

    def write(self, place: Where, optimizer: dict | None, generators: list, scales: list | None, ranks: list | None,
              **record: Any) -> None:
        """The checkpoint of the model as it is now, at ``place``, written to --save in the background; the "saved"
        record (with ``record``'s fields) goes to the parent once it is on disk."""
        saved = {"event": "saved", "epoch": place.epoch, "step": place.step, "path": self.config.save, **record}
        self.saver.save(self.config.save, layout(self.model.state_dict(), optimizer, place, generators, scales, ranks,
                                                 self.config.to_dict()), done=lambda: self.ctx.send(saved))

    def finite(self, alone: bool = False) -> bool:
        """Whether every rank's parameters are finite (one all-reduce of a flag; ``alone``: this rank's only):
        the stop vote sees a diverged loss a few updates late, and a checkpoint must not be written in between."""
        bad = torch.zeros(1, dtype=torch.int32, device=self.device)
        for flat in self.flat.params:
            bad |= ~torch.isfinite(flat).all()
        if not alone:
            self.comm.all_reduce(bad, "max")
        return not bad.item()

    def recover(self, error: RuntimeError) -> None:
        """A collective failed: if a peer died, rejoin the group's next generation and heal from where the
        GPU really stands (a ticket's count, which may be behind the CPU's); else re-raise ``error``."""
        phases = {"failed": time.time()}
        ticket = self.train_step.ticket
        # --zero: how far the interrupted update got. The host's flags say so on CPU workers; on GPU ones the
        # host runs ahead of the device, and the ticket's count is where the optimizers stand.
        progress = None if self.replica is None else Progress(False, False) if ticket else \
            Progress(self.sync.ready, self.sync.applied)
        held = self.sync.kept_through_heal()
        self.sync.close()
        try:
            self.comm = rejoin(self.ctx, self.comm, error, forget=self.train_step.release)
        except Salvage as salvage:
            if salvage.saver == self.rank:
                self.save_alone(self.applied_place(ticket))
            raise PeerFailed(f"{error}; {salvage}") from None
        timeline.mark(phases, "rejoined")
        self.train_step, self.vote = None, None
        if self.comm is None:
            raise error
        where = self.applied_place(ticket)
        self.heal(where, phases, queued=self.state.step - where.step, progress=progress, held=held)

    def applied_place(self, ticket: Ticket | None) -> Where:
        """Where this rank stands: its count of updates, or on a GPU worker that heals, the ticket's count of those
        the device applied (it may be behind the host's)."""
        where = self.state.where()
        return rewind(where, ticket.applied(), self.batches.steps_per_epoch) if ticket is not None else where

    def save_alone(self, where: Where) -> None:
        """A dead rank's host is lost, so no replacement can start: write the run's state as this survivor holds
        it, after update ``where.step``, with no collective (grad mode without --zero: every replica holds it),
        for the engine's restart to resume. Each rank's generators are this rank's (a model that draws random
        numbers resumes with other draws than the uninterrupted run's). Sends "saved", or "not_saved" and why."""
        config = self.config
        why = "--save is empty" if not config.save else \
            f"--mode {config.mode}: each worker holds parameters of its own" if config.mode != "grad" else \
            "--zero: the dead rank's shards are not all here" if config.zero else \
            "the parameters are not finite" if not self.finite(alone=True) else None
        if why:
            self.ctx.send({"event": "not_saved", "step": where.step, "why": why})
            return
        self.write(where, self.optimizer.state_dict(), [rng_state(self.device)] * self.world,
                   [self.scaler.state_dict()] * self.world if self.scaler else None, None, salvaged=True)
        self.saver.wait()

    def place(self) -> tuple[int, int, int]:
        """Where this rank stands in its data: (epoch, update, position in the epoch)."""
        return self.state.epoch, self.state.step, self.state.position

    def rejoin_server(self) -> None:
        """--mode async, a dead worker's replacement: join the running server (harness/collectives/server.py), which
        answers with the anchor and the place of the dead worker's last applied push, and go on from there, with an
        inner optimizer afresh (the dead one's state is gone; the survivors train on and hand over nothing)."""
        self.attach(start=True)
        epoch, step, position = self.sync.predecessor
        self.state.go_to(Where(epoch, step, position, math.inf, 0), self.batches.steps_per_epoch)
        self.stream = None
        self.reseed(self.state.epoch, self.state.step)

    def heal(self, where: Where | None, phases: dict, queued: int | None = None,
             progress: Progress | None = None, held: dict | None = None) -> None:
        """This rank's part once the group has a replacement for a dead rank (harness/resilience/heal.py):
        take the donor's state and place, and go on from there. ``where`` is None on the replacement itself.
        ``phases``: when this rank reached each phase of the heal; ``queued``: updates it had issued past
        the last one applied; ``progress``: how far the interrupted update got (--zero); ``held``: what the
        synchroniser kept through the heal (the outer optimizer's state). The lead reports every rank's."""
        began = time.monotonic()
        if self.replica is not None:        # --zero: the dead rank's shard from its replica
            place, summary = hand_over_shards(self.ctx, self.comm, self.flat, self.shards, self.optimizer, self.replica,
                                              where, progress)
            self.finishing = summary["finishing"]
        elif self.config.outer:             # DiLoCo: back to the anchor of the last sync
            place, summary, held = hand_over_anchor(self.ctx, self.comm, self.flat, self.optimizer, where, held,
                                                    nesterov=self.config.outer_optimizer == "nesterov")
        else:
            place, summary = hand_over(self.ctx, self.comm, self.flat, self.optimizer, where,
                                       average=self.config.mode == "param")
        timeline.mark(phases, "handed_over")
        if self.scaler is not None:
            self.scaler.share(self.comm, summary["donor"])
        self.state.go_to(place, self.batches.steps_per_epoch)
        self.attach(start=False)
        if held is not None:
            self.sync.load_state_dict({"params": self.flat.params, **held, "pending": []})
        timeline.mark(phases, "attached")
        self.stream = None
        self.reseed(self.state.epoch, self.state.step)
        every = self.ctx.exchange("heal-phases", (phases, queued))
        if self.lead:
            self.ctx.send({"event": "healed", "step": self.state.step, "epoch": self.state.epoch,
                           "generation": self.ctx.generation, "hand_over_s": time.monotonic() - began,
                           "mode": self.config.mode, "phases": [p for p, _ in every],
                           "queued": [q for _, q in every], **summary})
