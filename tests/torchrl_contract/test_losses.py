"""TorchRL's policy-gradient losses with TorchRL's estimator and with torchrl_ext's, swapped in by
:func:`torchrl_ext.value.make_value_estimator`: the same loss values on the same batch."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss, KLPENPPOLoss, ReinforceLoss
from torchrl.objectives.utils import ValueEstimators

from torchrl_ext.value import GAE, ExtValueEstimators, TDLambda, VTrace, make_value_estimator

LOSSES = {"ClipPPOLoss": ClipPPOLoss, "KLPENPPOLoss": KLPENPPOLoss, "A2CLoss": A2CLoss,
          "ReinforceLoss": ReinforceLoss}
#: torchrl_ext estimator -> (TorchRL's enum for the same math, its hyper-parameters).
ESTIMATORS = {
    "GAE": (GAE, ValueEstimators.GAE, {"gamma": 0.9, "lmbda": 0.8}),
    "TDLambda": (TDLambda, ValueEstimators.TDLambda, {"gamma": 0.9, "lmbda": 0.8}),
}
#: Key layouts: TorchRL's defaults, other names for the signals, and MAPPO's per-agent keys
#: with team-level reward and done.
LAYOUTS = {"single": None, "renamed": "renamed", "agents": "agents"}
T, N_AGENTS, OBS = 6, 3, 4


def keys_of(layout: str | None) -> dict[str, Any]:
    if layout == "renamed":
        return {"observation": "observation", "action": "act", "value": "state_value", "sample_log_prob": "lp",
                "reward": "rew", "done": "end", "terminated": "term"}

    def key(name: str) -> Any:
        return name if layout is None else (layout, name)
    return {"observation": key("observation"), "action": key("action"), "value": key("state_value"),
            "sample_log_prob": key("action_log_prob"), "reward": key("reward"), "done": key("done"),
            "terminated": key("terminated")}


def build(loss_cls: type, layout: str | None, seed: int = 0, set_keys: bool = True) -> tuple[Any, dict[str, Any]]:
    """A Gaussian actor and a critic over ``keys["observation"]``, and the loss over them
    (with ``set_keys`` of the layout's keys unless ``set_keys=False``)."""
    keys = keys_of(layout)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(OBS, 2), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=[keys["observation"]], out_keys=[_params(keys, "loc"), _params(keys, "scale")]),
        in_keys={"loc": _params(keys, "loc"), "scale": _params(keys, "scale")},
        out_keys=[keys["action"]], distribution_class=IndependentNormal,
        return_log_prob=True, log_prob_key=keys["sample_log_prob"])
    critic = ValueOperator(torch.nn.Linear(OBS, 1), in_keys=[keys["observation"]], out_keys=[keys["value"]])
    if loss_cls is ReinforceLoss:
        loss = loss_cls(actor, critic_network=critic)
    else:
        loss = loss_cls(actor, critic)
    if set_keys:
        loss.set_keys(**{name: keys[name] for name in LOSS_KEYS})
    return loss, keys


LOSS_KEYS = ("action", "value", "sample_log_prob", "reward", "done", "terminated")


def batch(keys: dict[str, Any], layout: str | None, seed: int = 1) -> TensorDict:
    """A [2, T] rollout with episode ends; per-agent observations, team-level reward/done for "agents"."""
    g = torch.Generator().manual_seed(seed)
    agent_shape = (N_AGENTS,) if layout == "agents" else ()
    td = TensorDict(batch_size=[2, T])
    done = torch.zeros(2, T, 1, dtype=torch.bool)
    done[0, 2] = done[1, T - 1] = True
    terminated = done.clone()
    terminated[1, T - 1] = False  # a truncation: bootstraps
    if layout == "agents":
        td.set(layout, TensorDict(batch_size=[2, T, N_AGENTS]))
        td.set(("next", layout), TensorDict(batch_size=[2, T, N_AGENTS]))
        done, terminated = (x.unsqueeze(-2).expand(2, T, N_AGENTS, 1) for x in (done, terminated))
    td.set(keys["observation"], torch.randn(2, T, *agent_shape, OBS, generator=g))
    td.set(("next", *_tuple(keys["observation"])), torch.randn(2, T, *agent_shape, OBS, generator=g))
    td.set(keys["action"], torch.randn(2, T, *agent_shape, 1, generator=g))
    td.set(keys["sample_log_prob"], torch.randn(2, T, *agent_shape, generator=g) - 1)
    # The behaviour policy's parameters, which KLPENPPOLoss reads.
    td.set(_params(keys, "loc"), torch.randn(2, T, *agent_shape, 1, generator=g))
    td.set(_params(keys, "scale"), torch.rand(2, T, *agent_shape, 1, generator=g) + 0.5)
    td.set(("next", *_tuple(keys["reward"])), torch.randn(2, T, *agent_shape, 1, generator=g))
    td.set(("next", *_tuple(keys["done"])), done)
    td.set(("next", *_tuple(keys["terminated"])), terminated)
    return td


