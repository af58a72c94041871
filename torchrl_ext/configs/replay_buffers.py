"""Configs of the replay buffers (group ``replay_buffer``)."""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.common import ConfigBase
from torchrl.trainers.algorithms.configs.data import TensorDictReplayBufferConfig

from torchrl_ext.configs._base import Validated, from_signature

__all__ = [
    "EnvRingReplayBufferConfig",
    "ExtTensorDictReplayBufferConfig",
    "OnPolicyReplayBufferConfig",
    "PathGAEReplayBufferConfig",
    "PrioritizedReplayBufferConfig",
    "VTraceReplayBufferConfig",
]


@from_signature("torchrl_ext.replay_buffers.TensorDictReplayBuffer")
class ExtTensorDictReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``TensorDictReplayBuffer`` (``replay_buffer: ext_tensordict``): its arguments, with its defaults."""


@from_signature("torchrl_ext.replay_buffers.EnvRingReplayBuffer")
class EnvRingReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``EnvRingReplayBuffer`` (``replay_buffer: ext_env_ring``): its arguments, with its defaults."""


@from_signature("torchrl_ext.replay_buffers.PrioritizedReplayBuffer", alpha=0.6, beta=0.4)
class PrioritizedReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``PrioritizedReplayBuffer`` (``replay_buffer: ext_prioritized_replay``): its arguments, with its defaults."""


@from_signature("torchrl_ext.replay_buffers.OnPolicyReplayBuffer", num_steps=128)
class OnPolicyReplayBufferConfig(Validated, ConfigBase):
    """Config of ``OnPolicyReplayBuffer`` (``replay_buffer: ext_on_policy``): its arguments, with its defaults."""


@from_signature("torchrl_ext.replay_buffers.VTraceReplayBuffer")
class VTraceReplayBufferConfig(OnPolicyReplayBufferConfig):
    """Config of ``VTraceReplayBuffer`` (``replay_buffer: ext_vtrace_on_policy``): its arguments, with its defaults."""


@from_signature("torchrl_ext.replay_buffers.PathGAEReplayBuffer", size=1000, batch_size=64)
class PathGAEReplayBufferConfig(Validated, ConfigBase):
    """Config of ``PathGAEReplayBuffer`` (``replay_buffer: ext_path_gae``): its arguments, with its defaults."""
