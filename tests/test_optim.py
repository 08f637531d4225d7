import copy
import math

import pytest
import torch

from harness.training.ccnesterov import CCNesterov
from harness.training.optim import FUSED, OPTIMIZERS, build_optimizer, load_optimizer_state

LR, CURVATURE = 0.1, 2.0  # f(x) = CURVATURE / 2 * |x|^2, so grad = CURVATURE * x


def quadratic_steps(opt: torch.optim.Optimizer, x: torch.nn.Parameter, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        (CURVATURE / 2 * x.pow(2).sum()).backward()
        opt.step()


def test_builds_every_listed_optimizer():
    expected = {
        "sgd": torch.optim.SGD,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "adagrad": torch.optim.Adagrad,
        "adadelta": torch.optim.Adadelta,
        "ccnesterov": CCNesterov,
    }
    assert set(OPTIMIZERS) == set(expected)
    for name, cls in expected.items():
        opt = build_optimizer(name, [torch.nn.Parameter(torch.ones(2))], lr=0.01, weight_decay=1e-4)
        assert type(opt) is cls
        assert opt.param_groups[0]["weight_decay"] == 1e-4


def test_sgd_gets_momentum_and_nesterov():
    opt = build_optimizer("sgd", [torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9, nesterov=True)
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["nesterov"]


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("rmsprop", {}, "unknown optimizer 'rmsprop'; valid names: sgd, adam"),
        ("sgd", {"lr": 0.0}, "lr=0.0"),
        ("sgd", {"nesterov": True}, "nesterov needs momentum > 0"),
        ("adam", {"momentum": 0.9}, "only to sgd"),
        ("ccnesterov", {"nesterov": True, "momentum": 0.9}, "only to sgd"),
        ("adadelta", {"impl": "fused"}, "torch has no fused adadelta; fused optimizers: sgd, adam"),
        ("ccnesterov", {"impl": "foreach"}, "ccnesterov has a single implementation"),
        ("adam", {"impl": "triton"}, "unknown optimizer implementation 'triton'; valid names: fused, foreach"),
    ],
)
def test_bad_arguments_raise(name, kwargs, match):
    kwargs = {"lr": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_optimizer(name, [torch.nn.Parameter(torch.ones(2))], **kwargs)


def _steps(name: str, impl: str | None, steps: int = 5,
           make=build_optimizer) -> tuple[torch.optim.Optimizer, torch.Tensor]:
    """``steps`` updates on sin's gradient from seeded parameters; ``make(name, params, **options)``
    builds the optimizer (the harness's ``build_optimizer`` unless told otherwise)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in ((7, 3), (3,), (4, 7))]
    options = {"momentum": 0.9} if name == "sgd" else {}
    opt = make(name, params, lr=0.01, weight_decay=1e-3, impl=impl, **options)
    for _ in range(steps):
        opt.zero_grad()
        sum(p.sin().sum() for p in params).backward()
        opt.step()
    return opt, torch.cat([p.detach().flatten() for p in params])


def _torch_for_loop(name: str, params, impl: str | None = None, **options) -> torch.optim.Optimizer:
    """torch's own optimizer, neither fused nor foreach (``impl`` aside): its plain per-parameter loop,
    the reference every implementation the harness builds must match."""
    return TORCH[name](params, foreach=False, **options)


TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
         "adagrad": torch.optim.Adagrad, "adadelta": torch.optim.Adadelta}


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS if n != "ccnesterov"])
def test_implementations_compute_the_same_update_and_the_default_is_fused_where_torch_has_it(name):
    _, expected = _steps(name, None, make=_torch_for_loop)
    default, updated = _steps(name, None)
    group = default.param_groups[0]
    assert bool(group.get("fused")) == (name in FUSED) and bool(group.get("foreach")) == (name not in FUSED)
    torch.testing.assert_close(updated, expected, rtol=1e-5, atol=1e-6)
    for impl in ("fused", "foreach") if name in FUSED else ("foreach",):
        torch.testing.assert_close(_steps(name, impl)[1], expected, rtol=1e-5, atol=1e-6)


def test_resuming_keeps_this_runs_implementation():
    saved, _ = _steps("adamw", "foreach", steps=2)        # torch would take foreach from the saved groups
    opt, _ = _steps("adamw", "fused", steps=0)
    load_optimizer_state(opt, saved.state_dict())
    assert opt.param_groups[0]["fused"] and not opt.param_groups[0]["foreach"]
    assert all(s["step"].dtype == torch.float32 and s["step"].item() == 2 for s in opt.state.values())


def test_resuming_with_other_optimizer_flags_trains_with_them_and_keeps_the_saved_momentum():
    """--resume with --lr, --momentum, --weight-decay or --nesterov changed: the run's values, not the saved ones
    (torch's load_state_dict takes every group setting from the checkpoint)."""
    param = torch.nn.Parameter(torch.ones(3))
    saved = build_optimizer("sgd", [param], lr=0.05, momentum=0.9, weight_decay=0.0)
    param.grad = torch.ones(3)
    saved.step()
    resumed = build_optimizer("sgd", [param], lr=0.5, momentum=0.5, weight_decay=0.1, nesterov=True)
    load_optimizer_state(resumed, saved.state_dict())
    group = resumed.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (0.5, 0.5, 0.1, True)
    assert torch.equal(resumed.state[param]["momentum_buffer"], torch.ones(3))     # the state is the saved one


def test_ccnesterov_matches_hand_computed_steps():
    lam1 = 1.0  # from lambda_0 = 0
    lam2 = (1 + math.sqrt(1 + 4 * lam1**2)) / 2
    lam3 = (1 + math.sqrt(1 + 4 * lam2**2)) / 2
    lam4 = (1 + math.sqrt(1 + 4 * lam3**2)) / 2
    gamma1, gamma2, gamma3 = (1 - lam1) / lam2, (1 - lam2) / lam3, (1 - lam3) / lam4
    x0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    y1 = x0
    y2 = x0 - LR * CURVATURE * x0
    x1 = (1 - gamma1) * y2 + gamma1 * y1
    y3 = x1 - LR * CURVATURE * x1
    x2 = (1 - gamma2) * y3 + gamma2 * y2
    y4 = x2 - LR * CURVATURE * x2
    x3 = (1 - gamma3) * y4 + gamma3 * y3

    x = torch.nn.Parameter(x0.clone())
    opt = build_optimizer("ccnesterov", [x], lr=LR)
    taken = []
    for expected in (x1, x2, x3):
        quadratic_steps(opt, x, 1)
        torch.testing.assert_close(x.detach(), expected)
        taken.append(x.detach().clone())
    # the first step is plain descent; the later ones go past the descent step, away from its start
    torch.testing.assert_close(taken[0], x0 - LR * CURVATURE * x0)
    descent = taken[0] - LR * CURVATURE * taken[0]
    assert torch.all((taken[1] - descent) * (descent - taken[0]) > 0)


def test_ccnesterov_weight_decay_adds_l2_gradient():
    x = torch.nn.Parameter(torch.tensor([3.0], dtype=torch.float64))
    opt = CCNesterov([x], lr=LR, weight_decay=0.5)
    quadratic_steps(opt, x, 1)
    expected = 3.0 - LR * (CURVATURE * 3.0 + 0.5 * 3.0)
    torch.testing.assert_close(x.detach(), torch.tensor([expected], dtype=torch.float64))


def test_ccnesterov_converges_on_quadratic():
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    quadratic_steps(CCNesterov([x], lr=LR), x, 60)
    assert x.detach().abs().max() < 1e-3


def test_ccnesterov_state_dict_resumes_exactly():
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = CCNesterov([x], lr=LR)
    quadratic_steps(opt, x, 3)
    saved_x, saved_state = x.detach().clone(), copy.deepcopy(opt.state_dict())
    quadratic_steps(opt, x, 3)

    resumed = torch.nn.Parameter(saved_x)
    resumed_opt = CCNesterov([resumed], lr=LR)
    resumed_opt.load_state_dict(saved_state)
    quadratic_steps(resumed_opt, resumed, 3)
    assert torch.equal(resumed.detach(), x.detach())
