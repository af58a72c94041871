"""Replay buffers: TorchRL's ``TensorDictReplayBuffer`` with lean hot paths, the per-env ring buffer
and the on-policy rollout buffers."""
from torchrl_ext.replay_buffers.env_ring import EnvRingReplayBuffer
from torchrl_ext.replay_buffers.on_policy import OnPolicyKeys, OnPolicyReplayBuffer, VTraceReplayBuffer
from torchrl_ext.replay_buffers.segments import PathGAEReplayBuffer
from torchrl_ext.replay_buffers.prioritized import PrioritizedReplayBuffer
from torchrl_ext.replay_buffers.tensordict import PriorityEntryError, TensorDictReplayBuffer

__all__ = [
    "EnvRingReplayBuffer",
    "OnPolicyKeys",
    "OnPolicyReplayBuffer",
    "PathGAEReplayBuffer",
    "PrioritizedReplayBuffer",
    "PriorityEntryError",
    "TensorDictReplayBuffer",
    "VTraceReplayBuffer",
]
