"""Configs of the demonstration components (group ``demos``) and checkpointers (group ``checkpointer``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated

__all__ = [
    "DemoDirPollerConfig",
    "DemoMixerConfig",
    "DemoStoreConfig",
    "EnvRingStorageCheckpointerConfig",
    "SafetensorsCheckpointerConfig",
    "VeloraCheckpointerConfig",
]


@dataclass
class DemoStoreConfig(Validated, ConfigBase):
    """Config of ``DemoStore`` (``demos: ext_demo_store``): its arguments, with its defaults."""
    rho: float = 0.1
    phi: float = 0.3
    alpha: float = 10.0
    capacity: int = 51
    initial_reward_threshold: Optional[float] = None
    num_demos_to_save: int = 10
    generator: Any = None
    device: str = "cpu"
    id_factory: Any = None
    _target_: str = "torchrl_ext.demos.DemoStore"


@dataclass
class DemoMixerConfig(Validated, ConfigBase):
    """Config of ``DemoMixer`` (``demos: ext_demo_mixer``): its arguments, with its defaults."""
    store: Any = None  # a DemoStore (or a DemoStoreConfig node)
    num_envs: int = 1
    observation_key: Any = "observation"
    action_key: Any = "action"
    log_prob_key: Any = "action_log_prob"
    value_key: Any = "state_value"
    reward_key: Any = "reward"
    done_key: Any = "done"
    terminated_key: Any = "terminated"
    truncated_key: Any = "truncated"
    _target_: str = "torchrl_ext.demos.DemoMixer"


@dataclass
class DemoDirPollerConfig(Validated, ConfigBase):
    """Config of ``DemoDirPoller`` (``demos: ext_demo_dir_poller``): its arguments, with its defaults."""
    store: Any = None  # a DemoStore (or a DemoStoreConfig node)
    directory: str = "supplementary_demos"
    frame_skip: Optional[int] = None
    _target_: str = "torchrl_ext.demos.DemoDirPoller"


@dataclass
class SafetensorsCheckpointerConfig(Validated, ConfigBase):
    """Config of ``SafetensorsCheckpointer`` (``checkpointer: ext_safetensors_checkpointer``): its arguments, with its defaults."""
    prefix: str = ""
    _target_: str = "torchrl_ext.io.SafetensorsCheckpointer"


@dataclass
class VeloraCheckpointerConfig(Validated, ConfigBase):
    """Config of ``VeloraCheckpointer`` (``checkpointer: ext_velora_checkpointer``): its arguments, with its defaults."""
    prefix: str = "buffer_"
    keys: Optional[Any] = None
    _target_: str = "torchrl_ext.io.VeloraCheckpointer"


@dataclass
class EnvRingStorageCheckpointerConfig(Validated, ConfigBase):
    """Config of ``EnvRingStorageCheckpointer`` (``checkpointer: ext_env_ring_checkpointer``): its arguments, with its defaults."""
    _target_: str = "torchrl_ext.storages.EnvRingStorageCheckpointer"
