"""Value estimation: pure functions, TorchRL estimator modules and normalizers."""
from torchrl_ext.value.estimators import GAE, ExtValueEstimators, VTrace
from torchrl_ext.value.functional import (
    discounted_cumsum,
    generalized_advantage_estimate,
    td_lambda_return_estimate,
    vtrace_advantage_estimate,
)
from torchrl_ext.value.losses import make_value_estimator
from torchrl_ext.value.td_lambda import TDLambda
from torchrl_ext.value.normalizers import (
    IntrinsicRewardNormalizer,
    RunningMeanStd,
    ValueNorm,
)

__all__ = [
    "ExtValueEstimators",
    "GAE",
    "IntrinsicRewardNormalizer",
    "RunningMeanStd",
    "TDLambda",
    "VTrace",
    "ValueNorm",
    "discounted_cumsum",
    "generalized_advantage_estimate",
    "make_value_estimator",
    "td_lambda_return_estimate",
    "vtrace_advantage_estimate",
]
