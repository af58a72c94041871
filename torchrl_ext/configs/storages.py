"""Configs of the storages and writers (groups ``storage`` and ``writer``)."""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.data import (
    LazyMemmapStorageConfig,
    LazyTensorStorageConfig,
    StorageConfig,
    WriterConfig,
)

from torchrl_ext.configs._base import Validated, from_signature

__all__ = [
    "DedupEnvRingStorageConfig",
    "EnvRingStorageConfig",
    "EnvRingWriterConfig",
    "EpisodicEnvRingStorageConfig",
    "FastMemmapStorageConfig",
    "FastTensorStorageConfig",
    "RolloutStorageConfig",
    "RolloutWriterConfig",
]


@from_signature("torchrl_ext.storages.EnvRingStorage", num_envs=1, max_length=1024)
class EnvRingStorageConfig(Validated, StorageConfig):
    """Config of ``EnvRingStorage`` (``storage: ext_env_ring``): its arguments, with its defaults."""


@from_signature("torchrl_ext.storages.EpisodicEnvRingStorage", num_envs=1, max_length=1024)
class EpisodicEnvRingStorageConfig(Validated, StorageConfig):
    """Config of ``EpisodicEnvRingStorage`` (``storage: ext_episodic_env_ring``): its arguments, with its defaults."""


# No step_type_key: the storage finds episode ends from done_key.
@from_signature("torchrl_ext.storages.DedupEnvRingStorage", exclude=("step_type_key",), num_envs=1, max_length=1024)
class DedupEnvRingStorageConfig(Validated, StorageConfig):
    """Config of ``DedupEnvRingStorage`` (``storage: ext_dedup_env_ring``): its arguments, with its defaults."""


@from_signature("torchrl_ext.storages.RolloutStorage", num_steps=128)
class RolloutStorageConfig(Validated, StorageConfig):
    """Config of ``RolloutStorage`` (``storage: ext_rollout``): its arguments, with its defaults."""


@from_signature("torchrl_ext.storages.FastTensorStorage")
class FastTensorStorageConfig(LazyTensorStorageConfig):
    """Config of ``FastTensorStorage`` (``storage: ext_fast_tensor``): its arguments, with its defaults."""


@from_signature("torchrl_ext.storages.FastMemmapStorage")
class FastMemmapStorageConfig(LazyMemmapStorageConfig):
    """Config of ``FastMemmapStorage`` (``storage: ext_fast_memmap``): its arguments, with its defaults."""


@from_signature("torchrl_ext.writers.EnvRingWriter")
class EnvRingWriterConfig(Validated, WriterConfig):
    """Config of ``EnvRingWriter`` (``writer: ext_env_ring``): its arguments, with its defaults."""


@from_signature("torchrl_ext.writers.RolloutWriter")
class RolloutWriterConfig(Validated, WriterConfig):
    """Config of ``RolloutWriter`` (``writer: ext_rollout``): its arguments, with its defaults."""
