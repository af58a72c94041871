"""Hydra structured configs for every public component, registered in TorchRL's ConfigStore on import.

One dataclass per public class (and per preset): ``_target_`` plus every
constructor argument with its default (a test compares them with
``inspect.signature``). Each derives from TorchRL's config base of its group,
so it composes with TorchRL's own configs::

    defaults:
      - replay_buffer@replay_buffer: ext_alf          # the ALF preset, or:
      - storage@replay_buffer.storage: ext_env_ring
      - sampler@replay_buffer.sampler: ext_trajectory

Groups ``storage``, ``sampler``, ``writer``, ``replay_buffer`` and ``value`` are
TorchRL's; ``value_normalizer``, ``demos`` and ``checkpointer`` are torchrl_ext's
(TorchRL has no such groups). Every name starts with ``ext_``:

==================== ================================ ==============================================
group                name                             target
==================== ================================ ==============================================
``storage``          ``ext_env_ring``                 :class:`~torchrl_ext.storages.EnvRingStorage`
``storage``          ``ext_episodic_env_ring``        :class:`~torchrl_ext.storages.EpisodicEnvRingStorage`
``storage``          ``ext_dedup_env_ring``           :class:`~torchrl_ext.storages.DedupEnvRingStorage`
``storage``          ``ext_rollout``                  :class:`~torchrl_ext.storages.RolloutStorage`
``storage``          ``ext_fast_tensor``              :class:`~torchrl_ext.storages.FastTensorStorage`
``storage``          ``ext_fast_memmap``              :class:`~torchrl_ext.storages.FastMemmapStorage`
``writer``           ``ext_env_ring``                 :class:`~torchrl_ext.writers.EnvRingWriter`
``writer``           ``ext_rollout``                  :class:`~torchrl_ext.writers.RolloutWriter`
``sampler``          ``ext_trajectory``               :class:`~torchrl_ext.samplers.TrajectorySampler`
``sampler``          ``ext_prioritized_trajectory``   :class:`~torchrl_ext.samplers.PrioritizedTrajectorySampler`
``sampler``          ``ext_feed_forward``             :class:`~torchrl_ext.samplers.FeedForwardMinibatchSampler`
``sampler``          ``ext_naive_recurrent``          :class:`~torchrl_ext.samplers.NaiveRecurrentMinibatchSampler`
``sampler``          ``ext_chunked_recurrent``        :class:`~torchrl_ext.samplers.ChunkedRecurrentMinibatchSampler`
``sampler``          ``ext_nstep``                    :class:`~torchrl_ext.samplers.NStepSampler`
``sampler``          ``ext_prioritized_nstep``        :class:`~torchrl_ext.samplers.PrioritizedNStepSampler`
``sampler``          ``ext_prioritized``              :class:`~torchrl_ext.samplers.PrioritizedSampler`
``sampler``          ``ext_prioritized_without_replacement`` :class:`~torchrl_ext.samplers.PrioritizedSamplerWithoutReplacement`
``sampler``          ``ext_distinct_uniform``         :class:`~torchrl_ext.samplers.DistinctUniformSampler`
``replay_buffer``    ``ext_tensordict``               :class:`~torchrl_ext.replay_buffers.TensorDictReplayBuffer`
``replay_buffer``    ``ext_prioritized_replay``       :class:`~torchrl_ext.replay_buffers.PrioritizedReplayBuffer`
``replay_buffer``    ``ext_env_ring``                 :class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer`
``replay_buffer``    ``ext_on_policy``                :class:`~torchrl_ext.replay_buffers.OnPolicyReplayBuffer`
``replay_buffer``    ``ext_vtrace_on_policy``         :class:`~torchrl_ext.replay_buffers.VTraceReplayBuffer`
``replay_buffer``    ``ext_path_gae``                 :class:`~torchrl_ext.replay_buffers.PathGAEReplayBuffer`
``replay_buffer``    ``ext_alf``                      :func:`~torchrl_ext.presets.alf_replay_buffer`
``replay_buffer``    ``ext_harl``                     :func:`~torchrl_ext.presets.harl_rollout_buffer`
``replay_buffer``    ``ext_harl_off_policy``          :func:`~torchrl_ext.presets.harl_off_policy_buffer`
``replay_buffer``    ``ext_pytorchrl``                :func:`~torchrl_ext.presets.pytorchrl_on_policy_buffer`
``replay_buffer``    ``ext_l2r_ppo``                  :func:`~torchrl_ext.presets.l2r_ppo_buffer`
``replay_buffer``    ``ext_l2r_simple_replay``        :func:`~torchrl_ext.presets.l2r_simple_replay_buffer`
``replay_buffer``    ``ext_velora``                   :func:`~torchrl_ext.presets.velora_replay_buffer`
``value``            ``ext_gae``                      :class:`~torchrl_ext.value.GAE`
``value``            ``ext_vtrace``                   :class:`~torchrl_ext.value.VTrace`
``value_normalizer`` ``ext_value_norm``               :class:`~torchrl_ext.value.ValueNorm`
``value_normalizer`` ``ext_running_mean_std``         :class:`~torchrl_ext.value.RunningMeanStd`
``value_normalizer`` ``ext_intrinsic_reward``         :class:`~torchrl_ext.value.IntrinsicRewardNormalizer`
``demos``            ``ext_demo_store``               :class:`~torchrl_ext.demos.DemoStore`
``demos``            ``ext_demo_mixer``               :class:`~torchrl_ext.demos.DemoMixer`
``checkpointer``     ``ext_safetensors_checkpointer`` :class:`~torchrl_ext.io.SafetensorsCheckpointer`
``checkpointer``     ``ext_velora_checkpointer``      :class:`~torchrl_ext.io.VeloraCheckpointer`
``checkpointer``     ``ext_env_ring_checkpointer``    :class:`~torchrl_ext.storages.EnvRingStorageCheckpointer`
==================== ================================ ==============================================

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
from torchrl_ext.configs.extras import __all__ as _extras
from torchrl_ext.configs.presets import *  # noqa: F401,F403
from torchrl_ext.configs.presets import __all__ as _presets
from torchrl_ext.configs.replay_buffers import *  # noqa: F401,F403
from torchrl_ext.configs.replay_buffers import __all__ as _replay_buffers
from torchrl_ext.configs.samplers import *  # noqa: F401,F403
from torchrl_ext.configs.samplers import __all__ as _samplers
from torchrl_ext.configs.storages import *  # noqa: F401,F403
from torchrl_ext.configs.storages import __all__ as _storages
from torchrl_ext.configs.value import *  # noqa: F401,F403
from torchrl_ext.configs.value import __all__ as _value

__all__ = sorted([*_extras, *_presets, *_replay_buffers, *_samplers, *_storages, *_value, "REGISTRY",
                  "register_configs"])

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


def register_configs() -> None:
    """Stores every config of :data:`REGISTRY` in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    for (group, name), node in REGISTRY.items():
        store.store(group=group, name=name, node=node)


register_configs()
