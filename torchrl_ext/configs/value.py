"""Configs of the value estimators (group ``value``) and normalizers (group ``value_normalizer``).

The estimators need networks, which a YAML file cannot hold: instantiate them
with ``_partial_: true`` and pass ``value_network=`` (and ``actor_network=``
for V-trace) when calling the result, or as keyword arguments of
``hydra.utils.instantiate``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated

__all__ = [
    "GAEConfig",
    "IntrinsicRewardNormalizerConfig",
    "RunningMeanStdConfig",
    "TDLambdaConfig",
    "VTraceConfig",
    "ValueNormConfig",
]


@dataclass
class _EstimatorOptions:
    """TorchRL ``ValueEstimatorBase`` arguments shared by GAE and V-trace."""

    differentiable: bool = False
    skip_existing: Optional[bool] = None
    advantage_key: Any = None
    value_target_key: Any = None
    value_key: Any = None
    shifted: bool = False
    device: Optional[str] = None
    time_dim: Optional[int] = None
    value_chunk_size: Optional[int] = None
    num_chunks: Optional[int] = None
    num_chunk: Optional[int] = None
    value_chunk_dim: int = 0
    shifted_budget: int = 1
    group_key: Any = None


@dataclass
class GAEConfig(_EstimatorOptions, Validated, ConfigBase):
    """Config of ``GAE`` (``value: ext_gae``): its arguments, with its defaults."""
    gamma: float = 0.99
    lmbda: float = 0.95
    value_network: Any = None
    agent_dim: Optional[int] = None
    value_normalizer: Any = None
    average_gae: bool = False
    vectorized: Optional[bool] = None
    auto_reset_env: bool = False
    deactivate_vmap: bool = False
    _partial_: bool = False
    _target_: str = "torchrl_ext.value.GAE"


@dataclass
class VTraceConfig(_EstimatorOptions, Validated, ConfigBase):
    """Config of ``VTrace`` (``value: ext_vtrace``): its arguments, with its defaults."""
    gamma: float = 0.99
    actor_network: Any = None
    value_network: Any = None
    rho_thresh: float = 1.0
    c_thresh: float = 1.0
    average_adv: bool = False
    _partial_: bool = False
    _target_: str = "torchrl_ext.value.VTrace"


@dataclass
class TDLambdaConfig(_EstimatorOptions, Validated, ConfigBase):
    """Config of ``TDLambda`` (``value: ext_td_lambda``): its arguments, with its defaults."""
    gamma: float = 0.99
    lmbda: float = 0.95
    value_network: Any = None
    average_rewards: bool = False
    vectorized: bool = True
    deactivate_vmap: bool = False
    _partial_: bool = False
    _target_: str = "torchrl_ext.value.TDLambda"


@dataclass
class ValueNormConfig(Validated, ConfigBase):
    """Config of ``ValueNorm`` (``value_normalizer: ext_value_norm``): its arguments, with its defaults."""
    input_shape: Any = 1
    norm_axes: int = 1
    beta: float = 0.99999
    per_element_update: bool = False
    epsilon: float = 1e-5
    device: Optional[str] = None
    dtype: str = "float32"
    _target_: str = "torchrl_ext.value.ValueNorm"


@dataclass
class RunningMeanStdConfig(Validated, ConfigBase):
    """Config of ``RunningMeanStd`` (``value_normalizer: ext_running_mean_std``): its arguments, with its defaults."""
    shape: Any = ()
    epsilon: float = 1e-4
    device: Optional[str] = None
    _target_: str = "torchrl_ext.value.RunningMeanStd"


@dataclass
class IntrinsicRewardNormalizerConfig(Validated, ConfigBase):
    """Config of ``IntrinsicRewardNormalizer`` (``value_normalizer: ext_intrinsic_reward``): its arguments, with its defaults."""
    gamma: float = 0.99
    mode: str = "backward"
    epsilon: float = 1e-4
    device: Optional[str] = None
    _target_: str = "torchrl_ext.value.IntrinsicRewardNormalizer"
