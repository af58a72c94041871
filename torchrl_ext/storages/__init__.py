"""Storages: they hold the data and gather it by index; they never decide order."""
from torchrl_ext.storages.dedup import DedupEnvRingStorage
from torchrl_ext.storages.episodes import EpisodicEnvRingStorage
from torchrl_ext.storages._output_memory import OutputRecycler, output_recycler
from torchrl_ext.storages._streaming import StreamingWrites, streaming_writes
from torchrl_ext.storages.fast import FastMemmapStorage, FastTensorStorage, gather_rows
from torchrl_ext.storages.rollout import RolloutStorage
from torchrl_ext.storages.ring import EnvRingStorage, EnvRingStorageCheckpointer

__all__ = [
    "DedupEnvRingStorage",
    "EnvRingStorage",
    "EnvRingStorageCheckpointer",
    "EpisodicEnvRingStorage",
    "FastMemmapStorage",
    "FastTensorStorage",
    "OutputRecycler",
    "RolloutStorage",
    "StreamingWrites",
    "gather_rows",
    "output_recycler",
    "streaming_writes",
]
