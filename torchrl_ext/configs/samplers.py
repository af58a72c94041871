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
    """Config of ``TrajectorySampler`` (``sampler: ext_trajectory``): its arguments, with its defaults."""
    batch_length: int = 1
    num_earliest_frames_ignored: int = 0
    with_replacement: bool = False
    recent_data_steps: int = 1
    recent_data_ratio: float = 0.0
    _target_: str = "torchrl_ext.samplers.TrajectorySampler"


@dataclass
class PrioritizedTrajectorySamplerConfig(TrajectorySamplerConfig):
    """Config of ``PrioritizedTrajectorySampler`` (``sampler: ext_prioritized_trajectory``): its arguments, with its defaults."""
    alpha: float = 1.0
    beta: float = 0.0
    eps: float = 0.0
    initial_priority: float = 1.0
    weights: str = "alf"
    _target_: str = "torchrl_ext.samplers.PrioritizedTrajectorySampler"


@dataclass
class FeedForwardMinibatchSamplerConfig(Validated, SamplerConfig):
    """Config of ``FeedForwardMinibatchSampler`` (``sampler: ext_feed_forward``): its arguments, with its defaults."""
    # The constructor's default is None with mini_batch_size None, which it rejects
    # (exactly one must be given): the config picks one minibatch per epoch.
    num_mini_batch: Optional[int] = 1
    mini_batch_size: Optional[int] = None
    shuffle: bool = True
    drop_last: bool = False
    _target_: str = "torchrl_ext.samplers.FeedForwardMinibatchSampler"


@dataclass
class NaiveRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    """Config of ``NaiveRecurrentMinibatchSampler`` (``sampler: ext_naive_recurrent``): its arguments, with its defaults."""
    _target_: str = "torchrl_ext.samplers.NaiveRecurrentMinibatchSampler"


@dataclass
class ChunkedRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    """Config of ``ChunkedRecurrentMinibatchSampler`` (``sampler: ext_chunked_recurrent``): its arguments, with its defaults."""
    data_chunk_length: int = 10
    _target_: str = "torchrl_ext.samplers.ChunkedRecurrentMinibatchSampler"


@dataclass
class NStepSamplerConfig(Validated, SamplerConfig):
    """Config of ``NStepSampler`` (``sampler: ext_nstep``): its arguments, with its defaults."""
    n_step: int = 1
    gamma: float = 0.99
    reward_key: Any = ("next", "reward")
    done_key: Any = ("next", "done")
    agent_group: Optional[str] = None
    _target_: str = "torchrl_ext.samplers.NStepSampler"


@dataclass
class DistinctUniformSamplerConfig(Validated, SamplerConfig):
    """Config of ``DistinctUniformSampler`` (``sampler: ext_distinct_uniform``): its arguments, with its defaults."""
    among: Any = None
    _target_: str = "torchrl_ext.samplers.DistinctUniformSampler"


@dataclass
class PrioritizedSamplerConfig(Validated, SamplerConfig):
    """Config of ``PrioritizedSampler`` (``sampler: ext_prioritized``): its arguments, with its defaults."""
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
    """Config of ``PrioritizedSamplerWithoutReplacement`` (``sampler: ext_prioritized_without_replacement``): its arguments, with its defaults."""
    _target_: str = "torchrl_ext.samplers.PrioritizedSamplerWithoutReplacement"


@dataclass
class PrioritizedNStepSamplerConfig(PrioritizedSamplerConfig, NStepSamplerConfig):
    """Config of ``PrioritizedNStepSampler`` (``sampler: ext_prioritized_nstep``): its arguments, with its defaults."""
    _target_: str = "torchrl_ext.samplers.PrioritizedNStepSampler"
