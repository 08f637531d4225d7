"""The graphed step of a single GPU worker, at the level of its parts: what its warm-up leaves behind."""
import contextlib

import pytest
import torch

from harness.collectives.async_worker import Solo
from harness.collectives.flat import FlatParameters
from harness.collectives.sync import Synchroniser
from harness.training.step import GraphedTrainStep
from tests.helpers.gpus import has_gpus

pytestmark = pytest.mark.gpu


def test_a_single_workers_warm_up_lets_its_gradients_go_before_the_graph_is_recorded():
    """A world of one keeps autograd's gradients (no flat buffer); the warm-up's must be gone when its memory is
    handed back (``empty_cache``), or they stay allocated beside the graph's own for the whole run."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    flat = FlatParameters(model, flatten_grads=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    batch = (torch.randn(32, 64, device="cuda"), torch.randint(0, 8, (32,), device="cuda"))
    compute = lambda b: torch.nn.functional.cross_entropy(model(b[0]), b[1])
    before = [p.detach().clone() for p in model.parameters()]
    step = GraphedTrainStep(model, compute, optimizer, flat, Synchroniser(Solo(), flat), contextlib.nullcontext,
                            example=batch)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))     # the warm-up was undone
    step.capture()
    step(batch)
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_graphed_step_that_adds_its_micro_batches_in_the_compiled_backward_trains_as_autograds_adds():
    """harness/training/accumulation.py under the whole-step CUDA graph, Inductor compiling, bf16 autocast: after
    three updates of four micro-batches the parameters are those of the same graphed step whose compiled
    backward leaves the adds to autograd (the same float32 additions, in the same order)."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    from harness.training.accumulation import FusedAccumulation
    from harness.training.build import model_loss

    def train(fused: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
        flat = FlatParameters(model, flatten_grads=False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
        loss = lambda out, b: torch.nn.functional.cross_entropy(out.float(), b[1])     # noqa: E731
        compute = FusedAccumulation(model, loss) if fused else torch.compile(model_loss(model, loss))
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)     # noqa: E731
        g = torch.Generator(device="cuda").manual_seed(1)
        batches = [(torch.randn(128, 64, device="cuda", generator=g),
                    torch.randint(0, 8, (128,), device="cuda", generator=g)) for _ in range(3)]
        step = GraphedTrainStep(model, compute, optimizer, flat, Synchroniser(Solo(), flat), autocast,
                                example=batches[0], clip=1.0, accum=4)
        start = [p.detach().clone() for p in model.parameters()]
        step.capture()
        for batch in batches:
            step(batch)
        assert not any(torch.equal(p, q) for p, q in zip(model.parameters(), start))       # it trained
        return [p.detach().clone() for p in model.parameters()]

    fused, added = train(fused=True), train(fused=False)
    for got, want in zip(fused, added):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
