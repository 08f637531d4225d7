import copy

import pytest
import torch
from torch import nn

from harness.collectives.flat import FlatParameters


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 6)
        self.out = nn.Linear(6, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.hidden(self.embed(tokens))))


def inside(tensor: torch.Tensor, flat: torch.Tensor) -> bool:
    start = flat.data_ptr()
    end = start + flat.numel() * flat.element_size()
    return start <= tensor.data_ptr() < end


def per_param_grads(model: nn.Module, loss_fn) -> torch.Tensor:
    loss_fn(model).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])


def mse(model: nn.Module) -> torch.Tensor:
    torch.manual_seed(1)
    return model(torch.randn(5, 4)).pow(2).mean()


def test_params_become_views_with_values_preserved():
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    flat = FlatParameters(model)
    assert len(flat.params) == len(flat.grads) == 1
    assert flat.numel() == sum(t.numel() for t in before)
    assert torch.equal(flat.params[0], torch.cat([t.reshape(-1) for t in before]))
    for param, old in zip(model.parameters(), before):
        assert torch.equal(param, old)
        assert inside(param, flat.params[0])
        assert inside(param.grad, flat.grads[0])
        assert not param.grad.any()


def test_backward_accumulates_into_flat_grad_buffer():
    model = small_model()
    expected = per_param_grads(copy.deepcopy(model), mse)
    flat = FlatParameters(model)
    mse(model).backward()
    torch.testing.assert_close(flat.grads[0], expected)
    mse(model).backward()
    torch.testing.assert_close(flat.grads[0], 2 * expected)
    flat.zero_grad()
    assert not flat.grads[0].any()
    assert all(inside(p.grad, flat.grads[0]) for p in model.parameters())


def test_without_flat_gradients_autograd_hands_its_own_over_and_zero_grad_lets_them_go():
    """A world of one keeps no flat gradient buffer: backward leaves autograd's own tensors as .grad (no add
    into a zeroed buffer), ``complete_grads`` lists them in the parameters' order, and ``zero_grad`` sets them
    to None, as a plain loop's ``zero_grad(set_to_none=True)`` does."""
    model = small_model()
    expected = per_param_grads(copy.deepcopy(model), mse)
    flat = FlatParameters(model, flatten_grads=False)
    assert flat.grads == [] and all(p.grad is None for p in model.parameters())
    assert flat.grad_nbytes() == sum(p.nbytes for p in model.parameters())
    mse(model).backward()
    assert flat.grads == [] and len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}) == 6
    torch.testing.assert_close(torch.cat([g.reshape(-1) for g in flat.complete_grads()]), expected)
    flat.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_a_parameter_backward_left_no_gradient_gets_zeros_with_or_without_flat_gradients():
    """As a flat buffer's zeroed view, so that the optimizer steps on it (weight decay) alike: one worker
    without flat gradients trains as N workers with them."""
    updated = []
    for flatten in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        flat = FlatParameters(model, flatten_grads=flatten)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
        before = model[1].weight.detach().clone()
        for _ in range(3):
            flat.zero_grad()
            model[0](torch.randn(5, 4)).sum().backward()        # the second layer gets no gradient
            grads = flat.grads if flatten else flat.complete_grads()
            assert len(grads) == (1 if flatten else 4) and not model[1].weight.grad.any()
            optimizer.step()
        updated.append(model[1].weight.detach().clone())
        assert not torch.equal(updated[-1], before)        # decayed
    torch.testing.assert_close(updated[0], updated[1], rtol=0, atol=0)


def test_tied_parameters_appear_once():
    model = TiedLM()
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    expected = per_param_grads(copy.deepcopy(model), lambda m: m(tokens).sum())
    flat = FlatParameters(model)
    assert flat.numel() == 10 * 6 + 6 * 6 + 6
    assert model.out.weight is model.embed.weight
    model(tokens).sum().backward()
    torch.testing.assert_close(flat.grads[0], expected)


def test_frozen_parameters_are_in_params_but_not_grads():
    model = small_model()
    model[0].weight.requires_grad_(False)
    flat = FlatParameters(model)
    assert flat.params[0].numel() == flat.numel()
    assert flat.grads[0].numel() == flat.numel() - model[0].weight.numel()
    assert inside(model[0].weight, flat.params[0])
    assert model[0].weight.grad is None
    segment_params = flat.grad_segments()[0][2]
    assert all(p is not model[0].weight for p in segment_params)


def test_model_without_trainable_parameters_is_rejected():
    model = small_model().requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        FlatParameters(model)


