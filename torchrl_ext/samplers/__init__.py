"""Samplers: they pick indices (and attach info such as importance weights)."""
from torchrl_ext.samplers.prioritized import (
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
)

__all__ = ["PrioritizedSampler", "PrioritizedSamplerWithoutReplacement"]
