"""Configs of the samplers (group ``sampler``)."""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.data import SamplerConfig

from torchrl_ext.configs._base import Validated, from_signature

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


@from_signature("torchrl_ext.samplers.TrajectorySampler")
class TrajectorySamplerConfig(Validated, SamplerConfig):
    """Config of ``TrajectorySampler`` (``sampler: ext_trajectory``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.PrioritizedTrajectorySampler")
class PrioritizedTrajectorySamplerConfig(TrajectorySamplerConfig):
    """Config of ``PrioritizedTrajectorySampler`` (``sampler: ext_prioritized_trajectory``): its arguments, with its defaults."""


# The minibatch samplers' num_mini_batch defaults to None with mini_batch_size None, which
# they reject (exactly one must be given): the configs pick one minibatch per epoch.
@from_signature("torchrl_ext.samplers.FeedForwardMinibatchSampler", num_mini_batch=1)
class FeedForwardMinibatchSamplerConfig(Validated, SamplerConfig):
    """Config of ``FeedForwardMinibatchSampler`` (``sampler: ext_feed_forward``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.NaiveRecurrentMinibatchSampler", num_mini_batch=1)
class NaiveRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    """Config of ``NaiveRecurrentMinibatchSampler`` (``sampler: ext_naive_recurrent``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.ChunkedRecurrentMinibatchSampler", num_mini_batch=1, data_chunk_length=10)
class ChunkedRecurrentMinibatchSamplerConfig(FeedForwardMinibatchSamplerConfig):
    """Config of ``ChunkedRecurrentMinibatchSampler`` (``sampler: ext_chunked_recurrent``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.NStepSampler")
class NStepSamplerConfig(Validated, SamplerConfig):
    """Config of ``NStepSampler`` (``sampler: ext_nstep``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.DistinctUniformSampler")
class DistinctUniformSamplerConfig(Validated, SamplerConfig):
    """Config of ``DistinctUniformSampler`` (``sampler: ext_distinct_uniform``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.PrioritizedSampler", max_capacity=1_000_000, alpha=0.6, beta=0.4)
class PrioritizedSamplerConfig(Validated, SamplerConfig):
    """Config of ``PrioritizedSampler`` (``sampler: ext_prioritized``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.PrioritizedSamplerWithoutReplacement")
class PrioritizedSamplerWithoutReplacementConfig(PrioritizedSamplerConfig):
    """Config of ``PrioritizedSamplerWithoutReplacement`` (``sampler: ext_prioritized_without_replacement``): its arguments, with its defaults."""


@from_signature("torchrl_ext.samplers.PrioritizedNStepSampler")
class PrioritizedNStepSamplerConfig(PrioritizedSamplerConfig, NStepSamplerConfig):
    """Config of ``PrioritizedNStepSampler`` (``sampler: ext_prioritized_nstep``): its arguments, with its defaults."""
