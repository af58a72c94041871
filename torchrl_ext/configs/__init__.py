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

:data:`REGISTRY` maps each ``(group, name)`` to its config; the table at the end of this
docstring is built from it.

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

from torchrl_ext.configs import extras, presets, replay_buffers, samplers, storages, value

#: ``(group, name) -> config dataclass``, everything :func:`register_configs` stores.
REGISTRY = {**storages.REGISTRY, **samplers.REGISTRY, **replay_buffers.REGISTRY, **presets.REGISTRY,
            **value.REGISTRY, **extras.REGISTRY}
globals().update({node.__name__: node for node in REGISTRY.values()})
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
