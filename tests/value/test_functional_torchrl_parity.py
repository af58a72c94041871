"""torchrl_ext.value.functional as a drop-in for TorchRL's functions: the calls TorchRL accepts
(``rolling_gamma``, a positional V-trace ``time_dim``) and the dtype of mixed-precision inputs.

References are TorchRL 0.14.1's functions on the same inputs in float64 (the inputs are first
rounded to their own dtype, so the float64 copies hold exactly the values given).
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torchrl.objectives.value.functional as trl

from torchrl_ext.value import functional as F

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
MIXED = [(base, odd) for base, odd in itertools.product(FLOATS, FLOATS) if base != odd]
# The floating tensors of each function, in its argument order after the discounts.
FLOATING = {
    "generalized_advantage_estimate": ("state_value", "next_state_value", "reward"),
    "td_lambda_return_estimate": ("next_state_value", "reward"),
    "vtrace_advantage_estimate": ("log_pi", "log_mu", "state_value", "next_state_value", "reward"),
}
CASES = [(name, odd_arg) for name, args in FLOATING.items() for odd_arg in args]


def _rollout(shape=(2, 9, 1), seed=0):
    gen = torch.Generator().manual_seed(seed)
    data = {name: torch.randn(shape, generator=gen, dtype=torch.float64)
            for name in ("state_value", "next_state_value", "reward", "log_pi", "log_mu")}
    data["log_pi"] *= 0.5
    data["log_mu"] *= 0.5
    data["done"] = torch.rand(shape, generator=gen) < 0.2
    data["terminated"] = data["done"] & (torch.rand(shape, generator=gen) < 0.5)
    return data


def _call(module, name, data):
    """``module.<name>`` with the TorchRL argument order; results as a tuple. The discounts
    are exact in float32, as TorchRL's GAE rounds ``gamma`` to it (``gamma * int_tensor``)."""
    floats = [data[arg] for arg in FLOATING[name]]
    flags = (data["done"], data["terminated"])
    if name == "generalized_advantage_estimate":
        out = module.generalized_advantage_estimate(0.96875, 0.875, *floats, *flags)
    elif name == "td_lambda_return_estimate":
        out = module.td_lambda_return_estimate(0.96875, 0.875, *floats, *flags)
    else:
        out = module.vtrace_advantage_estimate(0.96875, *floats, *flags, 1.0, 1.0)
    return out if isinstance(out, tuple) else (out,)


def _tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    scale = max(1.0, reference.abs().max().item())
    return (1e-5 if dtype == torch.float32 else 1e-10) * scale


@pytest.mark.parametrize("requires_grad", [False, True], ids=["fast", "autograd"])
@pytest.mark.parametrize("base,odd", MIXED, ids=[f"{b}-{o}".replace("torch.", "") for b, o in MIXED])
@pytest.mark.parametrize("name,odd_arg", CASES, ids=[f"{n.split('_')[0]}-{a}" for n, a in CASES])
def test_mixed_precision_inputs_are_promoted_as_torch_promotes_them(name, odd_arg, base, odd, requires_grad):
    """One argument in ``odd``, the others in ``base``: the results come back in (and are
    computed in) ``torch.promote_types(base, odd)``. Was: the dtype of ``state_value`` (GAE,
    V-trace) or ``reward`` (TD(lambda)), so float64 inputs were rounded to float16."""
    data = _rollout()
    for arg in FLOATING[name]:
        data[arg] = data[arg].to(odd if arg == odd_arg else base)
    promoted = torch.promote_types(base, odd)
    reference = _call(trl, name, {k: (v.double() if v.is_floating_point() else v) for k, v in data.items()})
    theirs = _call(trl, name, data)
    if requires_grad:
        data[odd_arg].requires_grad_(True)
    ours = _call(F, name, data)
    for mine, torchrls, exact in zip(ours, theirs, reference):
        assert mine.dtype == promoted
        # TorchRL's arithmetic promotes too, except where it writes into a buffer of
        # next_state_value's dtype (GAE's advantage, TD(lambda)): never wider than ours.
        assert torch.promote_types(torchrls.dtype, mine.dtype) == mine.dtype
        error = (mine.detach().double() - exact).abs().max().item()
        assert error <= _tolerance(exact, promoted), f"max abs error {error:.3g}"
    if requires_grad:
        sum(out.sum() for out in ours).backward()
        assert data[odd_arg].grad is not None and data[odd_arg].grad.dtype == odd


