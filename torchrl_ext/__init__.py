"""torchrl_ext: replay-buffer and value-estimation components for TorchRL.

Importing the package registers its value estimators in TorchRL's
value-estimator registry (``ext_gae``, ``ext_vtrace``).
"""
from torchrl_ext.value import (
    GAE,
    ExtValueEstimators,
    IntrinsicRewardNormalizer,
    RunningMeanStd,
    ValueNorm,
    VTrace,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "ExtValueEstimators",
    "GAE",
    "IntrinsicRewardNormalizer",
    "RunningMeanStd",
    "VTrace",
    "ValueNorm",
    "__version__",
]
