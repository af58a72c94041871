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
from torchrl_ext.samplers.prioritized_trajectory import PrioritizedTrajectorySampler
from torchrl_ext.samplers.trajectory import TrajectorySampler

__all__ = [
    "ChunkedRecurrentMinibatchSampler",
    "FeedForwardMinibatchSampler",
    "NaiveRecurrentMinibatchSampler",
    "NStepSampler",
    "PrioritizedSampler",
    "PrioritizedSamplerWithoutReplacement",
    "PrioritizedTrajectorySampler",
    "TrajectorySampler",
]
