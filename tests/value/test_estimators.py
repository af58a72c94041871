"""GAE / VTrace modules: same results and keys as TorchRL's, multi-agent, ValueNorm, registry."""
from __future__ import annotations

import math

import copy

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.utils import build_value_estimator
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import MultiAgentGAE as TorchRLMultiAgentGAE

from torchrl_ext.value import GAE, ExtValueEstimators, RunningMeanStd, ValueNorm, VTrace
from torchrl_ext.value import _scan
from torchrl_ext.value import functional as F

OBS_DIM = 3


def rollout(batch=(4, 25), seed=0, p_done=0.1, agents=None):
    """TensorDict [*batch] with obs, next obs, reward and done/terminated/truncated."""
    gen = torch.Generator().manual_seed(seed)
    agent_shape = () if agents is None else (agents,)
    done = torch.rand(*batch, 1, generator=gen) < p_done
    terminated = done & (torch.rand(*batch, 1, generator=gen) < 0.5)
    obs = torch.randn(*batch, *agent_shape, OBS_DIM, generator=gen)
    next_obs = torch.randn(*batch, *agent_shape, OBS_DIM, generator=gen)
    td = TensorDict(
        {
            "observation": obs,
            "action": torch.randn(*batch, 1, generator=gen),
            "next": {
                "observation": next_obs,
                "reward": torch.randn(*batch, 1, generator=gen),
                "done": done,
                "terminated": terminated,
                "truncated": done & ~terminated,
            },
        },
        batch_size=batch,
    )
    return td


def value_net(seed=0):
    torch.manual_seed(seed)
    return ValueOperator(torch.nn.Linear(OBS_DIM, 1), in_keys=["observation"])


def actor_net(seed=1):
    torch.manual_seed(seed)
    module = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(OBS_DIM, 2), NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(
        module, in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal,
        return_log_prob=True,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"average_gae": True},
        {"shifted": True},
        {"time_dim": 1},
        {"auto_reset_env": True},
        {"gamma": 1.0, "lmbda": 1.0},
        {"gamma": 0.9, "lmbda": 0.0, "average_gae": True},
    ],
)
def test_gae_same_outputs_as_torchrl(kwargs):
    kwargs = {"gamma": 0.97, "lmbda": 0.9, **kwargs}
    net = value_net()
    ours = GAE(value_network=net, **kwargs)(rollout())
    theirs = TorchRLGAE(value_network=net, **kwargs)(rollout())
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    for key in ("advantage", "value_target", "state_value"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)


def test_a_right_padding_mask_is_refused_not_ignored():
    # TorchRL after 0.14.1 lets set_keys(valid=...) mark right-padding; GAE inherited the key but
    # ignored it, so padded steps got advantages and were normalised over (silently wrong).
    td = rollout()
    td["valid"] = torch.ones(td.shape, dtype=torch.bool)
    td["valid"][..., -2:] = False
    gae = GAE(gamma=0.97, lmbda=0.9, value_network=value_net())
    try:
        gae.set_keys(valid="valid")
    except (KeyError, ValueError):  # TorchRL 0.14.1 has no such key: nothing to ignore
        assert not hasattr(gae.tensor_keys, "valid")
        return
    before = td.clone()
    with pytest.raises(ValueError, match=r"GAE does not support right-padding masks \(set_keys\(valid='valid'\)\); "
                                         r"drop the padded steps first"):
        gae(td)
    assert (td == before).all()


def test_gae_precomputed_values_and_nested_keys():
    td = rollout()
    net = value_net()
    td["critic", "v"] = net(td.clone())["state_value"].detach()
    td["next", "critic", "v"] = net(td["next"].clone())["state_value"].detach()
    td["next", "env", "r"] = td["next", "reward"]
    gae = GAE(gamma=0.95, lmbda=0.9, value_network=None)
    gae.set_keys(value=("critic", "v"), reward=("env", "r"), advantage=("out", "adv"),
                 value_target=("out", "target"))
    gae(td)
    expected = F.generalized_advantage_estimate(
        0.95, 0.9, td["critic", "v"], td["next", "critic", "v"], td["next", "reward"],
        td["next", "done"], td["next", "terminated"])
    torch.testing.assert_close(td["out", "adv"], expected[0])
    torch.testing.assert_close(td["out", "target"], expected[1])
    torch.testing.assert_close(gae.value_estimate(td), expected[1])


