"""Gradients through the value kernels (``differentiable=True``): gradcheck, float64 loops, TorchRL."""
from __future__ import annotations

import pytest
import torch
import torchrl.objectives.value.functional as trl
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda

from tests.value.test_estimators import rollout, value_net
from tests.value.test_functional import cumsum_loop, gae_loop, make_rollout, td_lambda_loop, vtrace_loop
from torchrl_ext.value import GAE, TDLambda
from torchrl_ext.value import functional as F

CONTINUOUS = ("value", "next_value", "reward", "log_pi", "log_mu")


def inputs(shape=(2, 6, 1), seed=0, dtype=torch.float64):
    data = make_rollout(shape, dtype=dtype, seed=seed, p_done=0.25)
    for key in CONTINUOUS:
        data[key] = data[key].clone().requires_grad_(True)
    return data


def ours(name, d, gamma=0.9, time_dim=-2):
    if name == "gae":
        return F.generalized_advantage_estimate(gamma, 0.8, d["value"], d["next_value"], d["reward"], d["done"],
                                                d["terminated"], time_dim=time_dim)
    if name == "td_lambda":
        return (F.td_lambda_return_estimate(gamma, 0.8, d["next_value"], d["reward"], d["done"], d["terminated"],
                                            time_dim=time_dim),)
    if name == "cumsum":
        return (F.discounted_cumsum(d["reward"], gamma, d["done"], time_dim=time_dim),)
    return F.vtrace_advantage_estimate(gamma, d["log_pi"], d["log_mu"], d["value"], d["next_value"], d["reward"],
                                       d["done"], d["terminated"], 0.9, 1.1, time_dim=time_dim)


def loop(name, d, gamma=0.9, time_dim=-2):
    if name == "gae":
        return gae_loop(gamma, 0.8, d["value"], d["next_value"], d["reward"], d["done"], d["terminated"], time_dim)
    if name == "td_lambda":
        return (td_lambda_loop(gamma, 0.8, d["next_value"], d["reward"], d["done"], d["terminated"], time_dim),)
    if name == "cumsum":
        return (cumsum_loop(d["reward"], gamma, d["done"], time_dim),)
    return vtrace_loop(gamma, d["log_pi"], d["log_mu"], d["value"], d["next_value"], d["reward"], d["done"],
                       d["terminated"], 0.9, 1.1, time_dim)


KERNELS = ["gae", "td_lambda", "cumsum", "vtrace"]


def grads(outputs, d, weights):
    total = sum((w * out).sum() for w, out in zip(weights, outputs))
    found = torch.autograd.grad(total, [d[k] for k in CONTINUOUS], allow_unused=True)
    return [torch.zeros_like(d[k]) if g is None else g for k, g in zip(CONTINUOUS, found)]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("shape,time_dim", [((2, 6, 1), -2), ((7, 3), 0), ((3, 9, 2), 1)])
def test_outputs_and_gradients_equal_the_float64_loops(name, shape, time_dim):
    d = inputs(shape)
    got, want = ours(name, d, time_dim=time_dim), loop(name, d, time_dim=time_dim)
    with torch.no_grad():
        plain = ours(name, {k: v.detach() for k, v in d.items()}, time_dim=time_dim)
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in got]
    for a, b, c in zip(got, want, plain):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)  # the fast kernel, with grad mode off
    for a, b in zip(grads(got, d, weights), grads(want, d, weights)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", KERNELS)
def test_gradcheck(name):
    d = inputs((2, 5, 1), seed=3)
    keys = CONTINUOUS if name == "vtrace" else ("value", "next_value", "reward")

    def fn(*tensors):
        return ours(name, {**d, **dict(zip(keys, tensors))})

    assert torch.autograd.gradcheck(fn, tuple(d[k] for k in keys))


def test_tensor_gamma_gets_gradients_too():
    d = inputs((2, 6, 1))
    gamma = torch.full((2, 6, 1), 0.9, dtype=torch.float64, requires_grad=True)
    adv, _ = F.generalized_advantage_estimate(gamma, 0.8, d["value"], d["next_value"], d["reward"], d["done"],
                                              d["terminated"])
    (ref,) = [gae_loop(gamma, 0.8, d["value"], d["next_value"], d["reward"], d["done"], d["terminated"])[0]]
    torch.testing.assert_close(torch.autograd.grad(adv.sum(), gamma)[0], torch.autograd.grad(ref.sum(), gamma)[0])


@pytest.mark.parametrize("name", ["gae", "td_lambda", "vtrace"])
def test_gradients_equal_torchrls_functions(name):
    d = inputs((3, 8, 1), seed=5, dtype=torch.float32)
    if name == "gae":
        theirs = trl.generalized_advantage_estimate(0.9, 0.8, d["value"], d["next_value"], d["reward"], d["done"],
                                                    d["terminated"])
    elif name == "td_lambda":
        theirs = (trl.td_lambda_return_estimate(0.9, 0.8, d["next_value"], d["reward"], d["done"], d["terminated"]),)
    else:
        theirs = trl.vtrace_advantage_estimate(0.9, d["log_pi"], d["log_mu"], d["value"], d["next_value"],
                                               d["reward"], d["done"], d["terminated"], rho_thresh=0.9, c_thresh=1.1)
    got = ours(name, d)
    weights = [torch.linspace(-1, 1, 24).reshape(3, 8, 1) for _ in got]
    for a, b in zip(got, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads(got, d, weights), grads(theirs, d, weights)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ours, theirs", [(GAE, TorchRLGAE), (TDLambda, TorchRLTDLambda)], ids=["GAE", "TDLambda"])
@pytest.mark.parametrize("differentiable", [True, False])
def test_module_passes_gradients_like_torchrl(differentiable, ours, theirs):
    """Values computed outside the estimator and rewards (reward learning) get TorchRL's gradients."""
    found = []
    for cls in (ours, theirs):
        td, net = rollout(), value_net()
        reward = td["next", "reward"].clone().requires_grad_(True)
        td["next", "reward"] = reward
        td["state_value"] = net(td.clone())["state_value"]
        td["next", "state_value"] = net(td["next"].clone())["state_value"]
        out = cls(gamma=0.97, lmbda=0.9, value_network=None, differentiable=differentiable)(td)
        assert out["advantage"].requires_grad == differentiable
        if differentiable:
            found.append(torch.autograd.grad(out["advantage"].square().sum(), [reward, *net.parameters()]))
    for a, b in zip(*found):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
