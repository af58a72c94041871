"""Bad constructor arguments raise ValueError / TypeError naming the argument, whatever layer
checks them (found by fuzzing every public constructor with out-of-kind values)."""
from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from torchrl_ext import presets, replay_buffers, samplers, segment_tree, storages, value
from torchrl_ext.demos import DemoDirPoller, DemoMixer, DemoStore

CASES: list[tuple[str, Callable[[Any], Any], list[Any]]] = [
    # every device= is parsed up front: torch's RuntimeError named no argument
    ("device", lambda v: storages.EnvRingStorage(2, 4, device=v), ["nope", 1.5]),
    ("device", lambda v: storages.RolloutStorage(4, device=v), ["nope"]),
    ("device", lambda v: samplers.PrioritizedSampler(8, 0.6, 0.4, device=v), ["nope"]),
    ("device", lambda v: value.ValueNorm(1, device=v), ["nope"]),
    ("device", lambda v: value.RunningMeanStd(device=v), ["nope"]),
    ("device", lambda v: DemoStore(device=v), ["nope"]),
    ("device", lambda v: segment_tree.SumSegmentTree(4, device=v), ["nope"]),
    ("device", lambda v: presets.l2r_ppo_buffer(2, 1, 8, 2, device=v), ["nope"]),
    # sizes beyond what a tensor indexes: torch's OverflowError named no argument
    ("max_length", lambda v: storages.EnvRingStorage(2, v), [10**30]),
    ("buffer_size", lambda v: presets.harl_off_policy_buffer(v, 2), [10**30]),
    ("num_envs", lambda v: DemoMixer(DemoStore(), v), [10**30]),
    ("max_capacity", lambda v: samplers.PrioritizedSampler(v, 0.6, 0.4), [10**30]),
    # the presets name their own (the originals') arguments
    ("num_environments", lambda v: presets.alf_replay_buffer(v, 8), [0, 1.5, "3"]),
    ("num_earliest_frames_ignored", lambda v: presets.alf_replay_buffer(2, 8, num_earliest_frames_ignored=v), ["3", -1]),
    ("batch_size", lambda v: presets.alf_replay_buffer(2, 8, batch_size=v), [-1, 0, 1.5]),
    ("batch_size", lambda v: presets.velora_replay_buffer(8, 2, 1, 1, batch_size=v), [-1, "3"]),
    ("batch_size", lambda v: presets.harl_off_policy_buffer(16, 2, batch_size=v), [0, 1.5]),
    ("episode_length", lambda v: presets.harl_rollout_buffer(v), [0, "3"]),
    ("size", lambda v: presets.pytorchrl_on_policy_buffer(v), [0, None]),
    ("intrinsic_filter", lambda v: replay_buffers.OnPolicyReplayBuffer(4, intrinsic_filter=v), ["nope", 3]),
    # values checked where they are given, not where they are used
    ("default_return", lambda v: storages.EpisodicEnvRingStorage(2, 4, default_return=v), ["x", None]),
    ("reward_clip", lambda v: storages.EpisodicEnvRingStorage(2, 4, reward_clip=v), [(math.nan, 1.0), (1.0, -1.0)]),
    ("input_shape", lambda v: value.ValueNorm(v), [1.5, None]),
    ("shape", lambda v: value.RunningMeanStd(shape=v), [1.5]),
    ("stack_dim", lambda v: storages.DedupEnvRingStorage(2, 4, stack_dim=v), ["3", None, 1.5]),
    ("frame_skip", lambda v: DemoDirPoller(DemoStore(), ".", frame_skip=v), [-1, "3"]),
    ("agent_dim", lambda v: value.GAE(gamma=0.9, lmbda=0.9, value_network=None, agent_dim=v), ["3", 1.5]),
    ("agent_group", lambda v: samplers.NStepSampler(2, agent_group=v), [3, ""]),
]


@pytest.mark.parametrize("name, build, bad", [(n, b, v) for n, b, values in CASES for v in values],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_bad_argument_is_refused_naming_it(name, build, bad):
    with pytest.raises((ValueError, TypeError)) as refused:
        build(bad)
    assert name in str(refused.value), str(refused.value)
