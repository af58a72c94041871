"""Storages: they hold the data and gather it by index; they never decide order."""
from torchrl_ext.storages.dedup import DedupEnvRingStorage
from torchrl_ext.storages.episodes import EpisodicEnvRingStorage
from torchrl_ext.storages.fast import FastMemmapStorage, FastTensorStorage, StorageLayoutError, gather_rows
from torchrl_ext.storages.rollout import RolloutStorage
from torchrl_ext.storages.ring import EnvRingStorage, EnvRingStorageCheckpointer

__all__ = [
    "DedupEnvRingStorage",
    "EnvRingStorage",
    "EnvRingStorageCheckpointer",
    "EpisodicEnvRingStorage",
    "FastMemmapStorage",
    "FastTensorStorage",
    "RolloutStorage",
    "StorageLayoutError",
    "gather_rows",
]
