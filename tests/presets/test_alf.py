"""alf_replay_buffer: ALF's constructor arguments mapped onto torchrl_ext components."""
from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.presets import alf_replay_buffer
from torchrl_ext.samplers import PrioritizedTrajectorySampler, TrajectorySampler
from torchrl_ext.storages import EnvRingStorage, EpisodicEnvRingStorage


def test_keep_episodic_info_defaults_to_ignored_frames():
    assert type(alf_replay_buffer(2, 8).storage) is EnvRingStorage
    rb = alf_replay_buffer(2, 8, num_earliest_frames_ignored=2)
    assert type(rb.storage) is EpisodicEnvRingStorage
    assert rb.sampler.num_earliest_frames_ignored == 2


def test_returns_need_episodic_info():
    with pytest.raises(ValueError, match="record_episodic_return=True needs keep_episodic_info=True"):
        alf_replay_buffer(2, 8, record_episodic_return=True, keep_episodic_info=False)
    rb = alf_replay_buffer(1, 8, record_episodic_return=True, keep_episodic_info=True, gamma=0.5,
                           batch_size=2, batch_length=1)
    for st, d, r in [(0, 1.0, 0.0), (1, 1.0, 1.0), (2, 0.0, 2.0)]:
        rb.extend(TensorDict({"step_type": torch.tensor([st]), "discount": torch.tensor([d]),
                              "reward": torch.tensor([r])}, [1]))
    batch = rb.sample()
    expected = {0: 2.0, 1: 2.0, 2: -1000.0}
    for pos, ret in zip(batch["positions"][:, 0].tolist(), batch["discounted_return"][:, 0].tolist()):
        assert ret == expected[pos]


def test_sampler_choice_and_arguments():
    rb = alf_replay_buffer(2, 8, prioritized_sampling=True, initial_priority=3.0, batch_length=2,
                           recent_data_ratio=0.5, recent_data_steps=2, with_replacement=True)
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedTrajectorySampler)
    assert (sampler.initial_priority, sampler.batch_length, sampler.with_replacement) == (3.0, 2, True)
    assert (sampler.recent_data_ratio, sampler.recent_data_steps) == (0.5, 2)
    assert type(alf_replay_buffer(2, 8).sampler) is TrajectorySampler


def test_an_infinite_initial_priority_is_refused():
    # It was accepted and made every importance weight NaN, silently.
    with pytest.raises(ValueError, match="initial_priority must be a finite number, got initial_priority=inf"):
        alf_replay_buffer(2, 4, prioritized_sampling=True, initial_priority=math.inf)


@pytest.mark.parametrize("prioritized", [False, True])
def test_sample_with_an_explicit_batch_size_equals_the_default_path(prioritized):
    # Was: with prioritized_sampling, rb.sample(n) for n != batch_size raised "batch
    # dimension mismatch": the [B] weights were not broadcast over the [B, T] windows.
    def build():
        rb = alf_replay_buffer(3, 5, batch_length=2, batch_size=4, prioritized_sampling=prioritized,
                               generator=torch.Generator().manual_seed(0))
        for t in range(4):
            rb.extend(TensorDict({"x": torch.tensor([0.0, 10.0, 20.0]) + t}, [3]))
        return rb

    with pytest.warns(UserWarning, match="conflicting batch_sizes"):
        explicit = build().sample(3)
    default = build().sample()[:3]
    assert explicit.batch_size == (3, 2)
    assert sorted(explicit.keys(True, True)) == sorted(default.keys(True, True))
    for key in default.keys(True, True):
        assert explicit[key].shape == default[key].shape, key
    assert torch.equal(explicit["x"], explicit["index"][..., 0] * 10.0 + explicit["index"][..., 1])
    with pytest.raises(ValueError, match="batch_size must be an int >= 0"):
        build().sample(-1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_batch_with_a_bad_priority_stores_nothing(bad):
    # Was: the steps were stored, then the priority raised; the retry stored them twice.
    rb = alf_replay_buffer(2, 4, prioritized_sampling=True, batch_size=2)
    rb.extend(TensorDict({"x": torch.zeros(2), "td_error": torch.ones(2)}, [2]))
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        rb.extend(TensorDict({"x": torch.ones(2), "td_error": torch.tensor([1.0, bad])}, [2]))
    assert len(rb) == 2 and rb.storage.current_size.tolist() == [1, 1]


def test_gather_all_takes_alfs_flag_as_well_as_a_count():
    """ALF's ``gather_all(ignore_earliest_frames=True)`` leaves out the sampler's
    ``num_earliest_frames_ignored`` oldest steps; a count does the same; False leaves out none."""
    rb = alf_replay_buffer(2, 5, num_earliest_frames_ignored=2, keep_episodic_info=False)
    for k in range(7):
        rb.extend(TensorDict({"x": torch.tensor([1000.0 * e + k for e in range(2)])}, [2]))
    flagged, start = rb.gather_all(ignore_earliest_frames=True)
    counted, _ = rb.gather_all(2)
    assert flagged["x"].tolist() == counted["x"].tolist() == [[4.0, 5.0, 6.0], [1004.0, 1005.0, 1006.0]]
    assert start.tolist() == [4, 4]
    assert rb.gather_all(ignore_earliest_frames=False)[0]["x"][0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    with pytest.raises(ValueError, match="ignore_earliest_frames must be an int >= 0, got ignore_earliest_frames=-1"):
        rb.gather_all(-1)


@pytest.mark.parametrize("name", ["prioritized_sampling", "keep_episodic_info", "record_episodic_return",
                                  "with_replacement"])
def test_flags_refuse_other_values(name):
    """The string "False" is truthy: taken as a flag it would turn the feature on."""
    with pytest.raises(TypeError, match=f"{name} must be True or False, got {name}='False'"):
        alf_replay_buffer(2, 8, **{name: "False"})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"gamma": math.nan}, ValueError, r"gamma must be a number in \[0, 1\], got gamma=nan"),
    ({"gamma": 7.0}, ValueError, r"gamma must be a number in \[0, 1\], got gamma=7.0"),
    ({"default_return": "x"}, TypeError, "default_return must be a real number, got 'x'"),
    ({"reward_clip": (1.0, -1.0)}, ValueError, r"reward_clip must be \(low, high\) with low <= high"),
    ({"initial_priority": math.nan}, ValueError, "initial_priority must be >= 0.0, got initial_priority=nan"),
    ({"initial_priority": -1.0}, ValueError, "initial_priority must be >= 0.0, got initial_priority=-1.0"),
    ({"initial_priority": 1e39}, ValueError, "initial_priority=1e\\+39 .* above"),
])
@pytest.mark.parametrize("on", [False, True])
def test_arguments_of_a_switched_off_feature_are_checked_too(kwargs, error, match, on):
    """Episodic and priority arguments are refused as when their feature is on."""
    feature = {"keep_episodic_info": on, "prioritized_sampling": on}
    with pytest.raises(error, match=match):
        alf_replay_buffer(2, 8, **feature, **kwargs)


def test_switched_off_features_keep_the_plain_components():
    rb = alf_replay_buffer(2, 8, gamma=0.5, reward_clip=(-1.0, 1.0), initial_priority=2.0)
    assert type(rb.storage) is EnvRingStorage and type(rb.sampler) is TrajectorySampler
    assert (rb.storage.num_envs, rb.storage.max_length) == (2, 8)