def _params(keys: dict[str, Any], name: str) -> tuple:
    prefix = _tuple(keys["observation"])[:-1]
    return (*prefix, "params", name)


def _tuple(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def loss_values(loss: Any, data: TensorDict) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    out = loss(data.clone())
    return {key: value.detach() for key, value in out.items() if key.startswith("loss_")}


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("loss_name", LOSSES)
# Keys set after the estimator (the loss forwards them) only where the critic writes the default
# value key: TorchRL's estimators check it against the critic's out_keys when built.
@pytest.mark.parametrize("order,layout", [("set_keys first", "single"), ("set_keys first", "renamed"),
                                          ("set_keys first", "agents"), ("estimator first", "renamed")])
def test_the_swapped_estimator_gives_torchrl_s_loss_values(loss_name, estimator, layout, order):
    ext_cls, torchrl_type, hyperparams = ESTIMATORS[estimator]
    reference, keys = build(LOSSES[loss_name], LAYOUTS[layout])
    reference.make_value_estimator(torchrl_type, **hyperparams)
    if order == "estimator first":
        ours, _ = build(LOSSES[loss_name], LAYOUTS[layout], set_keys=False)
        make_value_estimator(ours, ext_cls, **hyperparams)
        ours.set_keys(**{name: keys[name] for name in LOSS_KEYS})
    else:
        ours, _ = build(LOSSES[loss_name], LAYOUTS[layout])
        make_value_estimator(ours, ext_cls, **hyperparams)
    assert type(ours.value_estimator) is ext_cls
    data = batch(keys, LAYOUTS[layout])
    expected, got = loss_values(reference, data), loss_values(ours, data)
    assert sorted(expected) == sorted(got) and expected
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
    # The estimator's outputs, compared directly.
    with torch.no_grad():
        expected_td, got_td = reference.value_estimator(data.clone()), ours.value_estimator(data.clone())
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(got_td[key], expected_td[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["ext_gae", ExtValueEstimators.EXT_GAE, GAE])
def test_registered_names_are_accepted(name):
    loss, keys = build(ClipPPOLoss, None)
    make_value_estimator(loss, name, lmbda=0.8)
    assert type(loss.value_estimator) is GAE
    assert loss.value_estimator.value_network is loss.critic_network
    assert float(loss.value_estimator.gamma) == pytest.approx(0.99)  # the registry default
    assert float(loss.value_estimator.lmbda) == pytest.approx(0.8)


@pytest.mark.parametrize("layout", ["renamed", "agents"])
def test_vtrace_through_a_loss_scores_the_stored_actions(layout):
    """VTrace gets the loss's actor and critic and keys: the same targets as a VTrace built by
    hand (TorchRL's scores freshly sampled actions, docs/migrating.md "Where behaviour differs")."""
    loss, keys = build(A2CLoss, LAYOUTS[layout])
    make_value_estimator(loss, VTrace, gamma=0.9)
    by_hand = VTrace(gamma=0.9, actor_network=loss.actor_network, value_network=loss.critic_network)
    by_hand.set_keys(**{name: keys[name] for name in ("value", "reward", "done", "terminated", "sample_log_prob")})
    data = batch(keys, LAYOUTS[layout])
    with torch.no_grad():
        torch.manual_seed(0)
        got = loss.value_estimator(data.clone())
        torch.manual_seed(1)  # another random state: the same targets
        expected = by_hand(data.clone())
    torch.testing.assert_close(got["value_target"], expected["value_target"])
    assert torch.isfinite(torch.stack(list(loss_values(loss, data).values()))).all()


def test_bad_arguments_are_refused():
    loss, _ = build(ClipPPOLoss, None)
    with pytest.raises(ValueError, match="estimator 'ext_nope' is not a registered value estimator"):
        make_value_estimator(loss, "ext_nope")
    with pytest.raises(TypeError, match="estimator must be an estimator class"):
        make_value_estimator(loss, 3)
    with pytest.raises(TypeError, match="loss must be a TorchRL LossModule"):
        make_value_estimator(torch.nn.Linear(1, 1), GAE)
