"""torchrl_ext buffers beyond one process: inside a Ray actor (:func:`ray_replay_buffer`, which
serves one call at a time, so no write is torn or lost), or shared by ``torch.multiprocessing``
``spawn`` processes (:func:`share_buffer`). ``docs/distributed.md`` has the details and the why.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer  # importable without ray
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as _TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter

from torchrl_ext import _compat
from torchrl_ext.samplers.prioritized import SHARING_REFUSED
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["BufferHost", "RayBuffer", "buffer_factory", "ray_replay_buffer", "share_buffer"]

#: Buffer methods a :class:`BufferHost` actor serves (Ray only routes methods the class defines).
FORWARDED = (
    "add", "append_transform", "clear", "dequeue", "dump", "dumps", "empty", "extend",
    "gather_all", "insert_transform", "load", "load_state_dict", "loads", "mark_update",
    "next", "read", "register_load_hook", "register_save_hook", "remove_up_to", "sample",
    "save", "set_rng", "set_sampler", "set_storage", "set_writer", "share", "state_dict",
    "stats", "synchronize", "update_if_present", "update_priority",
    "update_tensordict_priority", "update_window_priority",
    "__getitem__", "__len__", "__setitem__",
)


def buffer_factory(spec: Any) -> Callable[[], Any]:
    """A picklable zero-argument factory of a buffer (or of any component).

    Args:
        spec: a zero-argument callable (``functools.partial(alf_replay_buffer, 4)``,
            a class), a Hydra/OmegaConf config node or ``dict`` with ``_target_``
            (``cfg.buffer``), or a ``torchrl_ext.configs`` dataclass instance
            (``AlfReplayBufferConfig(...)``). Config nodes are resolved to plain
            containers here and instantiated by Hydra where the factory is called.

    Returns:
        A callable that builds the object; it pickles with ``cloudpickle`` (and
        with ``pickle`` when ``spec`` does).

    Raises:
        TypeError: if ``spec`` is none of these.
        ValueError: if a config has no ``_target_``.
    """
    is_node = isinstance(spec, DictConfig) or isinstance(spec, Mapping) and "_target_" in spec
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type) or is_node:
        node = OmegaConf.structured(spec) if dataclasses.is_dataclass(spec) else spec
        container = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
        if "_target_" not in container:
            raise ValueError(
                f"the config has no _target_ (keys: {sorted(container)}); give a node that "
                "Hydra can instantiate, e.g. cfg.buffer with _target_: torchrl_ext.presets."
                "alf_replay_buffer."
            )
        return functools.partial(instantiate, container)
    if callable(spec):
        return spec
    raise TypeError(
        f"spec must be a zero-argument factory (functools.partial, a class) or a config node "
        f"with _target_, got {type(spec).__name__}; e.g. functools.partial(alf_replay_buffer, 4)."
    )


# ----------------------------------------------------------------------
# Ray
class BufferHost:
    """The Ray actor class that owns one buffer built from a factory and serves its calls.

    TorchRL's ``RayReplayBuffer`` instantiates ``replay_buffer_cls`` inside an
    actor; a preset is a function, not a class, so this host builds whatever
    the factory returns and forwards the public buffer API to it (the names in
    :data:`FORWARDED`, plus :meth:`call` for any other public method).

    Args:
        factory: zero-argument callable returning a ``ReplayBuffer``.
        delayed_init: accepted for ``RayReplayBuffer``; the factory decides.
    """

    def __init__(self, factory: Callable[[], Any], delayed_init: bool = False) -> None:
        buffer = factory()
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(
                f"the factory must build a ReplayBuffer, got {type(buffer).__name__}; give a "
                "buffer class or preset (e.g. functools.partial(alf_replay_buffer, 4, 100))."
            )
        self.buffer = buffer

    @classmethod
    def as_remote(cls, remote_config: dict[str, Any] | None = None) -> Any:
        """``ray.remote(**remote_config)(cls)``, as ``ReplayBuffer.as_remote``."""
        import ray

        return ray.remote(**dict(remote_config or {"num_cpus": 0}))(cls)

    def _getattr(self, name: str) -> Any:
        return getattr(self.buffer, name)

    def _setattr(self, name: str, value: Any) -> None:
        setattr(self.buffer, name, value)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Calls the buffer's public ``method`` (e.g. ``"dequeue"``), for methods not forwarded."""
        if not isinstance(method, str) or method.startswith("_"):
            raise ValueError(f"method must name a public buffer method, got {method!r}.")
        return getattr(self.buffer, method)(*args, **kwargs)


