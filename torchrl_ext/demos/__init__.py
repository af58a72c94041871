"""PPO+D demonstration bookkeeping (pytorchrl's ``PPODBuffer`` without the env side).

* :class:`DemoStore`: reward / value demo archives, thresholds, ``rho``/``phi`` annealing,
  capacity eviction, source and demo draws, per-env episode tracking.
* :class:`DemoMixer`: replays demos in place of env episodes in a stream of TorchRL steps.
* :mod:`torchrl_ext.demos.files`: demo ``.npz`` files (pytorchrl's format) and Minari episodes.
"""
from torchrl_ext.demos.files import (
    DemoDirPoller,
    load_demo,
    load_demo_dir,
    load_minari_demos,
    save_demo,
    save_top_demos,
)
from torchrl_ext.demos.mixer import DemoMixer
from torchrl_ext.demos.store import DemoStore, EpisodeOutcome, Source

__all__ = [
    "DemoDirPoller",
    "DemoMixer",
    "DemoStore",
    "EpisodeOutcome",
    "Source",
    "load_demo",
    "load_demo_dir",
    "load_minari_demos",
    "save_demo",
    "save_top_demos",
]
