"""``TDLambda.value_estimate`` keeps TorchRL's contract: ``(tensordict, target_params=None,
next_value=None, time_dim=None, **kwargs)``, the critic evaluated on the next states only, and the
value-based losses that rely on it (``DQNLoss``, ``DDPGLoss``) give TorchRL's numbers."""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import OneHot
from torchrl.modules import Actor, QValueActor, ValueOperator
from torchrl.objectives import DDPGLoss, DQNLoss, ValueEstimators
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda

from tests.value.test_estimators import rollout, value_net
from tests.value.test_functional import td_lambda_loop
from torchrl_ext import _compat
from torchrl_ext.value import GAE, TDLambda, make_value_estimator

GAMMA, LMBDA = 0.9, 0.7


def _loop(td, next_value, gamma=GAMMA, lmbda=LMBDA):
    return td_lambda_loop(gamma, lmbda, next_value.double(), td["next", "reward"].double(),
                          td["next", "done"], td["next", "terminated"], time_dim=1)


def _both(**kwargs):
    return (TDLambda(gamma=GAMMA, lmbda=LMBDA, **kwargs),
            TorchRLTDLambda(gamma=GAMMA, lmbda=LMBDA, **kwargs))


@pytest.mark.parametrize("network", [False, True], ids=["stored-values", "value-network"])
@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
def test_next_value_is_the_bootstrap(network, positional):
    """``next_value`` wins over the stored ``("next", value)`` and over the critic."""
    td = rollout(batch=(3, 20), seed=3, p_done=0.2)
    td["state_value"] = torch.zeros(3, 20, 1)
    td["next", "state_value"] = torch.zeros(3, 20, 1)  # stale values the caller overrides
    next_value = torch.randn(3, 20, 1, generator=torch.Generator().manual_seed(7)) * 5
    ours, theirs = _both(value_network=value_net() if network else None)
    call = (lambda est, data: est.value_estimate(data, None, next_value)) if positional else (
        lambda est, data: est.value_estimate(data, next_value=next_value))
    got, expected = call(ours, td.clone()), call(theirs, td.clone())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), _loop(td, next_value), rtol=1e-5, atol=1e-5)


def test_hand_computed_bootstrap():
    """T = 3, rewards 1, gamma 0.5, lambda 1, next_value 10: 1 + 0.5 * (1 + 0.5 * (1 + 0.5 * 10))."""
    never = torch.zeros(1, 3, 1, dtype=torch.bool)
    td = TensorDict({"state_value": torch.zeros(1, 3, 1),
                     "next": {"state_value": torch.zeros(1, 3, 1), "reward": torch.ones(1, 3, 1),
                              "done": never, "terminated": never}}, [1, 3])
    target = TDLambda(gamma=0.5, lmbda=1.0, value_network=None).value_estimate(
        td, next_value=torch.full((1, 3, 1), 10.0))
    assert target.flatten().tolist() == [3.0, 4.0, 6.0]


def test_without_next_value_the_critic_sees_the_next_states_only():
    """A batch without the current observations (what value-based losses hand over) works, and
    the target is the loop on the critic's next-state values."""
    td = rollout(batch=(2, 15), seed=4, p_done=0.2)
    net = value_net()
    with torch.no_grad():
        next_value = net(td["next"].clone())["state_value"]
    no_root = td.exclude("observation")
    ours, theirs = _both(value_network=net)
    got = ours.value_estimate(no_root.clone())
    torch.testing.assert_close(got, theirs.value_estimate(no_root.clone()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), _loop(td, next_value), rtol=1e-5, atol=1e-5)
    data = td.clone()
    ours.value_estimate(data)
    assert "state_value" not in data.keys()  # the current states were not evaluated


def test_target_params_evaluate_the_next_states():
    """``target_params`` (TorchRL's second positional argument) parametrize the critic."""
    td = rollout(batch=(2, 15), seed=5, p_done=0.2)
    net = value_net()
    target_params = TensorDict.from_module(net).detach().clone().apply(lambda p: p * 0.5 + 0.1)
    target_net = copy.deepcopy(net)
    target_params.to_module(target_net)
    with torch.no_grad():
        next_value = target_net(td["next"].clone())["state_value"]
    ours, theirs = _both(value_network=net)
    for call in (lambda est: est.value_estimate(td.clone(), target_params),
                 lambda est: est.value_estimate(td.clone(), target_params=target_params)):
        got = call(ours)
        torch.testing.assert_close(got, call(theirs), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.double(), _loop(td, next_value), rtol=1e-5, atol=1e-5)


def test_time_dim_is_honoured():
    td = rollout(batch=(3, 12), seed=6, p_done=0.2)
    next_value = torch.randn(3, 12, 1)
    time_major = td.transpose(0, 1).contiguous()
    ours, theirs = _both(value_network=None)
    got = ours.value_estimate(time_major.clone(), next_value=next_value.transpose(0, 1), time_dim=0)
    expected = theirs.value_estimate(time_major.clone(), next_value=next_value.transpose(0, 1), time_dim=0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.transpose(0, 1).double(), _loop(td, next_value), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"shifted": True}, {"shifted": True, "average_rewards": True},
                                    {"average_rewards": True}])
