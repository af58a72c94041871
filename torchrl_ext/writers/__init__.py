"""Writers: they decide where each written step goes; storages hold it."""
from torchrl_ext.writers.ring import EnvRingWriter

__all__ = ["EnvRingWriter"]