@pytest.mark.parametrize("name", list(FLOATING))
@pytest.mark.parametrize("dtype", FLOATS)
def test_same_dtype_inputs_keep_their_dtype(name, dtype):
    data = _rollout()
    for arg in FLOATING[name]:
        data[arg] = data[arg].to(dtype)
    assert all(out.dtype == dtype for out in _call(F, name, data))


def test_the_reported_mixed_precision_calls_match_torchrl():
    """The two calls of the report: TorchRL returns float64 for both, with float64 accuracy."""
    gen = torch.Generator().manual_seed(0)
    next_value = torch.randn(2, 64, 1, generator=gen, dtype=torch.float64) * 100
    reward = torch.randn(2, 64, 1, generator=gen, dtype=torch.float64)
    value = torch.randn(2, 64, 1, generator=gen)
    done = torch.zeros(2, 64, 1, dtype=torch.bool)
    exact = trl.td_lambda_return_estimate(0.99, 0.95, next_value, reward.half().double(), done)
    ours = F.td_lambda_return_estimate(0.99, 0.95, next_value, reward.half(), done)
    theirs = trl.td_lambda_return_estimate(0.99, 0.95, next_value, reward.half(), done)
    assert ours.dtype == theirs.dtype == torch.float64
    torch.testing.assert_close(ours, exact, rtol=1e-12, atol=1e-10)
    # Discounts exact in float32, which TorchRL's GAE rounds them to.
    ours = F.generalized_advantage_estimate(0.96875, 0.875, value, next_value, reward, done)
    theirs = trl.generalized_advantage_estimate(0.96875, 0.875, value, next_value, reward, done)
    for mine, torchrls in zip(ours, theirs):
        assert mine.dtype == torchrls.dtype == torch.float64
        torch.testing.assert_close(mine, torchrls, rtol=1e-12, atol=1e-10)


# ---------------------------------------------------------------------------
# rolling_gamma
# ---------------------------------------------------------------------------


def _td_data(shape, seed=1):
    gen = torch.Generator().manual_seed(seed)
    data = {k: torch.randn(shape, generator=gen, dtype=torch.float64) for k in ("next_value", "reward")}
    data["done"] = torch.rand(shape, generator=gen) < 0.25
    data["terminated"] = data["done"] & (torch.rand(shape, generator=gen) < 0.5)
    data["gamma"] = torch.rand(shape, generator=gen, dtype=torch.float64)
    data["lmbda"] = torch.rand(shape, generator=gen, dtype=torch.float64)
    return data


@pytest.mark.parametrize("requires_grad", [False, True], ids=["fast", "autograd"])
@pytest.mark.parametrize("per_step", ["gamma", "lmbda", "both"])
@pytest.mark.parametrize("shape,time_dim", [((3, 7, 2), -2), ((7, 3, 1), 0), ((2, 2, 6, 1), 2), ((5, 1), -2)])
@pytest.mark.parametrize("rolling_gamma", [False, True, None])
def test_rolling_gamma_matches_torchrl(rolling_gamma, shape, time_dim, per_step, requires_grad):
    """``rolling_gamma=False``: ``G_t`` uses ``gamma[t]`` / ``lmbda[t]`` at every later step.
    Was: a TypeError (no such parameter)."""
    d = _td_data(shape)
    gamma = d["gamma"] if per_step in ("gamma", "both") else 0.95
    lmbda = d["lmbda"] if per_step in ("lmbda", "both") else 0.8
    args = (d["next_value"], d["reward"], d["done"], d["terminated"])
    theirs_nv = d["next_value"].clone().requires_grad_(requires_grad)
    ours_nv = d["next_value"].clone().requires_grad_(requires_grad)
    theirs = trl.td_lambda_return_estimate(gamma, lmbda, theirs_nv, *args[1:], rolling_gamma, time_dim=time_dim)
    ours = F.td_lambda_return_estimate(gamma, lmbda, ours_nv, *args[1:], rolling_gamma, time_dim=time_dim)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    if requires_grad:
        weights = torch.randn(shape, dtype=torch.float64)
        (theirs * weights).sum().backward()
        (ours * weights).sum().backward()
        torch.testing.assert_close(ours_nv.grad, theirs_nv.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.9, torch.tensor(0.9), torch.tensor([0.9, 0.5, 0.7]).view(3, 1, 1)],
                         ids=["float", "0-d", "per-env"])