def test_value_estimate_matches_torchrl_with_shifted_and_dones(kwargs):
    """TorchRL's ``value_estimate`` bootstraps from the next states even for a ``shifted``
    estimator (only ``forward`` uses the single call); the rewards written back match too."""
    td = rollout(batch=(3, 14), seed=12, p_done=0.3)
    net = value_net()
    ours, theirs = _both(value_network=net, **kwargs)
    data_ours, data_theirs = td.clone(), td.clone()
    torch.testing.assert_close(ours.value_estimate(data_ours), theirs.value_estimate(data_theirs),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(data_ours["next", "reward"], data_theirs["next", "reward"])
    forward_ours, forward_theirs = ours(td.clone()), theirs(td.clone())
    for key in ("advantage", "value_target", ("next", "reward")):
        torch.testing.assert_close(forward_ours[key], forward_theirs[key], rtol=1e-5, atol=1e-5)


def test_next_value_of_another_type_is_a_clear_error():
    td = rollout(batch=(2, 5))
    with pytest.raises(TypeError, match=r"next_value must be a tensor .* got float"):
        TDLambda(gamma=GAMMA, lmbda=LMBDA, value_network=None).value_estimate(td, next_value=1.0)


def test_without_next_value_or_network_the_missing_values_are_named():
    td = rollout(batch=(2, 5))
    with pytest.raises(ValueError, match=r"\('next', 'state_value'\) is missing and no value network"):
        TDLambda(gamma=GAMMA, lmbda=LMBDA, value_network=None).value_estimate(td)


def test_next_state_value_wrapper_is_torchrls_next_state_evaluation():
    """``_compat.next_state_value`` (TorchRL's ``_next_value``): the critic on ``("next", ...)``,
    with the given parameters, the root left alone."""
    td = rollout(batch=(2, 6), seed=8)
    net = value_net()
    estimator = TorchRLTDLambda(gamma=GAMMA, lmbda=LMBDA, value_network=net)
    with torch.no_grad():
        expected = net(td["next"].clone())["state_value"]
    torch.testing.assert_close(_compat.next_state_value(estimator, td, None, {}), expected)
    zeros = TensorDict.from_module(net).detach().clone().zero_()
    assert _compat.next_state_value(estimator, td, zeros, {}).abs().max() == 0
    assert "state_value" not in td.keys()


def test_gae_value_estimate_keeps_torchrls_arguments():
    """GAE's ``value_estimate`` is TorchRL's ``(tensordict, params, target_params, time_dim)``."""
    td = rollout(batch=(3, 12), seed=9).transpose(0, 1).contiguous()
    net = value_net()
    ours = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)
    theirs = TorchRLGAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)
    torch.testing.assert_close(ours.value_estimate(td.clone(), None, None, 0),
                               theirs.value_estimate(td.clone(), None, None, 0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- TorchRL's value-based losses


def _losses(loss):
    return {key: value for key, value in loss.items() if key.startswith("loss")}


def _assert_same_losses_and_grads(ours, theirs, batch):
    out_ours, out_theirs = _losses(ours(batch.clone())), _losses(theirs(batch.clone()))
    assert out_ours.keys() == out_theirs.keys()
    for key in out_ours:
        torch.testing.assert_close(out_ours[key], out_theirs[key], rtol=1e-5, atol=1e-6)
    sum(out_ours.values()).backward()
    sum(out_theirs.values()).backward()
    grads = [[p.grad for p in loss.parameters() if p.grad is not None] for loss in (ours, theirs)]
    assert len(grads[0]) == len(grads[1]) > 0
    for mine, ref in zip(*grads):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)


def _batch(actions):
    gen = torch.Generator().manual_seed(11)
    done = torch.rand(2, 8, 1, generator=gen) < 0.3
    return TensorDict({
        "observation": torch.randn(2, 8, 3, generator=gen),
        "action": actions(gen),
        "next": {"observation": torch.randn(2, 8, 3, generator=gen),
                 "reward": torch.randn(2, 8, 1, generator=gen), "done": done,
                 "terminated": done & (torch.rand(2, 8, 1, generator=gen) < 0.5)},
    }, [2, 8])


@pytest.mark.parametrize("double_dqn", [False, True])
def test_dqn_loss_with_make_value_estimator(double_dqn):
    """``DQNLoss`` calls ``value_estimate(td, target_params=..., next_value=...)`` (``next_value``
    set with ``double_dqn``) on a batch whose root holds no critic output."""
    def build():
        torch.manual_seed(0)
        qnet = QValueActor(torch.nn.Linear(3, 4), in_keys=["observation"], spec=OneHot(4))
        return DQNLoss(qnet, action_space="one-hot", double_dqn=double_dqn, delay_value=True)

    batch = _batch(lambda gen: torch.nn.functional.one_hot(torch.randint(4, (2, 8), generator=gen), 4))
    ours = make_value_estimator(build(), TDLambda, gamma=0.5, lmbda=0.75)
    theirs = build()
    theirs.make_value_estimator(ValueEstimators.TDLambda, gamma=0.5, lmbda=0.75)
    _assert_same_losses_and_grads(ours, theirs, batch)


def test_ddpg_loss_with_make_value_estimator():
    """``DDPGLoss`` calls ``value_estimate(td, target_params=...)`` with the target actor and
    critic: make_value_estimator wires torchrl_ext's estimator as the loss wires TorchRL's
    (``actor_critic``, ``state_action_value``)."""
    class Critic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, observation, action):
            return self.linear(torch.cat([observation, action], -1))

    def build():
        torch.manual_seed(0)
        actor = Actor(torch.nn.Linear(3, 1), in_keys=["observation"])
        return DDPGLoss(actor, ValueOperator(Critic(), in_keys=["observation", "action"]))

    ours, theirs = make_value_estimator(build(), TDLambda, gamma=0.5, lmbda=0.75), build()
    theirs.make_value_estimator(ValueEstimators.TDLambda, gamma=0.5, lmbda=0.75)
    assert type(ours.value_estimator) is TDLambda
    assert ours.value_estimator.value_network is ours.actor_critic
    assert ours.value_estimator.tensor_keys.value == "state_action_value"
    _assert_same_losses_and_grads(ours, theirs, _batch(lambda gen: torch.randn(2, 8, 1, generator=gen)))
