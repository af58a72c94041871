"""Replay buffers: TorchRL's ``TensorDictReplayBuffer`` with lean hot paths, and the per-env ring buffer."""
from torchrl_ext.replay_buffers.env_ring import EnvRingReplayBuffer
from torchrl_ext.replay_buffers.tensordict import PrioritizedReplayBuffer, TensorDictReplayBuffer

__all__ = ["EnvRingReplayBuffer", "PrioritizedReplayBuffer", "TensorDictReplayBuffer"]
