"""Team-level signals with per-agent values: ``steps_to_next_obs`` is broadcast like the reward,
and a signal that fits neither layout is a ``ValueError`` naming it."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda

from tests.value.test_functional import gae_loop, td_lambda_loop
from torchrl_ext.value import GAE, TDLambda
from torchrl_ext.value import functional as F

B, T, A = 2, 9, 3
GAMMA, LMBDA = 0.9, 0.75
AGENT_KEYS = dict(value=("agents", "state_value"), advantage=("agents", "advantage"),
                  value_target=("agents", "value_target"))


def _agents_batch(per_agent_reward=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    done = torch.rand(B, T, 1, generator=gen) < 0.25
    reward_shape = (B, T, A, 1) if per_agent_reward else (B, T, 1)
    return TensorDict({
        "agents": {"state_value": torch.randn(B, T, A, 1, generator=gen)},
        "steps_to_next_obs": torch.randint(1, 4, (B, T, 1), generator=gen),  # one count per env step
        "next": {"agents": {"state_value": torch.randn(B, T, A, 1, generator=gen)},
                 "reward": torch.randn(*reward_shape, generator=gen), "done": done,
                 "terminated": done & (torch.rand(B, T, 1, generator=gen) < 0.5)},
    }, [B, T])


def _per_agent(tensor):
    return tensor if tensor.ndim == 4 else tensor.unsqueeze(-2).expand(B, T, A, 1)


def _expected(td):
    """Every team-level signal, ``gamma ** steps_to_next_obs`` included, expanded over the agents."""
    gamma = _per_agent(GAMMA ** td["steps_to_next_obs"].double())
    reward, done, terminated = (_per_agent(td["next", key]) for key in ("reward", "done", "terminated"))
    value, next_value = td["agents", "state_value"], td["next", "agents", "state_value"]
    return gamma, value, next_value, reward, done, terminated


def _estimator(cls, **kwargs):
    estimator = cls(gamma=GAMMA, lmbda=LMBDA, value_network=None, **kwargs)
    estimator.set_keys(**AGENT_KEYS)
    return estimator


@pytest.mark.parametrize("per_agent_reward", [False, True], ids=["team-reward", "agent-reward"])
@pytest.mark.parametrize("agent_dim", [None, -2])
def test_gae_broadcasts_team_steps_to_next_obs(per_agent_reward, agent_dim):
    td = _agents_batch(per_agent_reward)
    out = _estimator(GAE, agent_dim=agent_dim)(td.clone())
    gamma, value, next_value, reward, done, terminated = _expected(td)
    functional = F.generalized_advantage_estimate(gamma, LMBDA, value.double(), next_value.double(),
                                                  reward.double(), done, terminated, time_dim=1)
    loop = gae_loop(gamma, LMBDA, value, next_value, reward, done, terminated, time_dim=1)
    for got, want, reference in zip((out["agents", "advantage"], out["agents", "value_target"]), functional, loop):
        torch.testing.assert_close(want, reference, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got.double(), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_agent_reward", [False, True], ids=["team-reward", "agent-reward"])
def test_td_lambda_broadcasts_team_steps_to_next_obs(per_agent_reward):
    td = _agents_batch(per_agent_reward, seed=1)
    gamma, value, next_value, reward, done, terminated = _expected(td)
    functional = F.td_lambda_return_estimate(gamma, LMBDA, next_value.double(), reward.double(), done,
                                             terminated, time_dim=1)
    loop = td_lambda_loop(gamma, LMBDA, next_value, reward, done, terminated, time_dim=1)
    torch.testing.assert_close(functional, loop, rtol=1e-10, atol=1e-10)
    estimator = _estimator(TDLambda)
    out = estimator(td.clone())
    torch.testing.assert_close(out["agents", "value_target"].double(), loop, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["agents", "advantage"], out["agents", "value_target"] - value)
    direct = estimator.value_estimate(td.clone(), next_value=next_value)
    torch.testing.assert_close(direct.double(), loop, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps_shape", [(4, 10, 1), (4, 10)])
@pytest.mark.parametrize("ours, theirs", [(GAE, TorchRLGAE), (TDLambda, TorchRLTDLambda)],
                         ids=["GAE", "TDLambda"])
def test_single_agent_steps_to_next_obs_as_torchrl(steps_shape, ours, theirs):
    """Single-agent layouts are read as TorchRL reads them (``view_as(reward)``)."""
    gen = torch.Generator().manual_seed(2)
    done = torch.rand(4, 10, 1, generator=gen) < 0.2
    td = TensorDict({"state_value": torch.randn(4, 10, 1, generator=gen),
                     "steps_to_next_obs": torch.randint(1, 4, steps_shape, generator=gen),
                     "next": {"state_value": torch.randn(4, 10, 1, generator=gen),
                              "reward": torch.randn(4, 10, 1, generator=gen), "done": done,
                              "terminated": done}}, [4, 10])
    got = ours(gamma=GAMMA, lmbda=LMBDA, value_network=None)(td.clone())
    expected = theirs(gamma=GAMMA, lmbda=LMBDA, value_network=None)(td.clone())
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-5)


def _single_agent_batch(**shapes):
    gen = torch.Generator().manual_seed(3)
    shape = {"reward": (2, 5, 1), "done": (2, 5, 1), **shapes}
    return TensorDict({"state_value": torch.randn(2, 5, 1, generator=gen),
                       "next": {"state_value": torch.randn(2, 5, 1, generator=gen),
                                "reward": torch.randn(*shape["reward"], generator=gen),
                                "done": torch.zeros(*shape["done"], dtype=torch.bool),
                                "terminated": torch.zeros(2, 5, 1, dtype=torch.bool)}}, [2, 5])


_CALLS = {
    "GAE": lambda td: GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)(td),
    "TDLambda": lambda td: TDLambda(gamma=GAMMA, lmbda=LMBDA, value_network=None)(td),
    "TDLambda.value_estimate": lambda td: TDLambda(gamma=GAMMA, lmbda=LMBDA, value_network=None).value_estimate(
        td, next_value=torch.zeros(2, 5, 1)),
}


@pytest.mark.parametrize("call", _CALLS.values(), ids=_CALLS.keys())
@pytest.mark.parametrize("signal", ["reward", "done"])
def test_a_signal_without_its_feature_dim_is_a_clear_error(call, signal):
    """``[B, T]`` next to values ``[B, T, 1]`` is one dim short like a team-level signal, but
    cannot be one: the error names the signal, both shapes and the fix."""
    td = _single_agent_batch(**{signal: (2, 5)})
    before = td.clone()
    pattern = (rf"\('next', '{signal}'\) of shape \(2, 5\) fits neither the value shape \(2, 5, 1\).*"
               r"lacks the trailing feature dim: pass it with \.unsqueeze\(-1\)")
    with pytest.raises(ValueError, match=pattern):
        call(td)
    assert (td == before).all()


def test_a_team_signal_of_the_wrong_size_is_a_clear_error():
    td = _agents_batch()
    td["next", "reward"] = torch.zeros(B, T, 2)  # 2 features where the values have 1
    with pytest.raises(ValueError, match=r"\('next', 'reward'\) of shape \(2, 9, 2\) fits neither.*"
                                         r"\(2, 9, 3, 1\).*\(2, 9, 1\) \(team-level\); give it one of these"):
        _estimator(GAE)(td)


def test_documented_team_level_broadcast_still_works():
    """Team-level ``[B, T, 1]`` (also with ``B = 1`` or ``T = 1``) next to values ``[B, T, A, 1]``."""
    for batch, time in ((1, 4), (2, 1)):
        td = _agents_batch().exclude("steps_to_next_obs")[:batch, :time]
        out = _estimator(TDLambda)(td.clone())
        assert out["agents", "value_target"].shape == (batch, time, A, 1)
