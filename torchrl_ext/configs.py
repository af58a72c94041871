"""Hydra structured configs, registered in TorchRL's ConfigStore groups on import.

Each dataclass has ``_target_`` and the constructor's arguments, and derives
from TorchRL's config base of its group, so it composes with TorchRL's own
configs::

    defaults:
      - replay_buffer@replay_buffer: ext_alf          # the ALF preset, or:
      - storage@replay_buffer.storage: ext_env_ring
      - sampler@replay_buffer.sampler: ext_trajectory

==================  ==========================  ==============================================
group               name                        target
==================  ==========================  ==============================================
``storage``         ``ext_env_ring``            :class:`~torchrl_ext.storages.EnvRingStorage`
``storage``         ``ext_episodic_env_ring``   :class:`~torchrl_ext.storages.EpisodicEnvRingStorage`
``storage``         ``ext_dedup_env_ring``      :class:`~torchrl_ext.storages.DedupEnvRingStorage`
``writer``          ``ext_env_ring``            :class:`~torchrl_ext.writers.EnvRingWriter`
``sampler``         ``ext_trajectory``          :class:`~torchrl_ext.samplers.TrajectorySampler`
``sampler``         ``ext_prioritized_trajectory``  :class:`~torchrl_ext.samplers.PrioritizedTrajectorySampler`
``replay_buffer``   ``ext_env_ring``            :class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer`
``replay_buffer``   ``ext_alf``                 :func:`~torchrl_ext.presets.alf_replay_buffer`
``storage``         ``ext_rollout``             :class:`~torchrl_ext.storages.RolloutStorage`
``sampler``         ``ext_feed_forward``        :class:`~torchrl_ext.samplers.FeedForwardMinibatchSampler`
``sampler``         ``ext_naive_recurrent``     :class:`~torchrl_ext.samplers.NaiveRecurrentMinibatchSampler`
``sampler``         ``ext_chunked_recurrent``   :class:`~torchrl_ext.samplers.ChunkedRecurrentMinibatchSampler`
``replay_buffer``   ``ext_harl``                :func:`~torchrl_ext.presets.harl_rollout_buffer`
``sampler``         ``ext_nstep``               :class:`~torchrl_ext.samplers.NStepSampler`
``replay_buffer``   ``ext_harl_off_policy``     :func:`~torchrl_ext.presets.harl_off_policy_buffer`
``storage``         ``ext_fast_tensor``         :class:`~torchrl_ext.storages.FastTensorStorage`
``storage``         ``ext_fast_memmap``         :class:`~torchrl_ext.storages.FastMemmapStorage`
``replay_buffer``   ``ext_tensordict``          :class:`~torchrl_ext.replay_buffers.TensorDictReplayBuffer`
``replay_buffer``   ``ext_on_policy``           :class:`~torchrl_ext.replay_buffers.OnPolicyReplayBuffer`
``replay_buffer``   ``ext_vtrace_on_policy``    :class:`~torchrl_ext.replay_buffers.VTraceReplayBuffer`
``replay_buffer``   ``ext_pytorchrl``           :func:`~torchrl_ext.presets.pytorchrl_on_policy_buffer`
``replay_buffer``   ``ext_l2r_ppo``             :func:`~torchrl_ext.presets.l2r_ppo_buffer`
``replay_buffer``   ``ext_l2r_simple_replay``   :func:`~torchrl_ext.presets.l2r_simple_replay_buffer`
``replay_buffer``   ``ext_velora``              :func:`~torchrl_ext.presets.velora_replay_buffer`
==================  ==========================  ==============================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from torchrl.trainers.algorithms.configs.common import ConfigBase
from torchrl.trainers.algorithms.configs.data import (
    LazyMemmapStorageConfig,
    LazyTensorStorageConfig,
    SamplerConfig,
    StorageConfig,
    TensorDictReplayBufferConfig,
    WriterConfig,
)


class _Validated:
    """TorchRL's config base declares an abstract ``__post_init__``; the components
    validate their own arguments when instantiated, so there is nothing to check here."""

    def __post_init__(self) -> None:
        return


__all__ = [
    "AlfReplayBufferConfig",
    "ChunkedRecurrentMinibatchSamplerConfig",
    "DedupEnvRingStorageConfig",
    "EnvRingReplayBufferConfig",
    "EnvRingStorageConfig",
    "EnvRingWriterConfig",
    "EpisodicEnvRingStorageConfig",
    "FastMemmapStorageConfig",
    "FastTensorStorageConfig",
    "FeedForwardMinibatchSamplerConfig",
    "HarlOffPolicyBufferConfig",
    "HarlRolloutBufferConfig",
    "L2RPPOBufferConfig",
    "L2RSimpleReplayBufferConfig",
    "NStepSamplerConfig",
    "OnPolicyReplayBufferConfig",
    "NaiveRecurrentMinibatchSamplerConfig",
    "PrioritizedTrajectorySamplerConfig",
    "PytorchrlOnPolicyBufferConfig",
    "RolloutStorageConfig",
    "ExtTensorDictReplayBufferConfig",
    "TrajectorySamplerConfig",
    "VTraceReplayBufferConfig",
    "VeloraReplayBufferConfig",
]


@dataclass
class EnvRingStorageConfig(_Validated, StorageConfig):
    num_envs: int = 1
    max_length: int = 1024
    device: str = "cpu"
    _target_: str = "torchrl_ext.storages.EnvRingStorage"


@dataclass
class _RecordedReturns:
    """Arguments shared by the storages that record episodic returns."""

    record_episodic_return: bool = False
    gamma: float = 0.99
    reward_clip: Optional[Any] = None
    default_return: float = -1000.0
    discount_key: Any = "discount"
    reward_key: Any = "reward"


@dataclass
class EpisodicEnvRingStorageConfig(_RecordedReturns, EnvRingStorageConfig):
    step_type_key: Any = "step_type"
    _target_: str = "torchrl_ext.storages.EpisodicEnvRingStorage"


@dataclass
class DedupEnvRingStorageConfig(_RecordedReturns, EnvRingStorageConfig):
    obs_key: Any = "observation"
    num_stack: int = 1
    stack_dim: int = 0
    padding: str = "reset"
    done_key: Any = ("next", "done")
    check_next: bool = True
    _target_: str = "torchrl_ext.storages.DedupEnvRingStorage"


@dataclass
class EnvRingWriterConfig(_Validated, WriterConfig):
    env_id_key: Any = "env_id"
    _target_: str = "torchrl_ext.writers.EnvRingWriter"


@dataclass
class TrajectorySamplerConfig(_Validated, SamplerConfig):
    batch_length: int = 1
    num_earliest_frames_ignored: int = 0
    with_replacement: bool = False
    recent_data_steps: int = 1
    recent_data_ratio: float = 0.0
    _target_: str = "torchrl_ext.samplers.TrajectorySampler"


@dataclass
class PrioritizedTrajectorySamplerConfig(TrajectorySamplerConfig):
    alpha: float = 1.0
    beta: float = 0.0
    eps: float = 0.0
    initial_priority: float = 1.0
    weights: str = "alf"
    _target_: str = "torchrl_ext.samplers.PrioritizedTrajectorySampler"


@dataclass
class EnvRingReplayBufferConfig(_Validated, ConfigBase):
    storage: Any = None
    sampler: Any = None
    writer: Any = None
    batch_size: Optional[int] = None
    _target_: str = "torchrl_ext.replay_buffers.EnvRingReplayBuffer"


@dataclass
class AlfReplayBufferConfig(_Validated, ConfigBase):
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
    _target_: str = "torchrl_ext.presets.alf_replay_buffer"


@dataclass
class RolloutStorageConfig(_Validated, StorageConfig):
    num_steps: int = 128
    carry_keys: Optional[Any] = None
    device: str = "cpu"
    _target_: str = "torchrl_ext.storages.RolloutStorage"


@dataclass
class FeedForwardMinibatchSamplerConfig(_Validated, SamplerConfig):
    num_mini_batch: Optional[int] = 1
    mini_batch_size: Optional[int] = None
    shuffle: bool = True
    drop_last: bool = False
    _target_: str = "torchrl_ext.samplers.FeedForwardMinibatchSampler"


@dataclass
class NaiveRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    _target_: str = "torchrl_ext.samplers.NaiveRecurrentMinibatchSampler"


@dataclass
class ChunkedRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    data_chunk_length: int = 10
    _target_: str = "torchrl_ext.samplers.ChunkedRecurrentMinibatchSampler"


@dataclass
class HarlRolloutBufferConfig(_Validated, ConfigBase):
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
    _target_: str = "torchrl_ext.presets.harl_rollout_buffer"


@dataclass
class NStepSamplerConfig(_Validated, SamplerConfig):
    n_step: int = 1
    gamma: float = 0.99
    reward_key: Any = ("next", "reward")
    done_key: Any = ("next", "done")
    agent_group: Optional[str] = None
    _target_: str = "torchrl_ext.samplers.NStepSampler"


@dataclass
class HarlOffPolicyBufferConfig(_Validated, ConfigBase):
    buffer_size: int = 1_000_000
    n_rollout_threads: int = 1
    batch_size: Optional[int] = None
    n_step: int = 1
    gamma: float = 0.99
    state_type: str = "EP"
    agent_group: str = "agents"
    device: str = "cpu"
    _target_: str = "torchrl_ext.presets.harl_off_policy_buffer"


@dataclass
class FastTensorStorageConfig(LazyTensorStorageConfig):
    _target_: str = "torchrl_ext.storages.FastTensorStorage"


@dataclass
class FastMemmapStorageConfig(LazyMemmapStorageConfig):
    _target_: str = "torchrl_ext.storages.FastMemmapStorage"


@dataclass
class ExtTensorDictReplayBufferConfig(TensorDictReplayBufferConfig):
    _target_: str = "torchrl_ext.replay_buffers.TensorDictReplayBuffer"


@dataclass
class OnPolicyReplayBufferConfig(_Validated, ConfigBase):
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
    _target_: str = "torchrl_ext.replay_buffers.OnPolicyReplayBuffer"


@dataclass
class VTraceReplayBufferConfig(OnPolicyReplayBufferConfig):
    rho_thresh: float = 1.0
    c_thresh: float = 1.0
    advantage_eps: float = 1e-8
    _target_: str = "torchrl_ext.replay_buffers.VTraceReplayBuffer"


@dataclass
class PytorchrlOnPolicyBufferConfig(_Validated, ConfigBase):
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
    _target_: str = "torchrl_ext.presets.pytorchrl_on_policy_buffer"


@dataclass
class L2RPPOBufferConfig(_Validated, ConfigBase):
    obs_dim: int = 1
    act_dim: int = 1
    size: int = 1000
    batch_size: int = 64
    gamma: float = 0.99
    lam: float = 0.95
    eps: float = 1e-3
    device: str = "cpu"
    _target_: str = "torchrl_ext.presets.l2r_ppo_buffer"


@dataclass
class L2RSimpleReplayBufferConfig(_Validated, ConfigBase):
    obs_dim: int = 1
    act_dim: int = 1
    size: int = 1000
    batch_size: int = 64
    device: str = "cpu"
    _target_: str = "torchrl_ext.presets.l2r_simple_replay_buffer"


@dataclass
class VeloraReplayBufferConfig(_Validated, ConfigBase):
    capacity: int = 100_000
    state_dim: int = 1
    action_dim: int = 1
    hidden_dim: int = 1
    device: Optional[str] = None
    batch_size: Optional[int] = None
    keys: Optional[Any] = None
    _target_: str = "torchrl_ext.presets.velora_replay_buffer"


_REGISTRY = {
    ("storage", "ext_env_ring"): EnvRingStorageConfig,
    ("storage", "ext_episodic_env_ring"): EpisodicEnvRingStorageConfig,
    ("storage", "ext_dedup_env_ring"): DedupEnvRingStorageConfig,
    ("writer", "ext_env_ring"): EnvRingWriterConfig,
    ("sampler", "ext_trajectory"): TrajectorySamplerConfig,
    ("sampler", "ext_prioritized_trajectory"): PrioritizedTrajectorySamplerConfig,
    ("replay_buffer", "ext_env_ring"): EnvRingReplayBufferConfig,
    ("replay_buffer", "ext_alf"): AlfReplayBufferConfig,
    ("storage", "ext_rollout"): RolloutStorageConfig,
    ("sampler", "ext_feed_forward"): FeedForwardMinibatchSamplerConfig,
    ("sampler", "ext_naive_recurrent"): NaiveRecurrentMinibatchSamplerConfig,
    ("sampler", "ext_chunked_recurrent"): ChunkedRecurrentMinibatchSamplerConfig,
    ("replay_buffer", "ext_harl"): HarlRolloutBufferConfig,
    ("sampler", "ext_nstep"): NStepSamplerConfig,
    ("replay_buffer", "ext_harl_off_policy"): HarlOffPolicyBufferConfig,
    ("storage", "ext_fast_tensor"): FastTensorStorageConfig,
    ("storage", "ext_fast_memmap"): FastMemmapStorageConfig,
    ("replay_buffer", "ext_tensordict"): ExtTensorDictReplayBufferConfig,
    ("replay_buffer", "ext_on_policy"): OnPolicyReplayBufferConfig,
    ("replay_buffer", "ext_vtrace_on_policy"): VTraceReplayBufferConfig,
    ("replay_buffer", "ext_pytorchrl"): PytorchrlOnPolicyBufferConfig,
    ("replay_buffer", "ext_l2r_ppo"): L2RPPOBufferConfig,
    ("replay_buffer", "ext_l2r_simple_replay"): L2RSimpleReplayBufferConfig,
    ("replay_buffer", "ext_velora"): VeloraReplayBufferConfig,
}


def register_configs() -> None:
    """Stores every config above in TorchRL's ConfigStore groups (idempotent)."""
    store = ConfigStore.instance()
    for (group, name), node in _REGISTRY.items():
        store.store(group=group, name=name, node=node)


register_configs()
