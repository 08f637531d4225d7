"""Gradient bucketing: buckets tile the flat gradient, launch in one fixed order, and give the
same result as all-reducing the whole flat gradient. The launch order is checked on two CPU children
whose real gloo communicator notes each call (``Recording``), so the gradients are really averaged.
Whole runs of bucketed and flat training are compared in tests/test_recipe.py
(test_workers_times_micro_batches_equal_one_large_batch_bucketed_flat_and_compiled)."""
import pytest
import torch

from harness import Parent
from harness.collectives.flat import FlatParameters
from harness.collectives.sync import BucketedGradientAveraging
from harness.training.build import flat_gradients
from harness.training.config import TrainConfig
from tests.helpers.collectives import Recording, small_model
from tests.helpers.training import run_train


@pytest.fixture(scope="module")
def pair():
    with Parent() as parent:
        yield parent.fork(2)


def synchronise(ctx, bucket_mb: float | None, out_of_order: bool = False) -> dict:
    """One backward pass of ``small_model`` on this rank's own batch, its gradients averaged by
    buckets of ``bucket_mb`` (None: the default, one bucket) over a recording gloo communicator; or,
    ``out_of_order``, the buckets' gradients reported last layer last. Returns what the test checks."""
    model, reference = small_model(), small_model()
    flat, comm = FlatParameters(model), Recording(ctx.communicator())
    sync = BucketedGradientAveraging(comm, flat, **({} if bucket_mb is None else {"bucket_mb": bucket_mb}))
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(ctx.rank))
    reference(x).sum().backward()
    if out_of_order:
        with sync.no_sync():                     # the gradients, without their hooks' launches
            model(x).sum().backward()
        params = list(model.parameters())
        sync.order._on_gradient(params[0])             # the last bucket fills first: nothing may launch
        early = list(comm.calls)
        for param in reversed(params[1:]):
            sync.order._on_gradient(param)
    else:
        model(x).sum().backward()
        early = list(comm.calls)                 # launched during backward
    sync.after_backward()
    return {"buckets": [(b.view.data_ptr(), b.view.numel()) for b in sync.buckets], "calls": comm.calls,
            "early": early, "hooks": len(sync.order._hooks), "whole": (flat.grads[0].data_ptr(), flat.grads[0].numel()),
            "mine": [p.grad for p in reference.parameters()], "averaged": [p.grad for p in model.parameters()]}


def assert_averaged(results: list[dict]) -> None:
    """Every rank ends with the mean of the ranks' own gradients."""
    for i, mine in enumerate(zip(*(r["mine"] for r in results))):
        expected = torch.stack(mine).mean(0)
        for r in results:
            torch.testing.assert_close(r["averaged"][i], expected)


def test_buckets_tile_the_flat_gradient_in_reverse_order(pair):
    pair.exec(synchronise, 4096 * 4 / 2**20)                 # about 4096 floats each
    results = pair.wait()
    for result in results:
        starts = [start for start, _ in result["buckets"]]
        assert len(starts) > 1 and starts == sorted(starts, reverse=True)     # last layers first
        assert sum(n for _, n in result["buckets"]) == result["whole"][1]
        assert [c[:2] for c in result["calls"]] == result["buckets"]
        assert {c[2:] for c in result["calls"]} == {("avg", True)}
    assert_averaged(results)


def test_a_model_in_one_bucket_gets_one_synchronous_all_reduce_and_no_hooks(pair):
    pair.exec(synchronise, None)                             # 25 MB: the whole model
    results = pair.wait()
    for result in results:
        assert len(result["buckets"]) == 1 and result["hooks"] == 0
        assert result["early"] == []                         # nothing launched during backward
        assert result["calls"] == [(*result["whole"], "avg", False)]
    assert_averaged(results)


def test_buckets_launch_in_index_order_even_when_gradients_arrive_out_of_order(pair):
    pair.exec(synchronise, 1e-6, out_of_order=True)         # one bucket per parameter
    results = pair.wait()
    for result in results:
        assert result["early"] == []
        assert [c[:2] for c in result["calls"]] == result["buckets"]
    assert_averaged(results)


def test_bf16_reduction_keeps_replicas_identical(tmp_path):
    results, _ = run_train(tmp_path, "--epochs", "1", "--reduce-dtype", "bf16", "--bucket-mb", "0.01")
    assert len({r["checksum"] for r in results}) == 1


@pytest.mark.parametrize("world, flags, flat", [
    (1, {}, False),                                     # averages nothing: autograd's own gradients
    (2, {}, True),                                      # all-reduced from the flat buffers
    (1, {"zero": 1}, True),                             # --zero 1 reduce-scatters its buffers, even alone
    (2, {"zero": 2}, False),                            # --zero 2 keeps its shard only
    (1, {"mode": "param", "outer_optimizer": "nesterov"}, False),   # param and async modes exchange
    (2, {"mode": "param"}, False),                                   # parameters, never gradients
    (2, {"mode": "param", "avg_every": 4, "avg_optimizer_state": True}, False),
    (2, {"mode": "async"}, False),
])
def test_only_grad_mode_that_averages_or_shards_keeps_flat_gradients(world, flags, flat):
    assert flat_gradients(TrainConfig(**flags), world) is flat
