"""``torchrl_ext.value.TDLambda`` against TorchRL's ``TDLambdaEstimator`` and a float64 loop."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda

from tests.value.test_estimators import rollout, value_net
from tests.value.test_functional import td_lambda_loop
from torchrl_ext.value import TDLambda, _scan


@pytest.mark.parametrize("kwargs", [{}, {"average_rewards": True}, {"shifted": True}])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_torchrl(kwargs, seed):
    outputs = []
    for cls in (TDLambda, TorchRLTDLambda):
        estimator = cls(gamma=0.95, lmbda=0.7, value_network=value_net(), **kwargs)
        outputs.append(estimator(rollout(seed=seed)))
    for key in ("advantage", "value_target", ("next", "reward")):
        torch.testing.assert_close(outputs[0][key], outputs[1][key], rtol=1e-5, atol=1e-5)


def test_value_target_matches_a_float64_loop():
    td = rollout(batch=(3, 40), seed=4, p_done=0.2)
    net = value_net()
    out = TDLambda(gamma=0.9, lmbda=0.6, value_network=net)(td.clone())
    with torch.no_grad():
        next_value = net(td["next"].clone())["state_value"]
    expected = td_lambda_loop(0.9, 0.6, next_value.double(), td["next", "reward"].double(),
                              td["next", "done"], td["next", "terminated"])
    torch.testing.assert_close(out["value_target"].double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["advantage"], out["value_target"] - out["state_value"])


def test_team_signals_broadcast_over_agents():
    """Team-level reward/done ``[B, T, 1]`` with per-agent values ``[B, T, A, 1]``: each agent's
    target is the single-agent target on its own values."""
    td = rollout(batch=(2, 10), seed=5, agents=3)
    net = value_net()
    out = TDLambda(gamma=0.9, lmbda=0.8, value_network=net)(td.clone())
    assert out["value_target"].shape == (2, 10, 3, 1)
    for agent in range(3):
        single = td.clone()
        single["observation"] = td["observation"][:, :, agent]
        single["next", "observation"] = td["next", "observation"][:, :, agent]
        expected = TorchRLTDLambda(gamma=0.9, lmbda=0.8, value_network=net)(single)["value_target"]
        torch.testing.assert_close(out["value_target"][:, :, agent], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,value", [("gamma", 1.5), ("lmbda", -0.1)])
def test_out_of_range_hyperparameters_are_refused(name, value):
    kwargs = {"gamma": 0.9, "lmbda": 0.9, name: value}
    with pytest.raises(ValueError, match=name):
        TDLambda(value_network=None, **kwargs)


def test_empty_time_dim_gives_empty_outputs():
    """T = 0 (TorchRL's TDLambdaEstimator raises IndexError here): empty value_target and advantage."""
    empty, never = torch.zeros(2, 0, 1), torch.zeros(2, 0, 1, dtype=torch.bool)
    td = TensorDict({"state_value": empty, "next": {"state_value": empty, "reward": empty,
                                                      "done": never, "terminated": never}}, [2, 0])
    out = TDLambda(gamma=0.9, lmbda=0.8, value_network=None)(td)
    assert out["value_target"].shape == out["advantage"].shape == (2, 0, 1)


@pytest.mark.parametrize("first_inside", [True, False])
def test_inside_and_outside_inference_mode_match_a_float64_loop(first_inside, monkeypatch):
    monkeypatch.delattr(_scan._WORKSPACES, "cache", raising=False)  # the first call makes them
    td, net = rollout(batch=(3, 20), seed=2), value_net()
    with torch.no_grad():
        next_value = net(td["next"].clone())["state_value"]
    expected = td_lambda_loop(0.9, 0.6, next_value.double(), td["next", "reward"].double(),
                              td["next", "done"], td["next", "terminated"])
    for inside in (first_inside, not first_inside):
        with torch.inference_mode(inside):
            out = TDLambda(gamma=0.9, lmbda=0.6, value_network=net)(td.clone())
        torch.testing.assert_close(out["value_target"].double(), expected, rtol=1e-5, atol=1e-5)
