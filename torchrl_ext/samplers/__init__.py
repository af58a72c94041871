"""Samplers: they pick indices (and attach info such as importance weights)."""
from torchrl_ext.samplers.minibatch import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
)
from torchrl_ext.samplers.nstep import NStepSampler
from torchrl_ext.samplers.prioritized import (
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
)
from torchrl_ext.samplers.prioritized_nstep import PrioritizedNStepSampler
from torchrl_ext.samplers.prioritized_trajectory import PrioritizedTrajectorySampler
from torchrl_ext.samplers.trajectory import TrajectorySampler
from torchrl_ext.samplers.uniform import DistinctUniformSampler

__all__ = [
    "ChunkedRecurrentMinibatchSampler",
    "DistinctUniformSampler",
    "FeedForwardMinibatchSampler",
    "NaiveRecurrentMinibatchSampler",
    "NStepSampler",
    "PrioritizedNStepSampler",
    "PrioritizedSampler",
    "PrioritizedSamplerWithoutReplacement",
    "PrioritizedTrajectorySampler",
    "TrajectorySampler",
]
