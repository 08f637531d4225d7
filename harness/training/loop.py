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
the loop takes. Where the run stands is one dataclass, ``RunState``. The Worker's checkpoint methods
live in loop_save.py (``Saving``), its heal methods in loop_heal.py (``Healing``).
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
from harness.collectives.shards import ShardLayout
from harness.control import timeline
from harness.data.bad_samples import Tally
from harness.data.pipeline import EvaluationBatches
from harness.resilience.checkpoint import load_checkpoint
from harness.resilience.heal import Ticket, Where
from harness.resilience.interrupt import StopVote
from harness.resilience.saver import BackgroundSaver
from harness.training.accumulation import FusedAccumulation
from harness.training.build import (autocast, flat_gradients, fused_accumulation, load_data, make_batches, make_model,
                                    make_optimizer, make_synchroniser, model_loss, model_output_loss)
from harness.training.config import TrainConfig
from harness.training.epoch_loss import NOTHING_YET, EpochLoss
from harness.training.losses import make_loss
from harness.training.loop_heal import Healing
from harness.training.loop_save import Saving
from harness.training.evaluation import evaluate
from harness.training.imports import import_meanwhile
from harness.training.metrics import memory_usage, worker_memory_mb
from harness.training.optim import load_optimizer_state, set_lr
from harness.training.profiling import StepProfiler
from harness.training.scaling import LossScaler
from harness.training.schedule import is_constant, learning_rate
from harness.training.step import make_step

COMPILER_MODULES = ("torch._inductor.compile_fx",)     # what torch.compile's first call imports, nearly all of it

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

    def where(self, so_far: tuple[float, int, float] = NOTHING_YET) -> Where:
        """Where the run stands; ``so_far``: the epoch's loss as a checkpoint carries it (``EpochLoss.group``)."""
        return Where(self.epoch, self.step, self.position, self.best_error, self.stale, so_far)

    def go_to(self, place: Where, steps_per_epoch: int) -> None:
        """Continue from ``place`` (a heal's donor's): its epoch and update, nothing saved since."""
        self.epoch, self.step, self.position = place.epoch, place.step, place.position
        self.best_error, self.stale, self.saved_at = place.best_error, place.stale, place.step
        if self.position == steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0


def train_worker(ctx: Any, config: TrainConfig) -> dict:
    """Runs in every child. Returns a summary with the final parameter checksum."""
    return Worker(ctx, config).train()


class Worker(Saving, Healing):
    """One rank's run: what it built (data, model, optimizer, communicator) and where it stands; it saves
    (``Saving``) and heals (``Healing``) with the methods of its two bases."""

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
        # mid-epoch: the lead carries what the checkpoint had counted of the epoch (epoch_loss.py says why)
        carried = saved.get("epoch_so_far", NOTHING_YET) if saved and self.lead and self.state.position else NOTHING_YET
        self.epoch_loss = EpochLoss(self.device, carried)
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
        self.build_training_parts(config)
        timeline.mark(self.marks, "model")
        # --mode async: workers share no collective (harness/collectives/async_worker.py), the server decides
        if self.replica is not None and self.device.type == "cuda":
            nccl.keep_graphs_unregistered()     # before the first communicator (its docstring says why)
        self.comm = Solo(self.device.type) if self.asynchronous else ctx.communicator()
        timeline.mark(self.marks, "communicator")
        if saved:
            self.restore(saved)
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

    def build_training_parts(self, config: TrainConfig) -> None:
        """The model, its flat buffers, the optimizer (of this rank's shards, with --zero) and what the step
        calls: the model and the loss, compiled under --compile."""
        # --compile: torch.compile's first call imports Inductor (4 s of a GPU worker's start on the GPU host):
        # in a thread, while the model is built on the CPU (after the loaders forked: imports.py says why)
        compiler = import_meanwhile(COMPILER_MODULES, "import-inductor") if config.compile else None
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
        if compiler is not None:
            compiler.join()
        self.compute, self.forward = (torch.compile(compute), torch.compile(forward)) if config.compile else \
            (compute, forward)
        if fused_accumulation(config, self.flat):       # the micro-batches' adds inside the compiled backward
            self.compute = FusedAccumulation(self.model, loss)

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
        self.sync.ends_after(self.total)
        if start:
            self.sync.start()
        if mine:
            self.sync.load_state_dict(mine)
            load_optimizer_state(self.optimizer, mine["optimizer"])
        self.saved_ranks = None     # taken: every rank's parts would otherwise stay mapped for the whole run
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
        self.epoch_loss.begin()
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
            self.epoch_loss = EpochLoss(self.device)
        stream, self.stream = self.stream or self.batches.epoch(s.epoch, s.position + finishing), None
        started, measured, done = time.monotonic(), None, 0
        for batch in itertools.chain([None], stream) if finishing else stream:
            if batch is None:       # the healed update: its loss is not here, so no report of it
                self.count(torch.zeros((), device=self.device))
            else:
                loss = self.update(batch)
                done += 1
                self.epoch_loss.add(loss)
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
        loss, updates, seconds = self.epoch_loss.group(self.comm)
        if updates and not math.isfinite(loss) and not s.diverged:     # every rank sums the same: no wait for the vote
            self.diverge(f"the loss is not finite by update {s.step}")
        if self.sync.evaluation_due(not config.validate_every and s.stop is None and (ended or self.over())):
            measured = self.validate()
        if self.lead and ended:
            self.ctx.send({"event": "epoch", "epoch": s.epoch, "step": s.step,
                           "train_loss": loss / updates if updates else math.nan, "val_error": None, **(measured or {}),
                           "seconds": seconds, "lr": self.lr_at(s.step - 1)})
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
        rank 0's progress record every REPORT_EVERY_S and at the run's last update (a short run's log then
        still holds the rate and loss it ended on)."""
        s = self.state
        if s.step == self.first:
            first_loss = loss.item()
            timeline.mark(self.marks, "first_step")
            if self.lead:
                self.ctx.send({"event": "first_step", "step": s.step, "loss": first_loss})
            self.report_memory()
        if not self.lead or (time.monotonic() - self.last_report < REPORT_EVERY_S and not self.over()):
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
        # at an epoch's end the epoch's record reports it too (position: its last update's, or 0 once counted)
        epoch_end = s.position in (0, self.batches.steps_per_epoch)
        record = {"event": "validation", "epoch": s.epoch, "step": self.sync.position(s.step), "epoch_end": epoch_end,
                  **measured}
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

    def place(self) -> tuple[int, int, int]:
        """Where this rank stands in its data: (epoch, update, position in the epoch)."""
        return self.state.epoch, self.state.step, self.state.position

