"""Presets: factories that compose torchrl_ext components into an original library's buffer."""
from torchrl_ext.presets.alf import alf_replay_buffer
from torchrl_ext.presets.harl import harl_off_policy_buffer, harl_rollout_buffer
from torchrl_ext.presets.l2r import l2r_ppo_buffer, l2r_simple_replay_buffer
from torchrl_ext.presets.pytorchrl import pytorchrl_on_policy_buffer
from torchrl_ext.presets.velora import (
    VeloraReplayBuffer,
    load_velora_replay_buffer,
    velora_replay_buffer,
)

__all__ = [
    "VeloraReplayBuffer",
    "alf_replay_buffer",
    "harl_off_policy_buffer",
    "harl_rollout_buffer",
    "l2r_ppo_buffer",
    "l2r_simple_replay_buffer",
    "load_velora_replay_buffer",
    "pytorchrl_on_policy_buffer",
    "velora_replay_buffer",
]
