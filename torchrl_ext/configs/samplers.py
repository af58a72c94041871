"""Configs of the samplers (group ``sampler``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.data import SamplerConfig

from torchrl_ext.configs._base import Validated

__all__ = [
    "ChunkedRecurrentMinibatchSamplerConfig",
    "DistinctUniformSamplerConfig",
    "FeedForwardMinibatchSamplerConfig",
    "NaiveRecurrentMinibatchSamplerConfig",
    "NStepSamplerConfig",
    "PrioritizedNStepSamplerConfig",
    "PrioritizedSamplerConfig",
    "PrioritizedSamplerWithoutReplacementConfig",
    "PrioritizedTrajectorySamplerConfig",
    "TrajectorySamplerConfig",
]


@dataclass
class TrajectorySamplerConfig(Validated, SamplerConfig):
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
class FeedForwardMinibatchSamplerConfig(Validated, SamplerConfig):
    # The constructor's default is None with mini_batch_size None, which it rejects
    # (exactly one must be given): the config picks one minibatch per epoch.
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
class NStepSamplerConfig(Validated, SamplerConfig):
    n_step: int = 1
    gamma: float = 0.99
    reward_key: Any = ("next", "reward")
    done_key: Any = ("next", "done")
    agent_group: Optional[str] = None
    _target_: str = "torchrl_ext.samplers.NStepSampler"


@dataclass
class DistinctUniformSamplerConfig(Validated, SamplerConfig):
    among: Any = None
    _target_: str = "torchrl_ext.samplers.DistinctUniformSampler"


@dataclass
class PrioritizedSamplerConfig(Validated, SamplerConfig):
    max_capacity: int = 1_000_000
    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-8
    dtype: str = "float32"
    reduction: str = "max"
    max_priority_within_buffer: bool = False
    device: Optional[str] = None
    initial_priority: float = 1.0
    weights: str = "per"
    fanout: int = 32
    _target_: str = "torchrl_ext.samplers.PrioritizedSampler"


@dataclass
class PrioritizedSamplerWithoutReplacementConfig(PrioritizedSamplerConfig):
    _target_: str = "torchrl_ext.samplers.PrioritizedSamplerWithoutReplacement"


@dataclass
class PrioritizedNStepSamplerConfig(PrioritizedSamplerConfig):
    n_step: int = 1
    gamma: float = 0.99
    reward_key: Any = ("next", "reward")
    done_key: Any = ("next", "done")
    agent_group: Optional[str] = None
    _target_: str = "torchrl_ext.samplers.PrioritizedNStepSampler"
