"""torchrl_ext: replay-buffer and value-estimation components for TorchRL.

Importing the package registers its value estimators in TorchRL's
value-estimator registry (``ext_gae``, ``ext_vtrace``).
It also registers its Hydra configs in TorchRL's ConfigStore groups (see
:mod:`torchrl_ext.configs`).
"""
from torchrl_ext._fastpath import fastpath, fastpath_enabled, set_fastpath
from torchrl_ext.replay_buffers import (
    EnvRingReplayBuffer,
    PrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl_ext.samplers import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
    NStepSampler,
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
    PrioritizedTrajectorySampler,
    TrajectorySampler,
)
from torchrl_ext.segment_tree import MaxSegmentTree, MinSegmentTree, SumSegmentTree
from torchrl_ext.storages import (
    DedupEnvRingStorage,
    EnvRingStorage,
    EpisodicEnvRingStorage,
    FastMemmapStorage,
    FastTensorStorage,
    RolloutStorage,
)
from torchrl_ext.writers import EnvRingWriter
from torchrl_ext.value import (
    GAE,
    ExtValueEstimators,
    IntrinsicRewardNormalizer,
    RunningMeanStd,
    ValueNorm,
    VTrace,
)

from torchrl_ext import configs  # noqa: E402  (registers the Hydra configs)
from torchrl_ext.presets import (  # noqa: E402
    alf_replay_buffer,
    harl_off_policy_buffer,
    harl_rollout_buffer,
    l2r_ppo_buffer,
    l2r_simple_replay_buffer,
    pytorchrl_on_policy_buffer,
    velora_replay_buffer,
)
from torchrl_ext.io import SafetensorsCheckpointer, VeloraCheckpointer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ChunkedRecurrentMinibatchSampler",
    "FeedForwardMinibatchSampler",
    "NaiveRecurrentMinibatchSampler",
    "NStepSampler",
    "RolloutStorage",
    "DedupEnvRingStorage",
    "EnvRingReplayBuffer",
    "EnvRingStorage",
    "EnvRingWriter",
    "EpisodicEnvRingStorage",
    "ExtValueEstimators",
    "FastMemmapStorage",
    "FastTensorStorage",
    "GAE",
    "IntrinsicRewardNormalizer",
    "MaxSegmentTree",
    "MinSegmentTree",
    "PrioritizedReplayBuffer",
    "PrioritizedSampler",
    "PrioritizedSamplerWithoutReplacement",
    "PrioritizedTrajectorySampler",
    "RunningMeanStd",
    "SumSegmentTree",
    "TensorDictReplayBuffer",
    "TrajectorySampler",
    "VTrace",
    "ValueNorm",
    "__version__",
    "alf_replay_buffer",
    "harl_off_policy_buffer",
    "harl_rollout_buffer",
    "l2r_ppo_buffer",
    "l2r_simple_replay_buffer",
    "pytorchrl_on_policy_buffer",
    "velora_replay_buffer",
    "SafetensorsCheckpointer",
    "VeloraCheckpointer",
    "configs",
    "fastpath",
    "fastpath_enabled",
    "set_fastpath",
]
