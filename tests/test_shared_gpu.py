"""Several workers per GPU on real GPUs: CUDA IPC within a GPU, NCCL among the leaders, MPS."""
import shutil

import pytest

import Train
from harness.training import run as train
from harness import Parent
from harness.launch.mps import MpsDaemon
from tests.helpers.collectives import assert_dead_peer_raises_childfailed, check_matrix, make_inputs, run_matrix
from tests.helpers.gpus import has_gpus
from tests.helpers.training import flat_params

pytestmark = pytest.mark.gpu


def needs(n):
    if not has_gpus(n):
        pytest.skip(f"needs {n} CUDA GPU(s)")


@pytest.mark.parametrize("workers, gpus", [(2, [0]), (3, [0]), (4, [0, 1])], ids=["2-on-1", "3-on-1", "2+2-on-2"])
def test_every_op_dtype_and_placement_matches_float64_reference(workers, gpus):
    needs(len(gpus))
    inputs = make_inputs(workers)
    with Parent() as parent:
        kids = parent.fork(workers, gpus=gpus)
        kids.exec(lambda ctx: type(ctx.communicator()).__name__)
        assert kids.wait() == ["HierarchicalCommunicator"] * workers
        kids.exec(run_matrix, inputs)
        results = kids.wait()
    assert check_matrix(inputs, results) == workers * len(results[0]) > 0


def run(tmp_path, name, *flags):
    args = Train.parse_args(["--epochs", "1", "--seed", "3", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1", "--no-tf32",
                             "--save", str(tmp_path / f"{name}.pt"), "--log-dir", str(tmp_path / name), *flags])
    return train(args), tmp_path / f"{name}.pt"


def relative_error(a, b):
    return ((flat_params(a) - flat_params(b)).norm() / flat_params(b).norm()).item()


def test_two_workers_on_one_gpu_equal_one_worker_with_double_batch(tmp_path):
    needs(1)
    shared, a = run(tmp_path, "shared", "--gpus", "0", "--workers-per-gpu", "2", "--batch-size", "8")
    _, b = run(tmp_path, "single", "--gpus", "0", "--batch-size", "16")
    assert len({r["checksum"] for r in shared}) == 1
    assert relative_error(a, b) <= 1e-5


def test_two_workers_on_one_gpu_equal_two_workers_on_two_gpus(tmp_path):
    needs(2)
    _, a = run(tmp_path, "shared", "--gpus", "0", "--workers-per-gpu", "2", "--batch-size", "8")
    _, b = run(tmp_path, "spread", "--gpus", "0,1", "--batch-size", "8")
    assert relative_error(a, b) <= 1e-5


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="needs nvidia-cuda-mps-control")
def test_param_mode_under_a_private_mps_daemon(tmp_path, capfd):
    needs(1)
    results, _ = run(tmp_path, "mps", "--gpus", "0", "--workers-per-gpu", "2", "--mode", "param", "--avg-every", "4",
                     "--mps")
    assert len({r["checksum"] for r in results}) == 1
    assert "started a private MPS daemon" in capfd.readouterr().out
    daemon = MpsDaemon(tmp_path / "mps" / "mps" / "mps-pipe", tmp_path / "mps" / "mps" / "mps-log")
    assert not daemon.answers()                          # stopped at the end


@pytest.mark.parametrize("victim", [0, 1], ids=["leader", "member"])
def test_a_dying_worker_sharing_a_gpu_raises_childfailed(victim):
    needs(1)
    assert_dead_peer_raises_childfailed(2, [0], victim)
