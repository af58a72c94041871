"""Hydra structured configs for every public component, registered in TorchRL's ConfigStore on import.

One dataclass per public class (and per preset): ``_target_`` plus every
constructor argument with its default, read off the constructor's signature on
import (``configs/_base.py``). Each derives from TorchRL's config base of its
group, so it composes with TorchRL's own configs::

    defaults:
      - replay_buffer@replay_buffer: ext_alf          # the ALF preset, or:
      - storage@replay_buffer.storage: ext_env_ring
      - sampler@replay_buffer.sampler: ext_trajectory

Groups ``storage``, ``sampler``, ``writer``, ``replay_buffer`` and ``value`` are
TorchRL's; ``value_normalizer``, ``demos`` and ``checkpointer`` are torchrl_ext's
(TorchRL has no such groups). Every name starts with ``ext_``; the table at the end of
this docstring lists :data:`REGISTRY`, which maps each ``(group, name)`` to its config.

Required constructor arguments get a usable default (``num_envs=1``, ...) so
every node instantiates; dtypes are written as strings (``"float32"``).

Examples:
    >>> from hydra.utils import instantiate
    >>> from torchrl_ext.configs import NStepSamplerConfig
    >>> instantiate(NStepSamplerConfig(n_step=3, gamma=0.9))
    NStepSampler(n_step=3, gamma=0.9)
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from torchrl_ext.configs.extras import *  # noqa: F401,F403
from torchrl_ext.configs.presets import *  # noqa: F401,F403
from torchrl_ext.configs.replay_buffers import *  # noqa: F401,F403
from torchrl_ext.configs.samplers import *  # noqa: F401,F403
from torchrl_ext.configs.storages import *  # noqa: F401,F403
from torchrl_ext.configs.value import *  # noqa: F401,F403

#: ``(group, name) -> config dataclass``, everything :func:`register_configs` stores.
REGISTRY = {
    ("storage", "ext_env_ring"): EnvRingStorageConfig,
    ("storage", "ext_episodic_env_ring"): EpisodicEnvRingStorageConfig,
    ("storage", "ext_dedup_env_ring"): DedupEnvRingStorageConfig,
    ("storage", "ext_rollout"): RolloutStorageConfig,
    ("storage", "ext_fast_tensor"): FastTensorStorageConfig,
    ("storage", "ext_fast_memmap"): FastMemmapStorageConfig,
    ("writer", "ext_env_ring"): EnvRingWriterConfig,
    ("writer", "ext_rollout"): RolloutWriterConfig,
    ("sampler", "ext_trajectory"): TrajectorySamplerConfig,
    ("sampler", "ext_prioritized_trajectory"): PrioritizedTrajectorySamplerConfig,
    ("sampler", "ext_feed_forward"): FeedForwardMinibatchSamplerConfig,
    ("sampler", "ext_naive_recurrent"): NaiveRecurrentMinibatchSamplerConfig,
    ("sampler", "ext_chunked_recurrent"): ChunkedRecurrentMinibatchSamplerConfig,
    ("sampler", "ext_nstep"): NStepSamplerConfig,
    ("sampler", "ext_prioritized_nstep"): PrioritizedNStepSamplerConfig,
    ("sampler", "ext_prioritized"): PrioritizedSamplerConfig,
    ("sampler", "ext_prioritized_without_replacement"): PrioritizedSamplerWithoutReplacementConfig,
    ("sampler", "ext_distinct_uniform"): DistinctUniformSamplerConfig,
    ("replay_buffer", "ext_tensordict"): ExtTensorDictReplayBufferConfig,
    ("replay_buffer", "ext_prioritized_replay"): PrioritizedReplayBufferConfig,
    ("replay_buffer", "ext_env_ring"): EnvRingReplayBufferConfig,
    ("replay_buffer", "ext_on_policy"): OnPolicyReplayBufferConfig,
    ("replay_buffer", "ext_vtrace_on_policy"): VTraceReplayBufferConfig,
    ("replay_buffer", "ext_path_gae"): PathGAEReplayBufferConfig,
    ("replay_buffer", "ext_alf"): AlfReplayBufferConfig,
    ("replay_buffer", "ext_harl"): HarlRolloutBufferConfig,
    ("replay_buffer", "ext_harl_off_policy"): HarlOffPolicyBufferConfig,
    ("replay_buffer", "ext_pytorchrl"): PytorchrlOnPolicyBufferConfig,
    ("replay_buffer", "ext_l2r_ppo"): L2RPPOBufferConfig,
    ("replay_buffer", "ext_l2r_simple_replay"): L2RSimpleReplayBufferConfig,
    ("replay_buffer", "ext_velora"): VeloraReplayBufferConfig,
    ("value", "ext_gae"): GAEConfig,
    ("value", "ext_vtrace"): VTraceConfig,
    ("value", "ext_td_lambda"): TDLambdaConfig,
    ("value_normalizer", "ext_value_norm"): ValueNormConfig,
    ("value_normalizer", "ext_running_mean_std"): RunningMeanStdConfig,
    ("value_normalizer", "ext_intrinsic_reward"): IntrinsicRewardNormalizerConfig,
    ("demos", "ext_demo_store"): DemoStoreConfig,
    ("demos", "ext_demo_mixer"): DemoMixerConfig,
    ("demos", "ext_demo_dir_poller"): DemoDirPollerConfig,
    ("checkpointer", "ext_safetensors_checkpointer"): SafetensorsCheckpointerConfig,
    ("checkpointer", "ext_velora_checkpointer"): VeloraCheckpointerConfig,
    ("checkpointer", "ext_env_ring_checkpointer"): EnvRingStorageCheckpointerConfig,
}
__all__ = sorted([*(node.__name__ for node in REGISTRY.values()), "REGISTRY", "register_configs"])


def register_configs() -> None:
    """Stores every config of :data:`REGISTRY` in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    for (group, name), node in REGISTRY.items():
        store.store(group=group, name=name, node=node)


register_configs()
if __doc__:  # None under python -OO
    __doc__ += "\n".join(["", "Registered configs:", ""] + [
        f"* ``{group}`` / ``{name}``: :class:`{node.__name__}`" for (group, name), node in REGISTRY.items()
    ])
