"""Gradient bucketing: buckets tile the flat gradient, launch in one fixed order, and give the
same result as all-reducing the whole flat gradient."""
import torch

from harness.collectives.base import Work
from harness.collectives.flat import FlatParameters
from harness.collectives.sync import BucketedGradientAveraging
from test_train import flat_params, run_train


class RecordingComm:
    def __init__(self):
        self.calls = []

    def all_reduce(self, t, op="sum", async_op=False):
        self.calls.append((t.data_ptr(), t.numel(), op, async_op))
        return Work() if async_op else None


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 5))


def test_buckets_tile_the_flat_gradient_in_reverse_order():
    model = _model()
    flat = FlatParameters(model)
    comm = RecordingComm()
    sync = BucketedGradientAveraging(comm, flat, bucket_mb=4096 * 4 / 2**20)   # about 4096 floats each
    starts = [b.view.data_ptr() for b in sync.buckets]
    assert starts == sorted(starts, reverse=True)                # last layers first
    assert sum(b.view.numel() for b in sync.buckets) == flat.grads[0].numel()
    model(torch.randn(8, 20)).sum().backward()
    sync.after_backward()
    assert [c[:2] for c in comm.calls] == [(b.view.data_ptr(), b.view.numel()) for b in sync.buckets]
    assert {c[2:] for c in comm.calls} == {("avg", True)}


def test_a_model_in_one_bucket_gets_one_synchronous_all_reduce_and_no_hooks():
    model = _model()
    flat = FlatParameters(model)
    comm = RecordingComm()
    sync = BucketedGradientAveraging(comm, flat)                        # 25 MB: the whole model
    assert len(sync.buckets) == 1 and sync._hooks == []
    model(torch.randn(8, 20)).sum().backward()
    assert comm.calls == []                                             # nothing launched during backward
    sync.after_backward()
    assert comm.calls == [(flat.grads[0].data_ptr(), flat.grads[0].numel(), "avg", False)]


def test_buckets_launch_in_index_order_even_when_gradients_arrive_out_of_order():
    model = _model()
    flat = FlatParameters(model)
    comm = RecordingComm()
    sync = BucketedGradientAveraging(comm, flat, bucket_mb=1e-6)     # one bucket per parameter
    params = list(model.parameters())
    sync._on_gradient(params[0])              # the last bucket fills first: nothing may launch
    assert comm.calls == []
    for param in reversed(params[1:]):
        sync._on_gradient(param)
    assert len(comm.calls) == len(sync.buckets)
    assert [c[0] for c in comm.calls] == [b.view.data_ptr() for b in sync.buckets]


def test_bucketed_training_equals_flat_all_reduce(tmp_path):
    common = ["--epochs", "2", "--seed", "7", "--cpu-workers", "2"]
    run_train(tmp_path, *common, "--grad-sync", "flat", name="flat")
    results, _ = run_train(tmp_path, *common, "--grad-sync", "bucketed", "--bucket-mb", "0.01", name="bucketed")
    assert len({r["checksum"] for r in results}) == 1
    a, b = flat_params(tmp_path / "bucketed.pt"), flat_params(tmp_path / "flat.pt")
    assert (a - b).norm() / b.norm() <= 1e-6


def test_bf16_reduction_keeps_replicas_identical(tmp_path):
    results, _ = run_train(tmp_path, "--epochs", "1", "--reduce-dtype", "bf16", "--bucket-mb", "0.01")
    assert len({r["checksum"] for r in results}) == 1
