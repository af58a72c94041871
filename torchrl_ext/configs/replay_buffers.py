"""Configs of the replay buffers (group ``replay_buffer``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.common import ConfigBase
from torchrl.trainers.algorithms.configs.data import TensorDictReplayBufferConfig

from torchrl_ext.configs._base import Validated

__all__ = [
    "EnvRingReplayBufferConfig",
    "ExtTensorDictReplayBufferConfig",
    "OnPolicyReplayBufferConfig",
    "PathGAEReplayBufferConfig",
    "PrioritizedReplayBufferConfig",
    "VTraceReplayBufferConfig",
]


@dataclass
class ExtTensorDictReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``TensorDictReplayBuffer`` (``replay_buffer: ext_tensordict``): its arguments, with its defaults."""
    _target_: str = "torchrl_ext.replay_buffers.TensorDictReplayBuffer"


@dataclass
class EnvRingReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``EnvRingReplayBuffer`` (``replay_buffer: ext_env_ring``): its arguments, with its defaults."""
    num_envs: Optional[int] = None
    max_length: Optional[int] = None
    device: str = "cpu"
    _target_: str = "torchrl_ext.replay_buffers.EnvRingReplayBuffer"


@dataclass
class PrioritizedReplayBufferConfig(TensorDictReplayBufferConfig):
    """Config of ``PrioritizedReplayBuffer`` (``replay_buffer: ext_prioritized_replay``): its arguments, with its defaults."""
    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-8
    reduction: str = "max"
    weights: str = "per"
    initial_priority: float = 1.0
    max_priority_within_buffer: bool = False
    replacement: bool = True
    sampler_device: Optional[str] = None
    sync: bool = True
    _target_: str = "torchrl_ext.replay_buffers.PrioritizedReplayBuffer"


@dataclass
class OnPolicyReplayBufferConfig(Validated, ConfigBase):
    """Config of ``OnPolicyReplayBuffer`` (``replay_buffer: ext_on_policy``): its arguments, with its defaults."""
    num_steps: int = 128
    gamma: float = 0.99
    gae_lambda: Optional[float] = 0.95
    gamma_intrinsic: float = 0.99
    intrinsic_filter: str = "forward"
    normalize_advantage: bool = True
    advantage_eps: float = 1e-5
    recurrent: bool = False
    num_mini_batch: Optional[int] = 1
    mini_batch_size: Optional[int] = None
    shuffle: bool = True
    keys: Optional[Any] = None
    carry_keys: Optional[Any] = None
    device: str = "cpu"
    generator: Any = None
    _target_: str = "torchrl_ext.replay_buffers.OnPolicyReplayBuffer"


@dataclass
class VTraceReplayBufferConfig(OnPolicyReplayBufferConfig):
    """Config of ``VTraceReplayBuffer`` (``replay_buffer: ext_vtrace_on_policy``): its arguments, with its defaults."""
    rho_thresh: float = 1.0
    c_thresh: float = 1.0
    advantage_eps: float = 1e-8
    _target_: str = "torchrl_ext.replay_buffers.VTraceReplayBuffer"


@dataclass
class PathGAEReplayBufferConfig(Validated, ConfigBase):
    """Config of ``PathGAEReplayBuffer`` (``replay_buffer: ext_path_gae``): its arguments, with its defaults."""
    size: int = 1000
    batch_size: int = 64
    gamma: float = 0.99
    lam: float = 0.95
    eps: float = 1e-3
    reward_key: Any = ("next", "reward")
    value_key: Any = "state_value"
    device: str = "cpu"
    generator: Any = None
    _target_: str = "torchrl_ext.replay_buffers.PathGAEReplayBuffer"
