"""harl_off_policy_buffer: HARL's OffPolicyBufferEP/FP as per-env rings with n-step samples."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.presets import harl_off_policy_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer


def harl_step(t: int, num_threads: int, num_agents: int, fp: bool, done_at: int) -> TensorDict:
    """One HARL insert in our keys: state/obs name the time step, reward 1 per step."""
    threads = torch.arange(num_threads, dtype=torch.float32).reshape(-1, 1)
    done = torch.full((num_threads, 1), t == done_at)
    shape = (num_threads, num_agents, 1) if fp else (num_threads, 1)
    lead = (num_threads, *(1,) * (len(shape) - 1))  # broadcastable to shape
    state = {"state": (threads * 100 + t).reshape(lead).expand(*shape[:-1], 3)}
    next_state = {"state": (threads * 100 + t + 1).reshape(lead).expand(*shape[:-1], 3)}
    agents = {"observation": (threads * 100 + t).unsqueeze(1).expand(num_threads, num_agents, 2),
              "valid_transitions": torch.ones(num_threads, num_agents, 1)}
    flags = {"reward": torch.ones(shape), "done": done.reshape(lead).expand(shape),
             "terminated": done.reshape(lead).expand(shape)}
    if fp:
        data = {"agents": {**agents, **state}, "next": {"agents": {**next_state, **flags}}}
    else:
        data = {**state, "agents": agents, "next": {**next_state, **flags}}
    return TensorDict(data, [num_threads])


@pytest.mark.parametrize("state_type", ["EP", "FP"])
@pytest.mark.parametrize("num_agents", [1, 3])
def test_n_step_samples_in_harl_layouts(state_type, num_agents):
    fp = state_type == "FP"
    rb = harl_off_policy_buffer(60, 2, batch_size=16, n_step=3, gamma=0.5, state_type=state_type,
                                generator=torch.Generator().manual_seed(0))
    assert isinstance(rb, EnvRingReplayBuffer) and rb.storage.max_length == 30
    for t in range(10):  # episode ends at t = 4
        rb.extend(harl_step(t, 2, num_agents, fp, done_at=4))
    batch = rb.sample()
    group = ("agents",) if fp else ()
    start = batch[(*group, "state")][..., 0] % 100  # [B] (EP) or [B, A] (FP)
    if fp:
        start = start[:, 0]
    # Chains of up to 3 steps stop at the done step 4 and at the newest step 9.
    steps = torch.minimum(start + 2, torch.where(start <= 4, 4.0, 9.0)) - start + 1
    reward = batch[("next", *group, "reward")]
    discount = batch[(*group, "nstep_discount")]
    want = (1 - 0.5 ** steps) / 0.5
    assert torch.allclose(reward.reshape(16, -1), want.unsqueeze(1).expand(16, reward[0].numel()))
    assert torch.allclose(discount.reshape(16, -1), (0.5 ** steps).unsqueeze(1).expand(16, discount[0].numel()))
    next_state = batch[("next", *group, "state")][..., 0] % 100
    assert torch.equal(next_state.reshape(16, -1)[:, 0], start + steps)
    assert batch["agents", "valid_transitions"].shape == (16, num_agents, 1)


def test_any_subset_of_threads_per_insert():
    """HARL assumes every insert holds all threads; the rings take any subset."""
    rb = harl_off_policy_buffer(20, 2, batch_size=3, n_step=2, gamma=0.9)
    rb.extend(harl_step(0, 2, 1, False, done_at=-1))
    rb.extend(harl_step(1, 2, 1, False, done_at=-1)[1:], env_ids=[1])
    assert rb.storage.current_size.tolist() == [1, 2]
    assert rb.sample().shape == (3,)


def test_bad_arguments():
    with pytest.raises(ValueError, match="state_type must be 'EP' .* or 'FP' .*, got state_type='ep'"):
        harl_off_policy_buffer(10, 2, state_type="ep")
    with pytest.raises(ValueError, match="n_rollout_threads must be an int >= 1, got n_rollout_threads=0"):
        harl_off_policy_buffer(10, 0)
    with pytest.raises(ValueError, match="n_step must be an int >= 1, got n_step=0"):
        harl_off_policy_buffer(10, 1, n_step=0)
    rb = harl_off_policy_buffer(10, 1, batch_size=4)
    rb.extend(harl_step(0, 1, 1, False, done_at=-1))
    with pytest.raises(ValueError, match="needs at least batch_size=4 stored transitions, the buffer holds 1"):
        rb.sample()


@pytest.mark.parametrize("state_type", ["EP", "FP"])
def test_agent_group_is_checked_for_both_state_types(state_type):
    """EP does not use agent_group, but a bad one is refused as for FP."""
    with pytest.raises(TypeError, match="agent_group must be the name of the agents' group key .* got agent_group=3"):
        harl_off_policy_buffer(16, 2, agent_group=3, state_type=state_type)
    assert harl_off_policy_buffer(16, 2, state_type="EP").sampler.agent_group is None
    assert harl_off_policy_buffer(16, 2, state_type="FP").sampler.agent_group == "agents"