@pytest.mark.parametrize("average_gae", [False, True])
def test_multi_agent_team_signals_match_torchrl_multiagent_gae(average_gae):
    """Per-agent values [B, T, A, 1] with team-level reward/done [B, T, 1]."""
    td = rollout(agents=3)
    net = value_net()
    td["agents", "state_value"] = net(TensorDict({"observation": td["observation"]}, []))[
        "state_value"].detach()
    td["next", "agents", "state_value"] = net(
        TensorDict({"observation": td["next", "observation"]}, []))["state_value"].detach()
    kwargs = dict(gamma=0.95, lmbda=0.9, value_network=None, average_gae=average_gae)
    ours = GAE(agent_dim=-2, **kwargs)
    theirs = TorchRLMultiAgentGAE(agent_dim=-2, **kwargs)
    for est in (ours, theirs):
        est.set_keys(value=("agents", "state_value"), advantage=("agents", "advantage"),
                     value_target=("agents", "value_target"))
    out_ours, out_theirs = ours(td.clone()), theirs(td.clone())
    assert out_ours["agents", "advantage"].shape == (4, 25, 3, 1)
    for key in (("agents", "advantage"), ("agents", "value_target")):
        torch.testing.assert_close(out_ours[key], out_theirs[key], rtol=1e-5, atol=1e-5)


def test_team_signal_with_wrong_rank_is_rejected():
    td = rollout()
    td["state_value"] = torch.zeros(4, 25, 3, 2, 1)
    td["next", "state_value"] = torch.zeros(4, 25, 3, 2, 1)
    with pytest.raises(ValueError, match=r"team-level.*signal shape \(4, 25, 1\)"):
        GAE(gamma=0.9, lmbda=0.9, value_network=None)(td)


def test_gae_with_value_normalizer_denormalizes_first():
    norm = ValueNorm(1)
    norm.update(torch.randn(100, 1) * 5 + 3)
    td = rollout()
    td["state_value"] = torch.randn(4, 25, 1)
    td["next", "state_value"] = torch.randn(4, 25, 1)
    out = GAE(gamma=0.9, lmbda=0.8, value_network=None, value_normalizer=norm)(td.clone())
    expected = F.generalized_advantage_estimate(
        0.9, 0.8, norm.denormalize(td["state_value"]), norm.denormalize(td["next", "state_value"]),
        td["next", "reward"], td["next", "done"], td["next", "terminated"])
    torch.testing.assert_close(out["advantage"], expected[0])
    torch.testing.assert_close(out["value_target"], expected[1])
    # the value target is in the raw return scale, not the normalized one
    assert not torch.allclose(out["value_target"], out["advantage"] + td["state_value"])


def behaviour_batch():
    """A rollout whose actions and behaviour log-probs come from a policy other than the learner's."""
    td = rollout()
    with torch.no_grad():
        behaviour = actor_net(seed=5)(td.clone())
    td["action"] = behaviour["action"]
    td["action_log_prob"] = behaviour["action_log_prob"]
    return td


@pytest.mark.parametrize("kwargs", [{}, {"rho_thresh": 0.8, "c_thresh": 1.3}, {"average_adv": True},
                                    {"rho_thresh": math.inf, "c_thresh": math.inf}])  # no clipping, as TorchRL
def test_vtrace_equals_torchrl_functional_on_the_stored_actions(kwargs):
    """TorchRL's V-trace math, fed the current policy's log-prob of the stored actions."""
    from torchrl.objectives.value.functional import vtrace_advantage_estimate as torchrl_vtrace

    td, actor, net = behaviour_batch(), actor_net(), value_net()
    est = VTrace(gamma=0.97, actor_network=actor, value_network=net, **kwargs)
    est.set_keys(sample_log_prob="action_log_prob")
    out = est(td.clone())
    with torch.no_grad():
        params = actor.module[0](td.clone())
        log_pi = torch.distributions.Normal(params["loc"], params["scale"]).log_prob(td["action"])
        adv, target = torchrl_vtrace(
            0.97, log_pi, td["action_log_prob"], net(td.clone())["state_value"],
            net(td["next"].clone())["state_value"], td["next", "reward"], td["next", "done"],
            td["next", "terminated"], rho_thresh=kwargs.get("rho_thresh", 1.0),
            c_thresh=kwargs.get("c_thresh", 1.0), time_dim=-2)
    if kwargs.get("average_adv"):
        adv = (adv - adv.mean()) / adv.std().clamp_min(1e-5)
    torch.testing.assert_close(out["advantage"], adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["value_target"], target, rtol=1e-5, atol=1e-5)


