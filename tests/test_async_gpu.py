"""--mode async on GPU workers: two workers sharing one GPU, each stepping in its CUDA graph (or compiled),
push to the parent's server and continue from its answer. At S = 0 that is synchronous DiLoCo on the same
GPU; a stop resumes bit for bit; at S = 1 the run ends on its budget exactly; a killed worker is replaced in place."""
import os
import signal

import pytest
import torch

from harness.training.metrics import read_metrics
from tests.helpers.gpus import has_gpus
from tests.helpers.runs import finish, interrupt, start_train, wait_for_record, workers_of
from tests.helpers.training import flat_params, run_train

pytestmark = pytest.mark.gpu

SHARED = ["--gpus", "0", "--workers-per-gpu", "2", "--no-tf32"]
SERVED = ["--avg-every", "8", "--outer-optimizer", "nesterov", "--optimizer", "adamw", "--lr", "1e-3",
          "--batch-size", "8"]


def needs_a_gpu() -> None:
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("flags", [[], ["--compile"]])
def test_staleness_0_on_a_gpu_trains_the_parameters_of_synchronous_diloco_in_the_graph(tmp_path, capfd, flags):
    """Param mode's workers sharing a GPU step eagerly (they signal each other from the host): an eager async run
    equals them bit for bit, a graphed one within what graphing changes of an eager step (test_train_gpu.py)."""
    needs_a_gpu()
    common = [*SHARED, *SERVED, "--max-steps", "40", "--save-every-steps", "12", *flags]
    results, graphed = run_train(tmp_path, "--mode", "async", "--max-staleness", "0", *common, name="graphed")
    assert "running eagerly" not in capfd.readouterr().out
    _, eager = run_train(tmp_path, "--mode", "async", "--max-staleness", "0", *common, "--no-cuda-graph", name="eager")
    _, synchronous = run_train(tmp_path, "--mode", "param", *common, name="sync")
    assert torch.equal(flat_params(eager), flat_params(synchronous))
    graphed, synchronous = flat_params(graphed), flat_params(synchronous)
    assert (graphed - synchronous).norm() <= 1e-5 * synchronous.norm(), (graphed - synchronous).abs().max()
    assert len({r["checksum"] for r in results}) == 1 and [r["step"] for r in results] == [40, 40]
    syncs = [r for r in read_metrics(tmp_path / "graphed" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert [(r["step"], r["rank"]) for r in syncs] == [(s, rank) for s in range(8, 41, 8) for rank in (0, 1)]


def test_a_gpu_run_stopped_by_sigterm_resumes_bit_for_bit_with_int8_exchanges(tmp_path):
    needs_a_gpu()
    flags = [*SHARED, "--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "2000",
             "--outer-dtype", "int8"]
    step, checkpoint = interrupt(tmp_path, signal.SIGTERM, False, flags)
    assert 0 < step < 2000 and step % 8 == 0
    _, straight = run_train(tmp_path, *flags, name="straight")
    _, resumed = run_train(tmp_path, *flags, "--resume", checkpoint, name="resumed")
    assert torch.equal(flat_params(straight), flat_params(resumed))


def test_at_staleness_1_gpu_workers_spend_the_budget_exactly_within_the_bound(tmp_path, capfd):
    needs_a_gpu()
    results, _ = run_train(tmp_path, *SHARED, "--mode", "async", "--max-staleness", "1", *SERVED,
                           "--max-steps", "60", "--outer-delay", "2", name="uneven")
    assert "running eagerly" not in capfd.readouterr().out
    syncs = [r for r in read_metrics(tmp_path / "uneven" / "metrics.jsonl") if r["event"] == "outer_sync"]
    assert max(r["staleness"] for r in syncs) <= 1
    ran = [sum(r["inner_updates"] for r in syncs if r["rank"] == rank) for rank in (0, 1)]
    assert sum(ran) == 2 * 60 and [r["step"] for r in results] == ran
    assert len({r["checksum"] for r in results}) == 1          # parked at the end, on the anchor


def test_a_killed_gpu_worker_is_replaced_in_place_and_the_run_spends_its_budget_exactly(tmp_path):
    """The replacement (the warm spare, pinned to the dead worker's GPU) captures its own graph and rejoins the
    server; the other worker never stops."""
    needs_a_gpu()
    flags = [*SHARED, "--mode", "async", "--max-staleness", "0", *SERVED, "--max-steps", "2000", "--max-restarts", "1"]
    process = start_train(tmp_path, *flags)
    wait_for_record(process, tmp_path, lambda records: any(
        r["event"] == "outer_sync" and r["rank"] == 1 and r["step"] >= 16 for r in records))
    os.kill(workers_of(process)[1], signal.SIGKILL)
    status, err, left, out = finish(process, tmp_path)
    assert status == 0, err
    assert "running eagerly" not in out
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [r["rank"] for r in records if r["event"] == "recovered"] == [1]
    assert not [r for r in records if r["event"] == "restart"]
    syncs = [r for r in records if r["event"] == "outer_sync"]
    assert sum(r["inner_updates"] for r in syncs) == 2 * 2000 and max(r["staleness"] for r in syncs) == 0
    assert left == []
