"""Healing in place on GPU workers (NCCL): a worker SIGKILLed or stopped mid-run is replaced on its
GPU, the survivors abort the broken communicator without losing their CUDA context, open a new one
with the replacement and hand it their state; the run ends where an uninterrupted one does. The
model spins the GPU (``torch.cuda._sleep``) in its forward pass, so a step takes real GPU time in
eager and graphed steps alike and the signal lands while kernels, collectives among them, run."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from harness.training.metrics import read_metrics
from harness.training.step import HEAL_DEPTH
from tests.helpers.data_files import make_token_files
from tests.helpers.gpus import has_gpus
from tests.helpers.processes import kill_quietly
from tests.helpers.runs import finish, killed_at, left_in_tmp, recovered, records_of, start_train, wait_for_record, workers_of
from tests.helpers.training import flat_params, optimizer_state, run_train

pytestmark = pytest.mark.gpu

SPINNING_MODEL = '''
import torch

class Spinning(torch.nn.Linear):
    """A linear model whose forward pass keeps the GPU busy for ``cycles`` clock cycles."""
    def __init__(self, inputs, outputs, cycles):
        super().__init__(inputs, outputs)
        self.cycles = cycles

    def forward(self, x):
        torch.cuda._sleep(self.cycles)
        return super().forward(x.flatten(1))

def model(info, cycles=20_000_000):
    return Spinning(64, info.num_classes, cycles)
'''
FLAGS = ["--model", "spinning_model:model", "--gpus", "0,1", "--batch-size", "16", "--max-steps", "400",
         "--save-every-steps", "100", "--heartbeat-timeout", "5", "--no-tf32"]


@pytest.mark.parametrize("flags", [[], ["--no-cuda-graph"]], ids=["graphed", "eager"])
def test_gpu_workers_killed_and_hung_are_healed_and_the_run_equals_the_uninterrupted_one(tmp_path, monkeypatch,
                                                                                         flags):
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    (tmp_path / "spinning_model.py").write_text(SPINNING_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    process = start_train(tmp_path, *FLAGS, *flags, "--max-restarts", "2")
    workers = workers_of(process)
    print("workers:", workers, [open(f"/proc/{pid}/cmdline", "rb").read() for pid in workers])
    os.kill(workers[1], signal.SIGKILL)
    wait_for_record(process, tmp_path, recovered(1))
    hung = workers_of(process)[0]
    os.kill(hung, signal.SIGSTOP)       # silent for --heartbeat-timeout: killed, then healed
    status, err, left, out = finish(process, tmp_path)
    kill_quietly(hung, signal.SIGCONT)

    assert status == 0, err
    assert flags or "running eagerly" not in out, out      # the graphed case really replayed a graph
    heals = records_of(tmp_path, "recovered")
    print("GPU heals:", heals)
    assert [(r["rank"], r["generation"]) for r in heals] == [(1, 1), (0, 2)], heals
    assert heals[0]["cause"] == "was killed by signal SIGKILL"
    assert heals[1]["cause"].startswith("stopped responding")
    assert all(r["steps_lost"] <= 1 for r in heals)
    # the update under way when the peer died, and at most HEAL_DEPTH queued behind it
    assert all(max(filter(None, r["queued"]), default=0) <= HEAL_DEPTH + 1 for r in heals), heals
    assert records_of(tmp_path, "restart") == []
    assert left == [] and left_in_tmp(tmp_path) == []

    _, straight = run_train(tmp_path, *FLAGS, *flags, name="straight")
    healed, expected = flat_params(tmp_path / "model.pt"), flat_params(straight)
    losses = [[round(r["train_loss"], 6) for r in read_metrics(log) if r["event"] == "epoch"]
              for log in (tmp_path / "logs" / "metrics.jsonl", tmp_path / "straight" / "metrics.jsonl")]
    print("epoch losses, healed and uninterrupted:", losses)
    print("max abs difference from the uninterrupted run:", (healed - expected).abs().max().item())
    assert torch.equal(healed, expected)        # bit for bit


@pytest.mark.parametrize("flags", [[], ["--no-cuda-graph"], ["--bucket-mb", "0.00001"]],
                         ids=["graphed", "eager", "graphed-two-buckets"])
def test_a_gpu_worker_of_a_sharded_run_killed_is_healed_from_its_shards_replica_bit_for_bit(tmp_path, monkeypatch,
                                                                                         flags):
    """--zero 2 on 2 GPUs with --heal on: the shards' updates (the rank's and its replica's of the other rank's
    shard) are guarded by the ticket, graphed or not, and the killed rank's shard comes back from the
    survivor's replica; the run ends on the uninterrupted run's parameters and optimizer state. Two buckets
    (the bias, then the weight): the graphed step with more than one bucket replays too."""
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    (tmp_path / "spinning_model.py").write_text(SPINNING_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    sharded = [*FLAGS, *flags, "--zero", "2", "--heal", "on", "--max-restarts", "1", "--optimizer", "adamw",
               "--clip-grad", "0.5"]
    status, err, left, out = killed_at(tmp_path, sharded, step=50)

    assert status == 0, err
    assert "--no-cuda-graph" in flags or "running eagerly" not in out, out
    [heal] = records_of(tmp_path, "recovered")
    print("sharded GPU heal:", heal)
    assert heal["rank"] == 1 and heal["donor"] == 0 and heal["steps_lost"] == 0
    assert records_of(tmp_path, "restart") == [] and left == []
    _, straight = run_train(tmp_path, *sharded, name="straight")
    for name, read in (("parameters", flat_params), ("optimizer state", optimizer_state)):
        differ = (read(tmp_path / "model.pt") - read(straight)).abs()
        print(f"{name}: {int((differ > 0).sum())} of {differ.numel()} differ from the uninterrupted run's, first at "
              f"{(differ > 0).nonzero().flatten()[:8].tolist()}, by at most {differ.max().item()}")
    assert torch.equal(flat_params(tmp_path / "model.pt"), flat_params(straight))
    assert torch.equal(optimizer_state(tmp_path / "model.pt"), optimizer_state(straight))


def test_a_graphed_sharded_run_that_heals_in_place_replays_with_many_large_buckets(tmp_path):
    """--zero 2 --heal on, graphed, on the tiny GPT with 0.05 MB buckets: the replica's send/recv shares the graph
    with the shards' reduce-scatters and all-gathers. With NCCL registering the graph's buffers (its default) the
    first replay never ended on 2 x H200 (bench/results/2026-11-26-h200x2-zero-heal-hang); the run must train."""
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    tokens = make_token_files(tmp_path / "tokens", train_tokens=200_000, vocab=256)
    process = start_train(tmp_path, "--gpus", "0,1", "--model", "gpt", "--model-options", '{"size": "tiny"}',
                          "--dataset", "tokens", "--data-dir", str(tokens), "--dataset-options", '{"block_size": 256}',
                          "--batch-size", "8", "--optimizer", "adamw", "--clip-grad", "1.0", "--amp", "bf16",
                          "--zero", "2", "--heal", "on", "--max-restarts", "1", "--bucket-mb", "0.05",
                          "--max-steps", "30", "--heartbeat-timeout", "10")
    status, err, left, out = finish(process, tmp_path)

    assert status == 0, err
    assert "running eagerly" not in out, out
    assert torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=False)["step"] == 30