class MixedPrecision(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.full((3,), 2.0, dtype=torch.float64))

    def forward(self, x):
        return self.linear(x).double() * self.scale


def test_mixed_dtypes_give_one_group_each():
    torch.manual_seed(0)
    model = MixedPrecision()
    expected = copy.deepcopy(model)
    x = torch.randn(5, 4)
    expected(x).pow(2).sum().backward()
    flat = FlatParameters(model)
    model(x).pow(2).sum().backward()
    # A module's own parameters come before its children's, so scale (float64) is registered first.
    assert [b.dtype for b in flat.params] == [torch.float64, torch.float32]
    assert [b.dtype for b in flat.grads] == [torch.float64, torch.float32]
    torch.testing.assert_close(flat.grads[0], expected.scale.grad)
    linear = expected.linear
    torch.testing.assert_close(flat.grads[1], torch.cat([linear.weight.grad.reshape(-1), linear.bias.grad]))
    assert [index for index, _, _ in flat.grad_segments()] == [0, 1]


def test_grad_segments_list_parameters_in_reverse_registration_order():
    model = small_model()
    flat = FlatParameters(model)
    [(index, buffer, params)] = flat.grad_segments()
    assert index == 0 and buffer is flat.grads[0]
    assert [id(p) for p in params] == [id(p) for p in reversed(list(model.parameters()))]


def test_optimizer_step_updates_flat_buffer():
    model = small_model()
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = flat.params[0].clone()
    mse(model).backward()
    expected = before - 0.1 * flat.grads[0]
    optimizer.step()
    torch.testing.assert_close(flat.params[0], expected)
    assert all(inside(p, flat.params[0]) for p in model.parameters())


def test_load_state_dict_writes_into_views():
    model = small_model(seed=0)
    flat = FlatParameters(model)
    other = small_model(seed=1)
    model.load_state_dict(other.state_dict())
    expected = torch.cat([p.detach().reshape(-1) for p in other.parameters()])
    assert torch.equal(flat.params[0], expected)
    assert all(inside(p, flat.params[0]) for p in model.parameters())


def test_rebind_grads_repairs_detached_grads():
    model = small_model()
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mse(model).backward()
    optimizer.zero_grad()  # set_to_none=True detaches every grad from the buffer
    assert all(p.grad is None for p in model.parameters())
    mse(model).backward()
    assert not inside(model[0].weight.grad, flat.grads[0])
    assert flat.rebind_grads() == len(list(model.parameters()))
    assert not flat.grads[0].any()
    assert all(inside(p.grad, flat.grads[0]) for p in model.parameters())
    mse(model).backward()
    assert flat.grads[0].any()
    assert flat.rebind_grads() == 0


def test_floating_point_buffers_are_listed():
    model = small_model()
    flat = FlatParameters(model)
    bn = model[1]
    assert [id(b) for b in flat.buffers] == [id(bn.running_mean), id(bn.running_var)]


def test_checksum_matches_for_replicas_from_same_seed():
    a, b, c = FlatParameters(small_model(0)), FlatParameters(small_model(0)), FlatParameters(small_model(1))
    assert a.checksum() == b.checksum()
    assert a.checksum() != c.checksum()
    assert a.checksum() == pytest.approx(sum(p.double().sum().item() for p in a.params))


def test_fully_frozen_group_gets_no_grad_buffer():
    model = MixedPrecision()
    model.scale.requires_grad_(False)
    flat = FlatParameters(model)
    assert [b.dtype for b in flat.params] == [torch.float64, torch.float32]
    assert [b.dtype for b in flat.grads] == [torch.float32]
    [(index, buffer, _)] = flat.grad_segments()
    assert index == 0 and buffer is flat.grads[0]


def test_channels_last_parameters_and_gradients_keep_their_layout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3)).to(memory_format=torch.channels_last)
    reference = [p.detach().clone() for p in model.parameters()]
    flat = FlatParameters(model)
    for param, before in zip(model.parameters(), reference):
        assert torch.equal(param, before)
        if param.dim() == 4:
            assert param.is_contiguous(memory_format=torch.channels_last)
            assert param.grad.stride() == param.stride()
    model(torch.randn(2, 3, 10, 10).contiguous(memory_format=torch.channels_last)).sum().backward()
    weight = model[0].weight
    assert weight.grad.data_ptr() >= flat.grads[0].data_ptr() and weight.grad.abs().sum() > 0
    assert flat.rebind_grads() == 0
