"""Writers: they decide where each written step goes; storages hold it."""
from torchrl_ext.writers.ring import EnvRingWriter
from torchrl_ext.writers.rollout import RolloutWriter

__all__ = ["EnvRingWriter", "RolloutWriter"]
