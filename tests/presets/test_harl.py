"""harl_rollout_buffer: HARL's buffers end to end (rollout, returns through GAE, minibatches)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests._vectors import load_npz
from torchrl_ext.presets import harl_rollout_buffer
from torchrl_ext.samplers import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
)
from torchrl_ext.value import GAE, ValueNorm

GAMMA, LMBDA = 0.95, 0.9


def _value_norm(data) -> ValueNorm:
    vn = ValueNorm(1)
    vn.load_state_dict({k: torch.from_numpy(np.array(data[f"vn_{k}"]))
                        for k in ("running_mean", "running_mean_sq", "debiasing_term")})
    return vn


@pytest.mark.parametrize("kind", ["ep", "fp"])
@pytest.mark.parametrize("use_value_norm", [False, True])
def test_returns_through_the_rollout_equal_harl(kind, use_value_norm):
    """HARL compute_returns (GAE, no proper time limits) via RolloutStorage + GAE(time_dim=0)."""
    data = load_npz("harl_critic_returns.npz")
    rewards = torch.from_numpy(data[f"{kind}_rewards"])  # [T, N(, A), 1]
    value_preds = torch.from_numpy(data[f"{kind}_value_preds_in"])
    next_value = torch.from_numpy(data[f"{kind}_next_value"])
    ended = torch.from_numpy(data[f"{kind}_masks_in"]) == 0  # row t: masks[t + 1] == 0
    steps, envs = rewards.shape[:2]
    vn = _value_norm(data) if use_value_norm else None
    rb = harl_rollout_buffer(steps, num_mini_batch=2)
    rollout = rb.storage
    for t in range(steps):
        rollout.insert(TensorDict({
            "state_value": value_preds[t],
            "next": {"reward": rewards[t], "done": ended[t], "terminated": ended[t]},
        }, [envs]))
    rollout.data["state_value"][steps] = next_value  # the critic on the bootstrap slot
    rollout.fill_next("state_value")
    gae = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, value_normalizer=vn,
              agent_dim=-2 if kind == "fp" else None)
    out = gae(rollout.data[:steps], time_dim=0)
    want = torch.from_numpy(data[f"{kind}_badreal_ptl0_gae1_vn{int(use_value_norm)}_returns"])[:-1]
    torch.testing.assert_close(out["value_target"], want, rtol=1e-5, atol=1e-5)
    # Then one epoch of minibatches covers every step once.
    rollout.data.set("value_target", torch.cat([out["value_target"], out["value_target"][-1:]]))
    seen = sum(batch.shape[0] for batch in rb)
    assert seen == steps * envs


def test_generator_choice_and_arguments():
    assert isinstance(harl_rollout_buffer(8).sampler, FeedForwardMinibatchSampler)
    rb = harl_rollout_buffer(8, use_naive_recurrent_policy=True, num_mini_batch=2, drop_last=True)
    assert isinstance(rb.sampler, NaiveRecurrentMinibatchSampler) and rb.sampler.drop_last
    rb = harl_rollout_buffer(8, use_recurrent_policy=True, data_chunk_length=4)
    assert isinstance(rb.sampler, ChunkedRecurrentMinibatchSampler) and rb.sampler.data_chunk_length == 4
    rb = harl_rollout_buffer(8, mini_batch_size=5)
    assert rb.sampler.mini_batch_size == 5 and rb.sampler.num_mini_batch is None
    with pytest.raises(ValueError, match="use_recurrent_policy and use_naive_recurrent_policy are exclusive"):
        harl_rollout_buffer(8, use_recurrent_policy=True, use_naive_recurrent_policy=True)


@pytest.mark.parametrize("recurrent", [False, True])
def test_heterogeneous_agent_groups_share_one_rollout(recurrent):
    """HARL stacks per-agent arrays with np.array and fails for agents of different sizes (Q4);
    here each agent group is its own nested key with its own shapes and action space."""
    steps, envs = 4, 3
    rb = harl_rollout_buffer(steps, num_mini_batch=2, use_naive_recurrent_policy=recurrent)
    for t in range(steps):
        rb.storage.insert(TensorDict({
            "walker": {"observation": torch.full((envs, 5), float(t)), "action": torch.randn(envs, 2)},
            "picker": {"observation": torch.full((envs, 3, 3), float(t)), "action": torch.randint(4, (envs, 1)),
                       "available_actions": torch.ones(envs, 4, dtype=torch.bool)},
            "next": {"walker": {"observation": torch.full((envs, 5), t + 1.0)},
                     "picker": {"observation": torch.full((envs, 3, 3), t + 1.0)},
                     "reward": torch.ones(envs, 1)},
        }, [envs]))
    batches = list(rb)
    assert sum(b.numel() for b in batches) == steps * envs
    for batch in batches:
        assert batch["walker", "observation"].shape[-1:] == (5,)
        assert batch["picker", "observation"].shape[-2:] == (3, 3)
        # Both groups come from the same step of the same env.
        assert torch.equal(batch["walker", "observation"][..., 0], batch["picker", "observation"][..., 0, 0])
    # The slot after the last step carries each group's own next observation.
    assert rb.storage.data["walker", "observation"][steps, 0, 0] == steps


@pytest.mark.parametrize("episode_length, data_chunk_length", [(8, 3), (8, 10), (6, 4)])
def test_a_chunk_length_that_does_not_divide_the_episode_is_refused_when_built(episode_length, data_chunk_length):
    # Was: built without complaint, refused only at the first minibatch after a whole rollout.
    with pytest.raises(ValueError, match=rf"data_chunk_length={data_chunk_length} must divide "
                                         rf"episode_length={episode_length} .*use a divisor of {episode_length}"):
        harl_rollout_buffer(episode_length, use_recurrent_policy=True, data_chunk_length=data_chunk_length)
    # Unused by the other samplers: they take it as long as it is an int >= 1.
    assert harl_rollout_buffer(episode_length, data_chunk_length=data_chunk_length).sampler is not None


@pytest.mark.parametrize("name", ["use_recurrent_policy", "use_naive_recurrent_policy", "shuffle", "drop_last"])
def test_flags_refuse_other_values(name):
    """The string "False" is truthy: taken as a flag it would turn the feature on."""
    with pytest.raises(TypeError, match=f"{name} must be True or False, got {name}='False'"):
        harl_rollout_buffer(8, **{name: "False"})


@pytest.mark.parametrize("kwargs, match", [
    ({"num_mini_batch": -3, "mini_batch_size": 2}, "num_mini_batch must be an int >= 1, got num_mini_batch=-3"),
    ({"data_chunk_length": 0}, "data_chunk_length must be an int >= 1, got data_chunk_length=0"),
    ({"data_chunk_length": "x"}, "data_chunk_length must be an int >= 1, got data_chunk_length='x'"),
    ({"data_chunk_length": 0, "use_naive_recurrent_policy": True}, "data_chunk_length must be an int >= 1"),
])
def test_arguments_the_sampler_does_not_use_are_checked_too(kwargs, match):
    with pytest.raises(ValueError, match=match):
        harl_rollout_buffer(8, **kwargs)


def test_the_documented_rollout_recipe_puts_gae_results_in_every_minibatch():
    # The recipe of harl_rollout_buffer's docstring and docs/migrating.md. Was: GAE's outputs
    # stayed on the data[:T] copy it was given, so minibatches had no advantage and a PPO loss
    # silently computed its own with its default estimator.
    steps, envs = 4, 3
    g = torch.Generator().manual_seed(0)
    rb = harl_rollout_buffer(steps, num_mini_batch=2)
    for _ in range(steps):
        rb.storage.insert(TensorDict({
            "obs": torch.randn(envs, 2, generator=g), "state_value": torch.randn(envs, 1, generator=g),
            "next": {"obs": torch.randn(envs, 2, generator=g), "reward": torch.randn(envs, 1, generator=g),
                     "done": torch.zeros(envs, 1, dtype=torch.bool),
                     "terminated": torch.zeros(envs, 1, dtype=torch.bool)}}, [envs]))
    rb.storage.fill_next("state_value")
    out = GAE(gamma=0.9, lmbda=0.8, value_network=None)(rb.storage.data[:steps], time_dim=0)
    for key in ("advantage", "value_target"):
        rb.storage.set_derived(key, out[key])
    # float64 reference loop
    data = rb.storage.data[:steps]
    value, reward = data["state_value"].double(), data["next", "reward"].double()
    next_value = data["next", "state_value"].double()
    advantage, running = torch.zeros_like(value), torch.zeros(envs, 1, dtype=torch.float64)
    for t in reversed(range(steps)):
        running = reward[t] + 0.9 * next_value[t] - value[t] + 0.9 * 0.8 * running
        advantage[t] = running
    seen = 0
    for batch in rb:
        rows = batch["index"]
        t, e = rows.unbind(-1) if rows.ndim == 2 else (rows // envs, rows % envs)
        torch.testing.assert_close(batch["advantage"].double(), advantage[t, e], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch["value_target"], batch["advantage"] + batch["state_value"])
        seen += batch.shape[0]
    assert seen == steps * envs
