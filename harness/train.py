"""The worker's training loop: one readable loop, run in every child by Train.py.

Each rank builds the same model from the same seed, trains on its shard (positions r, r+N, ...
of one seeded permutation per epoch, so N workers with batch b see exactly the samples one
worker with batch N*b would), and keeps in step through a Synchroniser. Rank 0 reports
progress to the parent with ``ctx.send`` and writes checkpoints; validation and the epoch's
loss are reduced over all ranks, so every rank takes the same early-stopping decision.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch

from .checkpoint import load_checkpoint, save_checkpoint
from .flat import FlatParameters
from .optim import build_optimizer
from .step import make_step
from .sync import BucketedGradientAveraging, GradientAveraging, ParameterAveraging, Synchroniser

REPORT_EVERY_S = 0.5        # rank 0 sends a progress record at most this often


def load_data(config: dict) -> tuple[Any, Any, Any]:
    """(train, validation, test) splits: validation is the last ``val_fraction`` of the training set."""
    from datasets import Split, load_dataset
    train, test = load_dataset(config["dataset"], config["data_dir"], seed=config["seed"],
                               **config["dataset_options"])
    n_val = int(len(train) * config["val_fraction"])
    if n_val == 0:
        return train, None, test
    cut = len(train) - n_val
    return (Split(train.x[:cut], train.y[:cut], train.info), Split(train.x[cut:], train.y[cut:], train.info), test)


def build(config: dict, info: Any, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from models import build_model
    torch.manual_seed(config["seed"])
    model = build_model(config["model"], info, **config["model_options"]).to(device)
    if device.type == "cuda" and info.kind == "image":
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(config["optimizer"], model.parameters(), lr=config["lr"],
                                momentum=config["momentum"], weight_decay=config["weight_decay"],
                                nesterov=config["nesterov"])
    return model, optimizer


def autocast(config: dict, device: torch.device):
    if config["amp"] == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def on_device(split: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Small datasets move to the GPU once; larger ones stay on the host and go batch by batch."""
    if split.x.nbytes + split.y.nbytes < (2 << 30):
        return split.x.to(device), split.y.to(device)
    return split.x, split.y


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, config: dict,
             device: torch.device, batch_size: int = 512) -> tuple[float, float, int]:
    """(summed loss, correct predictions, predictions counted) over x, y."""
    from models import loss_fn
    was_training = model.training
    model.eval()
    loss = correct = count = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)
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


def train_worker(ctx: Any, config: dict) -> dict:
    """Runs in every child. Returns a summary with the final parameter checksum."""
    from datasets.sharding import shard_indices
    from models import loss_fn

    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = config["tf32"]
    train, val, _ = load_data(config)
    x_train, y_train = on_device(train, device)
    model, optimizer = build(config, train.info, device)
    flat = FlatParameters(model)
    comm = ctx.communicator()
    epoch = step = 0
    if config["resume"]:
        state = load_checkpoint(config["resume"], map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
    sync = make_synchroniser(config, comm, flat, optimizer)
    sync.start()

    batch, rank, world = config["batch_size"], ctx.rank, ctx.world_size
    steps_per_epoch = (len(train) // world) // batch
    best_error, stale, stop = math.inf, 0, None
    last_report = time.monotonic()
    lead = rank == 0

    def validate() -> float | None:
        nonlocal best_error, stale, stop
        if val is None:
            return None
        sync.finish()
        mine = torch.arange(len(val))[rank::world]      # every sample counted once, whatever the world size
        _, correct, count = evaluate(model, val.x[mine], val.y[mine], config, device)
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

    example = None
    if config["cuda_graph"]:         # the graph's static inputs start as this rank's first batch
        first = shard_indices(len(train), rank, world, epoch, config["seed"])[:batch].to(x_train.device)
        example = (x_train[first].to(device), y_train[first].to(device))
    train_step = make_step(model, optimizer, flat, sync, loss_fn, lambda: autocast(config, device),
                           config["cuda_graph"], example=example,
                           say=lambda message: ctx.print(message) if lead else None)
    model.train()
    while epoch < config["epochs"] and stop is None:
        # Dropout and other randomness: different on each rank, and the same after a resume.
        torch.manual_seed(hash((config["seed"], rank, epoch)) & (2**63 - 1))
        order = shard_indices(len(train), rank, world, epoch, config["seed"]).to(x_train.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        epoch_start, val_error, done = time.monotonic(), None, 0
        for i in range(steps_per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            xb = x_train[idx].to(device, non_blocking=True)
            yb = y_train[idx].to(device, non_blocking=True)
            loss = train_step(xb, yb)
            step += 1
            done += 1
            sync.after_step(step)
            loss_sum += loss.double()
            if lead and time.monotonic() - last_report >= REPORT_EVERY_S:
                last_report = time.monotonic()
                ctx.send({"event": "step", "epoch": epoch, "step": step, "loss": loss.item(),
                          "samples_per_s": done * batch * world / (last_report - epoch_start)})
            if config["validate_every"] and step % config["validate_every"] == 0:
                val_error = validate()
                if stop is not None:
                    break
        epoch += 1
        totals = torch.stack([loss_sum, torch.tensor(float(done), dtype=torch.float64, device=device)])
        comm.all_reduce(totals)
        if not config["validate_every"] and stop is None:
            val_error = validate()
        if lead:
            ctx.send({"event": "epoch", "epoch": epoch, "step": step, "train_loss": (totals[0] / totals[1]).item(),
                      "val_error": val_error, "seconds": time.monotonic() - epoch_start})
        if config["save"] and (stop is not None or epoch == config["epochs"]
                               or (config["save_every"] and epoch % config["save_every"] == 0)):
            sync.finish()
            if lead:
                save_checkpoint(config["save"], {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                                 "epoch": epoch, "step": step, "config": config})
                ctx.send({"event": "saved", "epoch": epoch, "path": config["save"]})
    sync.finish()
    if lead:
        ctx.send({"event": "done", "epoch": epoch, "step": step, "stop": stop})
    return {"rank": rank, "checksum": flat.checksum(), "step": step, "epoch": epoch}
