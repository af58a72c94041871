"""Configs of the storages and writers (groups ``storage`` and ``writer``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torchrl.trainers.algorithms.configs.data import (
    LazyMemmapStorageConfig,
    LazyTensorStorageConfig,
    StorageConfig,
    WriterConfig,
)

from torchrl_ext.configs._base import RecordedReturns, Validated

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


@dataclass
class _RingGeometry:
    """Arguments every per-env ring storage takes."""
    num_envs: int = 1
    max_length: int = 1024
    device: str = "cpu"
    time_major: Optional[bool] = None  # None: the storage class's default layout


@dataclass
class EnvRingStorageConfig(_RingGeometry, Validated, StorageConfig):
    """Config of ``EnvRingStorage`` (``storage: ext_env_ring``): its arguments, with its defaults."""
    checkpointer: Any = None
    _target_: str = "torchrl_ext.storages.EnvRingStorage"


@dataclass
class EpisodicEnvRingStorageConfig(_RingGeometry, RecordedReturns, Validated, StorageConfig):
    """Config of ``EpisodicEnvRingStorage`` (``storage: ext_episodic_env_ring``): its arguments, with its defaults."""
    step_type_key: Any = "step_type"
    _target_: str = "torchrl_ext.storages.EpisodicEnvRingStorage"


@dataclass
class DedupEnvRingStorageConfig(_RingGeometry, RecordedReturns, Validated, StorageConfig):
    """Config of ``DedupEnvRingStorage`` (``storage: ext_dedup_env_ring``): its arguments, with its defaults."""
    # No step_type_key: the storage finds episode ends from done_key.
    obs_key: Any = "observation"
    num_stack: int = 1
    stack_dim: int = 0
    padding: str = "reset"
    done_key: Any = ("next", "done")
    check_next: bool = True
    _target_: str = "torchrl_ext.storages.DedupEnvRingStorage"


@dataclass
class RolloutStorageConfig(Validated, StorageConfig):
    """Config of ``RolloutStorage`` (``storage: ext_rollout``): its arguments, with its defaults."""
    num_steps: int = 128
    carry_keys: Optional[Any] = None
    device: str = "cpu"
    _target_: str = "torchrl_ext.storages.RolloutStorage"


@dataclass
class FastTensorStorageConfig(LazyTensorStorageConfig):
    """Config of ``FastTensorStorage`` (``storage: ext_fast_tensor``): its arguments, with its defaults."""
    strict: bool = False
    _target_: str = "torchrl_ext.storages.FastTensorStorage"


@dataclass
class FastMemmapStorageConfig(LazyMemmapStorageConfig):
    """Config of ``FastMemmapStorage`` (``storage: ext_fast_memmap``): its arguments, with its defaults."""
    strict: bool = False
    _target_: str = "torchrl_ext.storages.FastMemmapStorage"


@dataclass
class EnvRingWriterConfig(Validated, WriterConfig):
    """Config of ``EnvRingWriter`` (``writer: ext_env_ring``): its arguments, with its defaults."""
    env_id_key: Any = "env_id"
    _target_: str = "torchrl_ext.writers.EnvRingWriter"


@dataclass
class RolloutWriterConfig(Validated, WriterConfig):
    """Config of ``RolloutWriter`` (``writer: ext_rollout``): its arguments, with its defaults."""
    compilable: bool = False
    _target_: str = "torchrl_ext.writers.RolloutWriter"
