"""Files: component state in safetensors + JSON, storage checkpointers, velora's buffer files,
whole-folder atomic saves."""
from torchrl_ext.io.atomic_dir import atomic_save_dir, committed_dir, verify_checkpoint
from torchrl_ext.io.checkpointer import SafetensorsCheckpointer
from torchrl_ext.io.state_files import atomic_write, load_state, save_state
from torchrl_ext.io.velora import (
    VELORA_KEYS,
    BatchExperience,
    VeloraCheckpointer,
    as_batch_experience,
    read_velora_metadata,
)

__all__ = [
    "VELORA_KEYS",
    "BatchExperience",
    "SafetensorsCheckpointer",
    "VeloraCheckpointer",
    "as_batch_experience",
    "atomic_save_dir",
    "atomic_write",
    "committed_dir",
    "load_state",
    "read_velora_metadata",
    "save_state",
    "verify_checkpoint",
]
