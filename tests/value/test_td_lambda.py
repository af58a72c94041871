"""``torchrl_ext.value.TDLambda`` against TorchRL's ``TDLambdaEstimator`` and a float64 loop."""
from __future__ import annotations

import pytest
import torch
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda

from tests.value.test_estimators import rollout, value_net
from tests.value.test_functional import td_lambda_loop
from torchrl_ext.value import TDLambda


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
