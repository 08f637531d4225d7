"""--zero's all-gather overlapped with the next forward (harness/collectives/prefetch.py): the schedule
waits for each bucket no later than its first read, whoever reads it, and two CPU workers whose steps
replay a static forward train the parameters of replicas."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from harness import Parent
from harness.collectives.async_worker import Solo
from harness.collectives.flat import FlatParameters
from harness.collectives.prefetch import ReadOrder
from harness.collectives.shards import ShardedGradients, ShardLayout
from harness.collectives.sync import BucketedGradientAveraging
from harness.training.step import TrainStep
from tests.helpers.collectives import small_model

TINY_MB = 1e-6      # every parameter a bucket of its own


class Tangled(torch.nn.Module):
    """Parameters read away from their modules: the head is the embedding (tied), the parent reads the
    body's weight before the body runs and a scale of its own in between; one layer is never called."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 8)
        self.body = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.ones(8))
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight
        self.unused = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + h @ self.body.weight.t()
        return self.head(self.body(h * self.scale))


def test_each_bucket_is_waited_for_no_later_than_its_first_read_whoever_reads_it():
    model = Tangled()
    flat = FlatParameters(model)
    layout = ShardLayout(flat, 1, 0, bucket_mb=TINY_MB)
    bucket = {id(b.params[0]): index for index, b in enumerate(layout.buckets)}
    assert len(bucket) == len(layout.buckets) == 6
    with ReadOrder(model, layout) as watch:
        model(torch.tensor([[1, 2, 3]])).sum()
    schedule = watch.schedule()
    waited = schedule.first + [i for due in schedule.at.values() for i in due]
    assert sorted(waited) == list(range(6))
    of = lambda *params: [bucket[id(p)] for p in params]
    assert sorted(schedule.first) == sorted(of(model.unused.weight, model.unused.bias))
    # the body's weight and the scale are read by the parent after the embedding began, before the body did
    assert schedule.at == {model.embed: of(model.embed.weight, model.body.weight, model.scale),
                           model.body: of(model.body.bias)}


def test_a_hugging_face_gpt2_is_waited_for_layer_by_layer_its_tied_head_at_the_embedding():
    """transformers' GPT-2 (its Conv1D layers, a loss computed inside, the head tied to the embedding): every
    bucket waited for inside the forward, the embedding's at the embedding, the last block's at the last block."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    layout = ShardLayout(FlatParameters(model), 2, 0, bucket_mb=0.01)
    with ReadOrder(model, layout) as watch:
        model(input_ids=torch.randint(0, 100, (2, 8)), labels=torch.randint(0, 100, (2, 8)))
    schedule = watch.schedule()
    bucket = {id(p): index for index, b in enumerate(layout.buckets) for p in b.params}
    assert schedule.first == []
    assert sorted(i for due in schedule.at.values() for i in due) == list(range(len(layout.buckets)))
    assert bucket[id(model.lm_head.weight)] in schedule.at[model.transformer.wte]
    assert bucket[id(model.transformer.h[1].mlp.c_proj.weight)] in schedule.at[model.transformer.h[1].mlp.c_proj]


def test_a_watched_forward_leaves_no_hook_and_the_schedule_hooks_only_modules_that_wait():
    model = Tangled()
    flat = FlatParameters(model, flatten_grads=False)
    sync = ShardedGradients(Solo(), flat, ShardLayout(flat, 1, 0, bucket_mb=TINY_MB), stage=2, model=model)
    hooks = lambda: {name: len(m._forward_pre_hooks) for name, m in model.named_modules() if m._forward_pre_hooks}
    sync.zero_grad()
    sync.before_forward(static=True)
    assert hooks() == {"": 1, "embed": 1, "body": 1, "head": 1, "unused": 1}      # the watch's
    loss = model(torch.tensor([[1, 2, 3]])).sum()
    sync.before_backward()
    assert hooks() == {"embed": 1, "body": 1}
    loss.backward()
    sync.after_backward()
    sync.close()
    assert hooks() == {}


def test_a_watched_forward_that_raises_leaves_no_watch_once_the_parameters_are_gathered():
    model = Tangled()
    flat = FlatParameters(model, flatten_grads=False)
    sync = ShardedGradients(Solo(), flat, ShardLayout(flat, 1, 0, bucket_mb=TINY_MB), stage=2, model=model)
    sync.zero_grad()
    sync.before_forward(static=True)
    with pytest.raises(IndexError):
        model(torch.tensor([[10]]))         # past the embedding's 10 rows
    sync.finish()
    assert _get_current_dispatch_mode() is None
    assert not any(m._forward_pre_hooks for m in model.modules())


def train(ctx, zero: int, static: bool, updates: int = 4) -> dict:
    """``updates`` AdamW updates of ``small_model``, clipped, two micro-batches each, on this rank's batches;
    ``static``: the step's forward counts as replayed, so --zero's all-gathers overlap it by the schedule."""
    model = small_model()
    comm = ctx.communicator()
    flat = FlatParameters(model, flatten_grads=zero != 2)
    if zero:
        layout = ShardLayout(flat, comm.size, ctx.rank, bucket_mb=TINY_MB)
        sync, params = ShardedGradients(comm, flat, layout, zero, model=model), layout.pieces
    else:
        sync, params = BucketedGradientAveraging(comm, flat, bucket_mb=TINY_MB), model.parameters()
    optimizer = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, foreach=False)
    compute = lambda batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1])
    step = TrainStep(model, compute, optimizer, flat, sync, contextlib.nullcontext, clip=0.5, accum=2)
    step.static = static
    sync.start()
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(updates):
        step((torch.randn(16, 20, generator=generator), torch.randn(16, 5, generator=generator)))
        sync.after_step(0)
    sync.finish()
    schedule = sync.prefetch.schedule if static and zero else None
    return {"params": [p.detach().clone() for p in flat.params], "hooked": len(schedule.at) if schedule else 0,
            "first": schedule.first if schedule else None,
            "padded": [b.padded for b in layout.buckets] if zero else None}


@pytest.fixture(scope="module")
def pair():
    with Parent() as parent:
        yield parent.fork(2)


@pytest.mark.parametrize("zero", [1, 2])
def test_sharded_workers_overlapping_the_all_gather_with_a_static_forward_train_as_replicas(pair, zero):
    pair.exec(train, 0, False)
    replicas = pair.wait()
    pair.exec(train, zero, True)
    overlapped = pair.wait()
    pair.exec(train, zero, False)
    before_forward = pair.wait()
    # the schedule puts every bucket at its layer's start, none before the forward: the padded one (the last bias,
    # 5 elements over 2 ranks) too, whose copy out of the staging slot (before the forward) is no read of it
    assert overlapped[0]["hooked"] == 3 and overlapped[0]["first"] == [] and any(overlapped[0]["padded"])
    for rank in range(2):
        for got, want, eager in zip(overlapped[rank]["params"], replicas[rank]["params"], before_forward[rank]["params"]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            assert torch.equal(got, eager)