def test_vtrace_weighs_the_stored_action_against_a_float64_reference():
    """pi(a|x) of the action taken, whatever the random state (TorchRL's VTrace samples a new action)."""
    from tests.value.test_functional import vtrace_loop

    td, actor, net = behaviour_batch(), actor_net(), value_net()
    est = VTrace(gamma=0.97, actor_network=actor, value_network=net, rho_thresh=0.8, c_thresh=1.3)
    est.set_keys(sample_log_prob="action_log_prob")
    outs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        outs.append(est(td.clone()))
    with torch.no_grad():
        params = copy.deepcopy(actor.module[0]).double()(td.select("observation").double())
        log_pi = torch.distributions.Normal(params["loc"], params["scale"]).log_prob(td["action"].double())
        critic = net.module
        value = td["observation"].double() @ critic.weight.double().T + critic.bias.double()
        next_value = td["next", "observation"].double() @ critic.weight.double().T + critic.bias.double()
    _, target = vtrace_loop(
        0.97, log_pi, td["action_log_prob"].double(), value, next_value, td["next", "reward"].double(),
        td["next", "done"].double(), td["next", "terminated"].double(), 0.8, 1.3)
    for out in outs:
        torch.testing.assert_close(out["value_target"].double(), target, rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0]["advantage"], outs[1]["advantage"])


def test_vtrace_declares_the_stored_action_it_reads():
    """The actor's sample key is in ``in_keys``: the keyword call takes ``action=``, and a batch
    cut to ``in_keys`` (TorchRL's ``VTrace`` works with it) keeps the action."""
    td, actor, net = behaviour_batch(), actor_net(), value_net()
    est = VTrace(gamma=0.97, actor_network=actor, value_network=net)
    est.set_keys(sample_log_prob="action_log_prob")
    assert est.in_keys[-1] == "action" and est.in_keys.count("action") == 1
    expected = est(td.clone())
    torch.testing.assert_close(est(td.select(*est.in_keys))["value_target"], expected["value_target"])
    advantage, value_target = est(
        observation=td["observation"], action=td["action"], action_log_prob=td["action_log_prob"],
        next_observation=td["next", "observation"], next_reward=td["next", "reward"],
        next_done=td["next", "done"], next_terminated=td["next", "terminated"])
    torch.testing.assert_close(advantage, expected["advantage"])
    torch.testing.assert_close(value_target, expected["value_target"])


def test_vtrace_without_the_stored_action_is_a_clear_error():
    td = behaviour_batch()
    del td["action"]
    est = VTrace(gamma=0.9, actor_network=actor_net(), value_network=value_net())
    est.set_keys(sample_log_prob="action_log_prob")
    with pytest.raises(ValueError, match="no stored action under 'action'.*store the collector's action"):
        est(td)


def test_vtrace_needs_a_probabilistic_actor():
    est = VTrace(gamma=0.9, actor_network=value_net(), value_network=value_net())
    est.set_keys(sample_log_prob="action_log_prob")
    with pytest.raises(TypeError, match="actor_network must be a probabilistic actor.*got ValueOperator"):
        est(behaviour_batch())


def test_vtrace_missing_log_prob_is_a_clear_error():
    est = VTrace(gamma=0.9, actor_network=actor_net(), value_network=value_net())
    est.set_keys(sample_log_prob="behaviour_lp")
    with pytest.raises(ValueError, match="behaviour_lp.*set_keys"):
        est(rollout())