def test_rolling_gamma_false_with_discounts_constant_in_time_is_the_rolling_return(gamma):
    """Both definitions agree when nothing varies along time (TorchRL refuses False there)."""
    d = _td_data((3, 6, 1))
    args = (d["next_value"], d["reward"], d["done"], d["terminated"])
    expected = trl.td_lambda_return_estimate(gamma, 0.8, *args)
    torch.testing.assert_close(F.td_lambda_return_estimate(gamma, 0.8, *args, rolling_gamma=False), expected,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", ["False", 0, 1, 0.0, torch.tensor(False)])
def test_rolling_gamma_must_be_a_bool_or_none(bad):
    d = _td_data((2, 4, 1))
    with pytest.raises(TypeError, match=r"rolling_gamma must be True or False, got rolling_gamma="):
        F.td_lambda_return_estimate(d["gamma"], 0.8, d["next_value"], d["reward"], d["done"], rolling_gamma=bad)


def test_rolling_gamma_false_keeps_the_promoted_dtype_and_an_empty_time_dim():
    d = _td_data((2, 5, 1))
    ours = F.td_lambda_return_estimate(d["gamma"].float(), 0.8, d["next_value"].half(), d["reward"].float(),
                                       d["done"], rolling_gamma=False)
    assert ours.dtype == torch.float32
    exact = trl.td_lambda_return_estimate(d["gamma"].float().double(), 0.8, d["next_value"].half().double(),
                                          d["reward"].float().double(), d["done"], rolling_gamma=False)
    torch.testing.assert_close(ours.double(), exact, rtol=1e-5, atol=1e-5)
    empty = torch.zeros(2, 0, 1)
    out = F.td_lambda_return_estimate(empty, 0.8, empty, empty, empty.bool(), rolling_gamma=False)
    assert out.shape == (2, 0, 1)


# ---------------------------------------------------------------------------
# The calls of the report
# ---------------------------------------------------------------------------


def test_the_reported_calls_work_as_in_torchrl():
    gen = torch.Generator().manual_seed(0)
    shape = (2, 6, 1)
    v, nv, r = (torch.randn(shape, generator=gen) for _ in range(3))
    d = torch.zeros(shape, dtype=torch.bool)
    lp, lm = torch.randn(shape, generator=gen) * 0.1, torch.randn(shape, generator=gen) * 0.1
    torch.testing.assert_close(F.td_lambda_return_estimate(0.9, 0.8, nv, r, d, None, rolling_gamma=True),
                               trl.td_lambda_return_estimate(0.9, 0.8, nv, r, d, None, rolling_gamma=True))
    ours = F.vtrace_advantage_estimate(0.9, lp, lm, v, nv, r, d, None, 1.0, 1.0, -2)
    theirs = trl.vtrace_advantage_estimate(0.9, lp, lm, v, nv, r, d, None, 1.0, 1.0, -2)
    for mine, torchrls in zip(ours, theirs):
        torch.testing.assert_close(mine, torchrls)


def test_vtrace_time_dim_given_positionally_is_the_time_dim():
    """A positional ``time_dim`` (here 0, time-major data) means what ``time_dim=0`` means."""
    data = _rollout(shape=(9, 2, 1))
    floats = [data[k] for k in FLOATING["vtrace_advantage_estimate"]]
    flags = (data["done"], data["terminated"])
    positional = F.vtrace_advantage_estimate(0.9, *floats, *flags, 1.0, 0.8, 0)
    keyword = F.vtrace_advantage_estimate(0.9, *floats, *flags, 1.0, 0.8, time_dim=0)
    batch_major = F.vtrace_advantage_estimate(0.9, *(t.movedim(0, 1) for t in floats),
                                              *(t.movedim(0, 1) for t in flags), 1.0, 0.8)
    for a, b, c in zip(positional, keyword, batch_major):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c.movedim(1, 0), rtol=1e-12, atol=1e-12)