def _forward(name: str) -> Callable[..., Any]:
    def method(self: BufferHost, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.buffer, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Forwards ``{name}`` to the hosted buffer."
    return method


for _name in FORWARDED:
    setattr(BufferHost, _name, _forward(_name))


class RayBuffer(RayReplayBuffer):
    """TorchRL's ``RayReplayBuffer`` over a buffer built in the actor from a factory or config.

    Everything ``RayReplayBuffer`` offers works unchanged (``extend``, ``sample``,
    ``update_priority``, ``update_tensordict_priority``, ``client()`` for other actors,
    ``close()``); keyword arguments such as ``extend(data, env_ids=...)`` reach the hosted
    buffer. The Ray client blocks ``_`` names and ``rb.sampler`` cannot be reached, hence
    :meth:`update_window_priority` and :meth:`call`, which a client (``rb.client()``)
    reaches by name too: ``client.call("dequeue", 1)``.

    Args:
        spec: see :func:`buffer_factory`.

    Keyword Args:
        ray_init_config: ``ray.init`` arguments, used only if Ray is not running.
        remote_config: ``ray.remote`` options of the buffer actor. Defaults to
            ``{"num_cpus": 0}`` so the buffer does not take a collector's CPU.
    """

    def __init__(
        self,
        spec: Any,
        *,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            factory=buffer_factory(spec),
            replay_buffer_cls=BufferHost,
            ray_init_config=ray_init_config,
            remote_config={"num_cpus": 0} if remote_config is None else remote_config,
        )

    def update_window_priority(self, env_ids: Any, positions: Any, priorities: Any) -> None:
        """``EnvRingReplayBuffer.update_window_priority`` in the actor (``[B]`` each)."""
        return _compat.ray_client(self).update_window_priority(env_ids, positions, priorities)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Calls the hosted buffer's public ``method`` in the actor and returns the result."""
        return _compat.ray_client(self).call(method, *args, **kwargs)


def ray_replay_buffer(
    spec: Any,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    ray_init_config: dict[str, Any] | None = None,
    remote_config: dict[str, Any] | None = None,
) -> RayBuffer:
    """A buffer built from ``spec`` inside a Ray actor, starting Ray if needed.

    Args:
        spec: a factory or config node, see :func:`buffer_factory`.

    Keyword Args:
        address: an existing cluster (``"auto"``, ``"ray://host:10001"``); ``None``
            starts a local one. Ignored when Ray is already initialised.
        num_cpus: CPUs of a local cluster (``None``: Ray's default, all cores).
        ray_init_config: full ``ray.init`` arguments instead of ``address`` / ``num_cpus``.
        remote_config: ``ray.remote`` options of the buffer actor (default ``{"num_cpus": 0}``).

    Returns:
        A :class:`RayBuffer`; ``close()`` it when done.
    """
    if ray_init_config is None:
        ray_init_config = {"address": address}
        if address is None and num_cpus is not None:
            ray_init_config["num_cpus"] = num_cpus
    elif address is not None or num_cpus is not None:
        raise ValueError(
            "give either ray_init_config= or address=/num_cpus=, not both; put address and "
            "num_cpus in ray_init_config."
        )
    return RayBuffer(spec, ray_init_config=ray_init_config, remote_config=remote_config)


# ----------------------------------------------------------------------
# Shared memory, torch.multiprocessing spawn
def share_buffer(rb: ReplayBuffer, example: Any = None) -> ReplayBuffer:
    """Prepares ``rb`` to be handed to ``torch.multiprocessing`` ``spawn`` processes.

    What is shared, per component:

    * **Storage contents and cursors.** A per-env ring
      (:class:`~torchrl_ext.storages.EnvRingStorage` and
      :class:`~torchrl_ext.storages.EpisodicEnvRingStorage`) is put in shared
      memory with its cursors and episode index (``example`` allocates it if
      nothing was written). A TorchRL ``TensorStorage`` (``FastTensorStorage``,
      ``FastMemmapStorage``, ...) must be initialised or built with
      ``shared_init=True``; torch shares its tensors and TorchRL its counters.
    * **Writes** are serialised by the buffer's process lock (``rb.share(True)``):
      any process may write any env. Give each process its own envs anyway,
      else two processes interleave steps of one trajectory.
    * **Sampler state is per process.** Trajectory samplers (plain and
      prioritized) rebuild what they need in the sampling process from the
      shared cursors before each sample; priorities live in the sampling
      process, which must be the one writing them back. Flat prioritized
      samplers cannot rebuild their trees and are refused.

    Args:
        rb: the buffer.
        example: one batch of steps, to allocate an empty per-env ring.

    Returns:
        ``rb``, shared.

    Raises:
        RuntimeError: for components that cannot be shared (a flat
            ``PrioritizedSampler``, ``DedupEnvRingStorage``,
            ``TensorDictMaxValueWriter``), naming the fix.
        ValueError: for a storage that is not allocated yet, or prefetching.
        TypeError: for storages with no sharing support.
    """
    sampler, storage, writer = rb.sampler, rb.storage, rb.writer
    if isinstance(sampler, _TorchRLPrioritizedSampler):
        raise RuntimeError(SHARING_REFUSED.format(name=type(sampler).__name__))
    if isinstance(writer, TensorDictMaxValueWriter):
        raise RuntimeError(
            "TensorDictMaxValueWriter cannot be shared between processes (its ranking lives in "
            "one process); write from one process, or host the buffer in a Ray actor "
            "(torchrl_ext.distributed.ray_replay_buffer)."
        )
    if _compat.prefetch_size(rb):
        raise ValueError(
            f"prefetch={_compat.prefetch_size(rb)} cannot be combined with sharing; build with prefetch=None."
        )
    if isinstance(storage, EnvRingStorage):
        storage.share_memory_(example)
    elif isinstance(storage, TensorStorage):
        if not storage.initialized and not getattr(storage, "shared_init", False):
            raise ValueError(
                f"{type(storage).__name__} is allocated on the first write, which a spawned "
                "process would do in its own memory; build it with shared_init=True or "
                "extend the buffer once before sharing."
            )
    else:
        raise TypeError(
            f"{type(storage).__name__} has no shared-memory support; share an EnvRingStorage "
            "or a TensorStorage (FastTensorStorage, FastMemmapStorage), or host the buffer in a "
            "Ray actor (torchrl_ext.distributed.ray_replay_buffer)."
        )
    if not rb.shared:  # a new process lock would not be the one the started processes hold
        rb.share(True)
    return rb