@pytest.mark.parametrize(
    "cls,kwargs,match",
    [
        (GAE, dict(gamma=1.5, lmbda=0.9), r"gamma must be a number in \[0, 1\], got gamma=1.5"),
        (GAE, dict(gamma=0.9, lmbda=-0.1), r"lmbda must be a number in \[0, 1\]"),
        (VTrace, dict(gamma=0.9, actor_network=None, rho_thresh=0.0), "rho_thresh must be > 0.0, got rho_thresh=0.0"),
        (VTrace, dict(gamma=0.9, actor_network=None, c_thresh=-2.0), "c_thresh must be > 0.0, got c_thresh=-2.0"),
    ],
)
def test_constructor_validation(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(value_network=None, **kwargs)


def test_gae_without_values_or_network_is_a_clear_error():
    with pytest.raises(ValueError, match="state_value.*missing"):
        GAE(gamma=0.9, lmbda=0.9, value_network=None)(rollout())


def test_registered_in_torchrl_registry_and_usable_by_losses():
    actor, critic = actor_net(), value_net()
    loss = ClipPPOLoss(actor, critic)
    built = build_value_estimator(loss, "ext_gae", gamma=0.9, lmbda=0.8)
    assert isinstance(built, GAE) and built.value_network is critic
    assert isinstance(build_value_estimator(loss, ExtValueEstimators.EXT_GAE), GAE)
    vtrace = build_value_estimator(loss, "ext_vtrace")
    assert isinstance(vtrace, VTrace) and vtrace.actor_network is not None
    loss.make_value_estimator(GAE, gamma=0.9, lmbda=0.8, value_network=critic)
    assert isinstance(loss.value_estimator, GAE)
    td = rollout()
    with torch.no_grad():
        td.update(actor(td.clone()))
    loss.value_estimator(td)
    assert td["advantage"].shape == (4, 25, 1)


def _agent_batch(agents=4):
    """A rollout with per-agent observations [B, T, A, OBS_DIM] and team-level signals."""
    td = rollout(agents=agents)
    td["next", "done"] = td["next", "done"] | torch.arange(25).view(1, 25, 1).eq(12)  # episodes end inside
    td["next", "terminated"] = td["next", "done"]
    return td


@pytest.mark.parametrize("kwargs", [{"shifted": False}, {"shifted": True, "group_key": "group"},
                                    {"shifted": False, "group_key": "group"}])
def test_multi_agent_average_gae_matches_torchrl_multiagent_gae(kwargs):
    """Where every TorchRL release standardizes with the unbiased std (no shifted_valid mask, or
    groups), the same advantages as MultiAgentGAE on identical TensorDicts."""
    td = _agent_batch()
    td["group"] = torch.arange(4).view(4, 1).expand(4, 25) % 2
    args = dict(gamma=0.9, lmbda=0.8, value_network=value_net(), agent_dim=-2, average_gae=True, **kwargs)
    ours, theirs = GAE(**args)(td.clone()), TorchRLMultiAgentGAE(**args)(td.clone())
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("time_dim", [None, 1])
def test_multi_agent_average_gae_under_the_shifted_mask_uses_the_unbiased_std(time_dim):
    """Under the shifted_valid mask each agent's advantages are standardized with the mean and
    unbiased std of its valid steps (float64 reference), as on the unmasked path. TorchRL 0.14.1
    takes the population std there; its later releases the unbiased one (docs/migrating.md)."""
    td = _agent_batch()
    args = dict(gamma=0.9, lmbda=0.8, value_network=value_net(), agent_dim=-2, shifted=True)
    if time_dim is not None:
        args["time_dim"] = time_dim
    raw = GAE(**args)(td.clone())["advantage"].double()
    out = GAE(average_gae=True, **args)(td.clone())
    assert "shifted_valid" in out.keys()  # the masked path is the one exercised
    valid = out["shifted_valid"]
    while valid.ndim < raw.ndim:
        valid = valid.unsqueeze(-1)
    valid = valid.expand_as(raw)
    expected = torch.empty_like(raw)
    for agent in range(raw.shape[-2]):
        adv, keep = raw[..., agent, :], valid[..., agent, :]
        expected[..., agent, :] = (adv - adv[keep].mean()) / adv[keep].std()
    torch.testing.assert_close(out["advantage"].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first_inside", [True, False])
def test_modules_inside_and_outside_inference_mode(first_inside, monkeypatch):
    """GAE / VTrace reuse the scan workspaces of calls made under inference_mode (and the reverse)."""
    monkeypatch.delattr(_scan._WORKSPACES, "cache", raising=False)  # the first call makes them
    td, actor, net = behaviour_batch(), actor_net(), value_net()
    vtrace = VTrace(gamma=0.97, actor_network=actor, value_network=net)
    vtrace.set_keys(sample_log_prob="action_log_prob")
    estimators = {"gae": (GAE(gamma=0.97, lmbda=0.9, value_network=net),
                          TorchRLGAE(gamma=0.97, lmbda=0.9, value_network=net)), "vtrace": (vtrace, None)}
    for name, (ours, theirs) in estimators.items():
        results = []
        for inside in (first_inside, not first_inside):
            with torch.inference_mode(inside):
                results.append(ours(td.clone())["value_target"].clone())
        torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
        if theirs is not None:
            torch.testing.assert_close(results[0], theirs(td.clone())["value_target"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["lazy-stack", "strided"])
def test_gae_gives_the_same_on_other_forms_of_the_rollout(form):
    # A collector may hand over a lazy stack of env rollouts, or a non-contiguous one.
    net = value_net()
    dense = rollout()
    if form == "lazy-stack":
        other = LazyStackedTensorDict.lazy_stack(list(dense.clone().unbind(0)), 0)
    else:
        other = dense.apply(lambda t: torch.stack([t, t], -1)[..., 1])
    got = GAE(gamma=0.97, lmbda=0.9, value_network=net)(other)
    want = GAE(gamma=0.97, lmbda=0.9, value_network=net)(dense.clone())
    theirs = TorchRLGAE(gamma=0.97, lmbda=0.9, value_network=net)(dense.clone())
    for key in ("advantage", "value_target", "state_value"):
        assert torch.equal(got[key], want[key]), key
        torch.testing.assert_close(got[key], theirs[key], rtol=1e-5, atol=1e-5)


def _agents_td(B=3, T=5, A=2):
    gen = torch.Generator().manual_seed(0)
    v, nv, r = (torch.randn(B, T, A, 1, generator=gen) for _ in range(3))
    d = torch.zeros(B, T, A, 1, dtype=torch.bool)
    return TensorDict({"agents": TensorDict({"state_value": v}, [B, T, A]),
                       "next": {"agents": TensorDict({"state_value": nv, "reward": r, "done": d, "terminated": d},
                                                     [B, T, A])}}, [B, T])


@pytest.mark.parametrize("agent_dim", [4, -5, 7])
@pytest.mark.parametrize("average_gae", [False, True])
def test_agent_dim_outside_the_values_is_refused_at_the_first_call(agent_dim, average_gae):
    est = GAE(gamma=0.9, lmbda=0.9, value_network=None, average_gae=average_gae, agent_dim=agent_dim)
    est.set_keys(value=("agents", "state_value"), reward=("agents", "reward"), done=("agents", "done"),
                 terminated=("agents", "terminated"))
    td = _agents_td()
    match = rf"agent_dim={agent_dim} is out of range for values of shape \(3, 5, 2, 1\) \(4 dims\); use a dim in \[-4, 3\]"
    with pytest.raises(ValueError, match=match):
        est(td)
    with pytest.raises(ValueError, match=match):
        est.value_estimate(td)
    assert "advantage" not in td.keys(True, True)


@pytest.mark.parametrize("agent_dim", ["x", 1.0, True])
def test_agent_dim_of_another_type_is_a_type_error(agent_dim):
    with pytest.raises(TypeError, match=rf"agent_dim must be an int \(a dim of the value tensor, e.g. -2\) or None, "
                                        rf"got agent_dim={agent_dim!r}"):
        GAE(gamma=0.9, lmbda=0.9, value_network=None, agent_dim=agent_dim)


@pytest.mark.parametrize("normalizer", ["yes", RunningMeanStd(), torch.nn.Identity()])
def test_value_normalizer_without_normalize_and_denormalize_is_a_type_error(normalizer):
    with pytest.raises(TypeError, match=r"value_normalizer must be a ValueNorm \(anything with normalize\(\) and "
                                        r"denormalize\(\)\) or None, got value_normalizer="):
        GAE(gamma=0.9, lmbda=0.9, value_network=None, value_normalizer=normalizer)
