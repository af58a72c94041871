"""Configs of the demonstration components (group ``demos``) and checkpointers (group ``checkpointer``)."""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated, from_signature

__all__ = [
    "DemoDirPollerConfig",
    "DemoMixerConfig",
    "DemoStoreConfig",
    "EnvRingStorageCheckpointerConfig",
    "SafetensorsCheckpointerConfig",
    "VeloraCheckpointerConfig",
]


@from_signature("torchrl_ext.demos.DemoStore")
class DemoStoreConfig(Validated, ConfigBase):
    """Config of ``DemoStore`` (``demos: ext_demo_store``): its arguments, with its defaults."""


# store: a DemoStore (or a DemoStoreConfig node).
@from_signature("torchrl_ext.demos.DemoMixer", store=None, num_envs=1)
class DemoMixerConfig(Validated, ConfigBase):
    """Config of ``DemoMixer`` (``demos: ext_demo_mixer``): its arguments, with its defaults."""


@from_signature("torchrl_ext.demos.DemoDirPoller", store=None, directory="supplementary_demos")
class DemoDirPollerConfig(Validated, ConfigBase):
    """Config of ``DemoDirPoller`` (``demos: ext_demo_dir_poller``): its arguments, with its defaults."""


@from_signature("torchrl_ext.io.SafetensorsCheckpointer")
class SafetensorsCheckpointerConfig(Validated, ConfigBase):
    """Config of ``SafetensorsCheckpointer`` (``checkpointer: ext_safetensors_checkpointer``): its arguments, with its defaults."""


@from_signature("torchrl_ext.io.VeloraCheckpointer")
class VeloraCheckpointerConfig(Validated, ConfigBase):
    """Config of ``VeloraCheckpointer`` (``checkpointer: ext_velora_checkpointer``): its arguments, with its defaults."""


@from_signature("torchrl_ext.storages.EnvRingStorageCheckpointer")
class EnvRingStorageCheckpointerConfig(Validated, ConfigBase):
    """Config of ``EnvRingStorageCheckpointer`` (``checkpointer: ext_env_ring_checkpointer``): its arguments, with its defaults."""
