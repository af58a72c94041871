"""``load_state_dict`` / ``loads`` of a state saved by a differently built buffer: refused before
any component changes, and a load restores exactly the saved buffer's state."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tests.test_errors import assert_same, freeze
from torchrl_ext.presets import alf_replay_buffer, pytorchrl_on_policy_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.storages import EnvRingStorage, EpisodicEnvRingStorage, FastTensorStorage


def ring_steps(num_envs: int, length: int, start: float) -> TensorDict:
    step_type = torch.ones(num_envs, length, dtype=torch.long)
    step_type[:, 0] = 0
    x = torch.arange(length, dtype=torch.float32).expand(num_envs, length) + start
    return TensorDict({"obs": x.unsqueeze(-1).clone(), "reward": x.clone(), "step_type": step_type,
                       "discount": torch.ones(num_envs, length)}, [num_envs, length])


def test_episodic_storage_refuses_a_state_without_the_episode_index():
    plain = EnvRingReplayBuffer(storage=EnvRingStorage(2, 6))
    plain.extend(ring_steps(2, 5, 1.0))
    episodic = EpisodicEnvRingStorage(2, 6)
    EnvRingReplayBuffer(storage=episodic).extend(ring_steps(2, 3, 7.0))
    before = freeze(episodic.state_dict())
    with pytest.raises(ValueError, match=r"the checkpoint has no episode index \('episodes'\), which this "
                                         r"EpisodicEnvRingStorage needs.*build the storage as the saved one"):
        episodic.load_state_dict(plain.storage.state_dict())
    assert_same(before, freeze(episodic.state_dict()))


@pytest.mark.parametrize("source", [dict(), dict(keep_episodic_info=True), dict(batch_length=3)])
def test_prioritized_ring_buffer_refuses_a_uniform_buffers_state(source):
    saved = alf_replay_buffer(3, 6, batch_size=2, **source)
    saved.extend(ring_steps(3, 5, 0.0))
    rb = alf_replay_buffer(3, 6, batch_size=2, prioritized_sampling=True)
    rb.extend(ring_steps(3, 2, 50.0))
    before = freeze(rb.state_dict())
    with pytest.raises(ValueError, match=r"state_dict\['_sampler'\] cannot be loaded into this buffer's "
                                         r"PrioritizedTrajectorySampler \(ValueError: state_dict lacks \['initialized'"):
        rb.load_state_dict(saved.state_dict())
    assert_same(before, freeze(rb.state_dict()))
    rb.sample()


def flat_buffer(cls=TensorDictReplayBuffer, **kwargs):
    rb = cls(storage=FastTensorStorage(8), batch_size=2, **kwargs)
    rb.extend(TensorDict({"obs": torch.arange(5.0)}, [5]))
    return rb


@pytest.mark.parametrize("part", ["_sampler", "_writer"])
def test_a_refused_sampler_or_writer_state_leaves_the_storage_unchanged(part):
    state = flat_buffer(PrioritizedReplayBuffer, alpha=0.6, beta=0.4).state_dict()
    state["_storage"]["_storage"]["obs"] += 100  # the data a wrong load would bring in
    state[part] = {}
    rb = flat_buffer(PrioritizedReplayBuffer, alpha=0.6, beta=0.4)
    before = freeze(rb.state_dict())
    with pytest.raises(ValueError, match=rf"state_dict\['{part}'\] cannot be loaded into this buffer's"):
        rb.load_state_dict(state)
    assert_same(before, freeze(rb.state_dict()))


def test_a_fitting_state_still_loads():
    saved = flat_buffer(PrioritizedReplayBuffer, alpha=0.6, beta=0.4)
    saved.update_priority(torch.arange(5), torch.arange(1.0, 6.0))
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(8), batch_size=2)
    rb.load_state_dict(saved.state_dict())
    assert_same(freeze(saved.state_dict()), freeze(rb.state_dict()))


def on_policy_step(t: float, n: int = 2) -> TensorDict:
    x = torch.full((n, 2), t)
    done = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict({"observation": x, "state_value": x[:, :1] * 0.1, "action_log_prob": -x[:, 0] * 0.01,
                       "action": x[:, :1], "next": {"observation": x + 1, "reward": x[:, :1], "done": done,
                                                    "terminated": done.clone()}}, [n])


def critic(td):
    td.set("state_value", td["observation"][..., :1] * 0.1)
    return td


@pytest.mark.parametrize("way", ["loads", "load_state_dict"])
@pytest.mark.parametrize("saved_computed", [False, True])
def test_vtrace_load_restores_the_saved_behaviour_log_prob(tmp_path, way, saved_computed):
    rb = pytorchrl_on_policy_buffer(4, storage="vtrace")
    for t in range(4):
        rb.insert(on_policy_step(float(t)))
    rb.compute_returns(critic)  # this buffer's own behaviour_log_prob, [4, 2]
    saved = pytorchrl_on_policy_buffer(4, storage="vtrace")
    for t in range(2):
        saved.insert(on_policy_step(50.0 + t))
    if saved_computed:
        saved.compute_returns(critic)
    if way == "loads":
        saved.dumps(tmp_path / "v")
        rb.loads(tmp_path / "v")
    else:
        rb.load_state_dict(saved.state_dict())
    assert hasattr(rb, "behaviour_log_prob") == hasattr(saved, "behaviour_log_prob") == saved_computed
    if saved_computed:
        assert torch.equal(rb.behaviour_log_prob, saved.behaviour_log_prob)
