"""Configs of the presets: the originals' buffer constructors (group ``replay_buffer``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated

__all__ = [
    "AlfReplayBufferConfig",
    "HarlOffPolicyBufferConfig",
    "HarlRolloutBufferConfig",
    "L2RPPOBufferConfig",
    "L2RSimpleReplayBufferConfig",
    "PytorchrlOnPolicyBufferConfig",
    "VeloraReplayBufferConfig",
]


@dataclass
class AlfReplayBufferConfig(Validated, ConfigBase):
    """Config of ``alf_replay_buffer`` (``replay_buffer: ext_alf``): its arguments, with its defaults."""
    num_environments: int = 1
    max_length: int = 1024
    batch_length: int = 1
    batch_size: Optional[int] = None
    num_earliest_frames_ignored: int = 0
    prioritized_sampling: bool = False
    initial_priority: float = 1.0
    recent_data_steps: int = 1
    recent_data_ratio: float = 0.0
    with_replacement: bool = False
    device: str = "cpu"
    keep_episodic_info: Optional[bool] = None
    record_episodic_return: bool = False
    default_return: float = -1000.0
    gamma: float = 0.99
    reward_clip: Optional[Any] = None
    step_type_key: Any = "step_type"
    generator: Any = None
    _target_: str = "torchrl_ext.presets.alf_replay_buffer"


@dataclass
class HarlRolloutBufferConfig(Validated, ConfigBase):
    """Config of ``harl_rollout_buffer`` (``replay_buffer: ext_harl``): its arguments, with its defaults."""
    episode_length: int = 200
    num_mini_batch: Optional[int] = 1
    mini_batch_size: Optional[int] = None
    use_recurrent_policy: bool = False
    use_naive_recurrent_policy: bool = False
    data_chunk_length: int = 10
    shuffle: bool = True
    drop_last: bool = False
    carry_keys: Optional[Any] = None
    device: str = "cpu"
    generator: Any = None
    _target_: str = "torchrl_ext.presets.harl_rollout_buffer"


@dataclass
class HarlOffPolicyBufferConfig(Validated, ConfigBase):
    """Config of ``harl_off_policy_buffer`` (``replay_buffer: ext_harl_off_policy``): its arguments, with its defaults."""
    buffer_size: int = 1_000_000
    n_rollout_threads: int = 1
    batch_size: Optional[int] = None
    n_step: int = 1
    gamma: float = 0.99
    state_type: str = "EP"
    agent_group: str = "agents"
    device: str = "cpu"
    generator: Any = None
    _target_: str = "torchrl_ext.presets.harl_off_policy_buffer"


@dataclass
class PytorchrlOnPolicyBufferConfig(Validated, ConfigBase):
    """Config of ``pytorchrl_on_policy_buffer`` (``replay_buffer: ext_pytorchrl``): its arguments, with its defaults."""
    size: int = 128
    storage: str = "gae"
    gamma: float = 0.99
    gae_lambda: float = 0.95
    gamma_intrinsic: float = 0.99
    clip_rho_thres: float = 1.0
    clip_c_thres: float = 1.0
    recurrent: bool = False
    num_mini_batch: Optional[int] = 1
    mini_batch_size: Optional[int] = None
    device: str = "cpu"
    # OnPolicyReplayBuffer arguments the preset forwards (**kwargs). advantage_eps is
    # left out: its default differs between GAE/vanilla (1e-5) and V-trace (1e-8);
    # add it with `+advantage_eps=...`.
    intrinsic_filter: str = "forward"
    normalize_advantage: bool = True
    shuffle: bool = True
    keys: Optional[Any] = None
    carry_keys: Optional[Any] = None
    generator: Any = None
    _target_: str = "torchrl_ext.presets.pytorchrl_on_policy_buffer"


@dataclass
class L2RSimpleReplayBufferConfig(Validated, ConfigBase):
    """Config of ``l2r_simple_replay_buffer`` (``replay_buffer: ext_l2r_simple_replay``): its arguments, with its defaults."""
    obs_dim: int = 1
    act_dim: int = 1
    size: int = 1000
    batch_size: int = 64
    device: str = "cpu"
    generator: Any = None
    _target_: str = "torchrl_ext.presets.l2r_simple_replay_buffer"


@dataclass
class L2RPPOBufferConfig(L2RSimpleReplayBufferConfig):
    """Config of ``l2r_ppo_buffer`` (``replay_buffer: ext_l2r_ppo``): its arguments, with its defaults."""
    gamma: float = 0.99
    lam: float = 0.95
    eps: float = 1e-3
    _target_: str = "torchrl_ext.presets.l2r_ppo_buffer"


@dataclass
class VeloraReplayBufferConfig(Validated, ConfigBase):
    """Config of ``velora_replay_buffer`` (``replay_buffer: ext_velora``): its arguments, with its defaults."""
    capacity: int = 100_000
    state_dim: int = 1
    action_dim: int = 1
    hidden_dim: int = 1
    device: Optional[str] = None
    batch_size: Optional[int] = None
    keys: Optional[Any] = None
    generator: Any = None
    _target_: str = "torchrl_ext.presets.velora_replay_buffer"
