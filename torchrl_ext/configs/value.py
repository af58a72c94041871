"""Configs of the value estimators (group ``value``) and normalizers (group ``value_normalizer``).

The estimators need networks, which a YAML file cannot hold: instantiate them
with ``_partial_: true`` and pass ``value_network=`` (and ``actor_network=``
for V-trace) when calling the result, or as keyword arguments of
``hydra.utils.instantiate``.
"""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated, from_signature

__all__ = [
    "GAEConfig",
    "IntrinsicRewardNormalizerConfig",
    "RunningMeanStdConfig",
    "TDLambdaConfig",
    "VTraceConfig",
    "ValueNormConfig",
]


@from_signature("torchrl_ext.value.GAE", gamma=0.99, lmbda=0.95, value_network=None)
class GAEConfig(Validated, ConfigBase):
    """Config of ``GAE`` (``value: ext_gae``): its arguments, with its defaults."""
    _partial_: bool = False


@from_signature("torchrl_ext.value.VTrace", gamma=0.99, actor_network=None, value_network=None)
class VTraceConfig(Validated, ConfigBase):
    """Config of ``VTrace`` (``value: ext_vtrace``): its arguments, with its defaults."""
    _partial_: bool = False


@from_signature("torchrl_ext.value.TDLambda", gamma=0.99, lmbda=0.95, value_network=None)
class TDLambdaConfig(Validated, ConfigBase):
    """Config of ``TDLambda`` (``value: ext_td_lambda``): its arguments, with its defaults."""
    _partial_: bool = False


@from_signature("torchrl_ext.value.ValueNorm", input_shape=1)
class ValueNormConfig(Validated, ConfigBase):
    """Config of ``ValueNorm`` (``value_normalizer: ext_value_norm``): its arguments, with its defaults."""


@from_signature("torchrl_ext.value.RunningMeanStd")
class RunningMeanStdConfig(Validated, ConfigBase):
    """Config of ``RunningMeanStd`` (``value_normalizer: ext_running_mean_std``): its arguments, with its defaults."""


@from_signature("torchrl_ext.value.IntrinsicRewardNormalizer", gamma=0.99)
class IntrinsicRewardNormalizerConfig(Validated, ConfigBase):
    """Config of ``IntrinsicRewardNormalizer`` (``value_normalizer: ext_intrinsic_reward``): its arguments, with its defaults."""
