"""Configs of the presets: the originals' buffer constructors (group ``replay_buffer``)."""
from __future__ import annotations

from torchrl.trainers.algorithms.configs.common import ConfigBase

from torchrl_ext.configs._base import Validated, from_signature

__all__ = [
    "AlfReplayBufferConfig",
    "HarlOffPolicyBufferConfig",
    "HarlRolloutBufferConfig",
    "L2RPPOBufferConfig",
    "L2RSimpleReplayBufferConfig",
    "PytorchrlOnPolicyBufferConfig",
    "VeloraReplayBufferConfig",
]


@from_signature("torchrl_ext.presets.alf_replay_buffer", num_environments=1)
class AlfReplayBufferConfig(Validated, ConfigBase):
    """Config of ``alf_replay_buffer`` (``replay_buffer: ext_alf``): its arguments, with its defaults."""


@from_signature("torchrl_ext.presets.harl_rollout_buffer", episode_length=200)
class HarlRolloutBufferConfig(Validated, ConfigBase):
    """Config of ``harl_rollout_buffer`` (``replay_buffer: ext_harl``): its arguments, with its defaults."""


@from_signature("torchrl_ext.presets.harl_off_policy_buffer", buffer_size=1_000_000, n_rollout_threads=1)
class HarlOffPolicyBufferConfig(Validated, ConfigBase):
    """Config of ``harl_off_policy_buffer`` (``replay_buffer: ext_harl_off_policy``): its arguments, with its defaults."""


# The OnPolicyReplayBuffer arguments the preset forwards (**kwargs) are fields too, but for
# num_steps (the preset's size=) and advantage_eps: its default differs between GAE/vanilla
# (1e-5) and V-trace (1e-8); add it with `+advantage_eps=...`.
@from_signature("torchrl_ext.presets.pytorchrl_on_policy_buffer", size=128, exclude=("num_steps", "advantage_eps"),
                kwargs_to="torchrl_ext.replay_buffers.OnPolicyReplayBuffer")
class PytorchrlOnPolicyBufferConfig(Validated, ConfigBase):
    """Config of ``pytorchrl_on_policy_buffer`` (``replay_buffer: ext_pytorchrl``): its arguments, with its defaults."""


@from_signature("torchrl_ext.presets.l2r_simple_replay_buffer", obs_dim=1, act_dim=1, size=1000, batch_size=64)
class L2RSimpleReplayBufferConfig(Validated, ConfigBase):
    """Config of ``l2r_simple_replay_buffer`` (``replay_buffer: ext_l2r_simple_replay``): its arguments, with its defaults."""


@from_signature("torchrl_ext.presets.l2r_ppo_buffer")
class L2RPPOBufferConfig(L2RSimpleReplayBufferConfig):
    """Config of ``l2r_ppo_buffer`` (``replay_buffer: ext_l2r_ppo``): its arguments, with its defaults."""


@from_signature("torchrl_ext.presets.velora_replay_buffer", capacity=100_000, state_dim=1, action_dim=1, hidden_dim=1)
class VeloraReplayBufferConfig(Validated, ConfigBase):
    """Config of ``velora_replay_buffer`` (``replay_buffer: ext_velora``): its arguments, with its defaults."""
