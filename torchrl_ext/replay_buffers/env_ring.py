"""A TorchRL replay buffer over per-environment rings (ALF's ``ReplayBuffer`` data path)."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from tensordict.utils import expand_as_right
from torchrl.data.replay_buffers.samplers import Sampler

from torchrl_ext import _compat
from torchrl_ext._checks import check_int, check_real
from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.trajectory import TrajectorySampler
from torchrl_ext.storages.ring import EnvRingStorage
from torchrl_ext.writers.ring import EnvRingWriter

__all__ = ["EnvRingReplayBuffer"]


class EnvRingReplayBuffer(TensorDictReplayBuffer):
    """``TensorDictReplayBuffer`` over an :class:`~torchrl_ext.storages.EnvRingStorage`.

    Any subset of envs can be written at a time (``env_ids=`` or an
    ``"env_id"`` entry); each env keeps its own last ``max_length`` steps.
    On top of TorchRL's API it has ALF's ring operations: blocking writes,
    :meth:`dequeue`, :meth:`remove_up_to`, :meth:`clear`, :meth:`gather_all`
    and :meth:`read`, all under the buffer lock.

    Keyword Args:
        num_envs, max_length: ring geometry (ignored when ``storage`` is given).
        device: device of the data (ignored when ``storage`` is given).
        storage: an :class:`~torchrl_ext.storages.EnvRingStorage`, or a zero-argument
            factory of one (``functools.partial(EnvRingStorage, 4, 100)``).
        writer: defaults to :class:`~torchrl_ext.writers.EnvRingWriter` (or a factory).
        sampler: defaults to ``TrajectorySampler(batch_length=1)`` (or a factory).
        **kwargs: the rest of ``TensorDictReplayBuffer``'s arguments.

    Shape contract:
        ``extend`` takes ``[N]`` (one step per env) or ``[N, T]``;
        ``sample(B)`` with a :class:`~torchrl_ext.samplers.TrajectorySampler`
        gives ``[B, batch_length]`` with ``env_ids`` and ``positions``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
        >>> step = TensorDict({"obs": torch.tensor([[1.0], [2.0]])}, [2])
        >>> _ = rb.extend(step, env_ids=torch.tensor([0, 2]))
        >>> rb.storage.current_size.tolist()
        [1, 0, 1]
        >>> rb.dequeue(1, env_ids=[2])["obs"].tolist()
        [[[2.0]]]
    """

    _drives_env_rings = True  # EnvRingStorage.attach accepts this buffer

    def __init__(
        self,
        *,
        num_envs: int | None = None,
        max_length: int | None = None,
        device: torch.device | str = "cpu",
        storage: EnvRingStorage | Callable[[], EnvRingStorage] | None = None,
        writer: EnvRingWriter | Callable[[], EnvRingWriter] | None = None,
        sampler: Sampler | Callable[[], Sampler] | None = None,
        **kwargs: Any,
    ) -> None:
        # Factories (functools.partial, a class) as TorchRL accepts them: what a
        # RayReplayBuffer or a config sends so that the parts are built in place.
        storage, writer, sampler = (
            _build(part) for part in (storage, writer, sampler)
        )
        if storage is None:
            if num_envs is None or max_length is None:
                raise ValueError(
                    "give num_envs= and max_length= (or storage=EnvRingStorage(...))."
                )
            storage = EnvRingStorage(num_envs, max_length, device=device)
        writer = EnvRingWriter() if writer is None else writer
        for name, part, kind in (("storage", storage, EnvRingStorage), ("writer", writer, EnvRingWriter)):
            if not isinstance(part, kind):
                raise TypeError(f"{name} must be an {kind.__name__}, got {type(part).__name__}.")
        sampler = TrajectorySampler() if sampler is None else sampler
        if kwargs.get("dim_extend") is None:
            # TorchRL reads None as storage.ndim - 1 = 1 (time); the rings extend along envs.
            kwargs["dim_extend"] = 0
        super().__init__(storage=storage, writer=writer, sampler=sampler, **kwargs)
        if hasattr(self.sampler, "update_window_priority"):
            # Window priorities index the rings: the sampler can take updates
            # (sampler.update_window_priority) before its first sample.
            self.sampler.use_storage(self.storage)

    # ------------------------------------------------------------------
    def extend(
        self,
        data: TensorDictBase,
        *,
        env_ids: Any = None,
        blocking: bool = False,
        timeout: float | None = None,
        update_priority: bool | None = None,
    ) -> torch.Tensor | None:
        """Writes ``[N]`` or ``[N, T]`` steps of the envs ``env_ids``.

        Args:
            data: the steps. ``data["env_id"]`` names the envs when ``env_ids``
                is not given; without either, ``N`` must be ``num_envs``.

        Keyword Args:
            env_ids: ``N`` distinct int env ids (an int for one row); floats and
                bools are refused (``TypeError``).
            blocking: wait until every env has room instead of overwriting its
                oldest steps. The wait happens outside the buffer lock.
            timeout: seconds to wait at most, a finite number >= 0 (``TimeoutError`` after
                that); ``None`` waits without limit.
            update_priority: as in ``TensorDictReplayBuffer.extend``.

        Returns:
            The ``[N * T, 2]`` ``(env, position)`` coordinates written, or ``None``
            if the buffer was stopped (:meth:`stop`) while waiting. Unlike
            TorchRL's ``TensorDictReplayBuffer``, ``data`` is not given an
            ``"index"`` entry, so the same batch object can be written again.
        """
        writer: EnvRingWriter = self.writer
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict, got {type(data).__name__}.")
        if timeout is not None:
            check_real("timeout", timeout, low=0.0, hint="pass seconds to wait, or None to wait without limit")
        self._check_priority_entry(data, update_priority)  # before any step is stored
        if not blocking or data.batch_size.numel() == 0:  # no step needs room
            return self._write(data, env_ids, update_priority)
        ids = writer._env_ids_of(data, env_ids)[0]  # checked as the write checks them
        steps = 1 if data.batch_dims == 1 else data.shape[1]
        # One deadline for every retry: another producer may take the room each time.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not writer.wait_for_room(ids, steps, remaining):
                # Refused before the deadline only by stop(), which a revive() may already have undone.
                if writer.stopped or deadline is None or time.monotonic() < deadline:
                    return None
                raise TimeoutError(
                    f"no room for {steps} step(s) in envs {ids.tolist()} after {timeout} s; "
                    "dequeue or clear data, or write without blocking."
                )
            # The readiness condition before the replay lock, as in TensorDictReplayBuffer.extend.
            with _compat.readiness_condition(self), _compat.replay_lock(self):
                # Another producer may have taken the room between the wait and the lock.
                with _compat.write_lock(self):
                    room = writer.has_room(ids, steps)
                if room:
                    return self._write(data, env_ids, update_priority)

    def _write(self, data: TensorDictBase, env_ids: Any, update_priority: bool | None) -> torch.Tensor:
        if not fastpath_enabled() or self._has_transform() or _compat.is_consuming(self):
            if env_ids is not None:  # into a copy: the caller's batch keeps its keys
                # Checked first, as the writer checks them on the path below: stored into
                # the batch, a bad shape would fail inside TensorDict with another error.
                ids = self.writer.check_row_env_ids(env_ids, data)
                if data.batch_size.numel() == 0:  # a [0] or [N, 0] batch: no step to write
                    return torch.empty(0, 2, dtype=torch.long)
                if data.batch_dims == 2:
                    ids = ids.unsqueeze(1).expand(data.shape)
                data = data.copy().set(self.writer.env_id_key, ids)
            return super().extend(data, update_priority=update_priority)
        # TorchRL's extend without the transform, transpose and consumption
        # branches that cannot apply here; same locks (as in LeanExtend._lean_extend), same
        # calls, same result.
        try:
            with _compat.readiness_condition(self), _compat.replay_lock(self):
                with _compat.write_lock(self):
                    index = self.writer.write(data, env_ids)
                    self.sampler.extend(index)
                # The rings store exactly the leaves they are written (the storage checks), so a
                # priority entry can only be a stored leaf: a dict lookup spares TensorDict.get's
                # costly miss on every step write.
                if (update_priority is None or update_priority) and self.storage.stores_leaf(self.priority_key):
                    priority = data.get(self.priority_key, None)
                    if priority is not None:
                        self.update_priority(index, priority)
        finally:
            # Wakes the waiters, as in LeanExtend._lean_extend.
            _compat.notify_state_change(self)
        return index

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event: Any = None,
    ) -> Any:
        """Samples like ``TensorDictReplayBuffer.sample``: ``[B, batch_length]`` windows with
        ``index`` (per step ``(env, position)``) and the sampler's info, broadcast over time
        (added after the transform, and left out with ``include_info=False``, as TorchRL does).
        ``wait``, ``timeout`` and ``cancel_event`` as in ``TensorDictReplayBuffer.sample``."""
        waits = _compat.sample_wait_arguments(wait=wait, timeout=timeout, cancel_event=cancel_event)
        size = self._plain_batch_size(batch_size, include_info, lambda: not self.writer.tracks_generations)
        if size is None or waits:  # TorchRL's sample waits, then calls _sample
            return super().sample(batch_size, return_info=return_info, include_info=include_info, **waits)
        storage = self.storage
        with _compat.replay_lock(self), _compat.write_lock(self):
            index, info = self.sampler.sample(storage, size)
            info["index"] = index
            env, position = index[0], index[1]
            extra = {"index": torch.stack(index, -1)}
            for key, value in info.items():
                if key != "index":
                    value = torch.as_tensor(value)
                    extra[key] = value if value.ndim >= env.ndim else expand_as_right(value, env)
            if len(index) == 3:  # n-step: "next" entries from the chain end
                data = storage.gather_chain(env, position, index[2], extra)
            else:
                data = storage.gather(env, position, extra)
        data = _compat.set_sample_names(self.sampler, data)
        _compat.count_sample(self, index)  # as TorchRL's sample counts after _sample
        return (data, info) if return_info else data

    def _set_index_in_td(self, tensordict: TensorDictBase, index: torch.Tensor | None) -> None:
        # TorchRL writes "index" into the caller's batch; writing that batch again
        # would then carry an extra key into the strict storage. extend returns it.
        return

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Writes ``data[priority_key]`` back as the priority of each sampled window.

        ``data`` is a sample ``[B, T]`` (or ``[B]``) with its ``index``; a
        ``[B, T]`` priority is reduced with ``max`` over time. TorchRL's version
        only serves its own ``PrioritizedSampler`` and silently does nothing for
        a :class:`~torchrl_ext.samplers.PrioritizedTrajectorySampler`.

        Raises:
            KeyError: if ``data`` has no ``priority_key`` entry or no ``index``.
        """
        if not hasattr(self.sampler, "update_window_priority"):
            return super().update_tensordict_priority(data)
        for key in (self.priority_key, "index"):
            if key not in data.keys(include_nested=True):
                raise KeyError(
                    f"update_tensordict_priority needs {key!r} in data (a sample of this buffer "
                    f"with data[{self.priority_key!r}] set), got keys {sorted(map(str, data.keys()))}."
                )
        # The sampler reduces a [B, T] priority over time and refuses an empty one.
        self.update_priority(data.get("index"), data.get(self.priority_key))

    def update_window_priority(self, env_ids: Any, positions: Any, priorities: Any) -> None:
        """Sets the priority of the windows starting at ``positions`` of ``env_ids``.

        The buffer-level (locked) form of the sampler's
        ``update_window_priority``; it is also what a Ray client calls, since
        ``rb.sampler`` cannot be reached over the wire. ``env_ids``, ``positions``
        and ``priorities`` broadcast to one ``[B]`` shape (a sample's
        ``batch["env_ids"][:, 0]`` and ``batch["positions"][:, 0]``).

        Raises:
            TypeError: if the sampler has no window priorities (not a
                :class:`~torchrl_ext.samplers.PrioritizedTrajectorySampler`).
        """
        update = getattr(self.sampler, "update_window_priority", None)
        if update is None:
            raise TypeError(
                f"{type(self.sampler).__name__} keeps no window priorities; build the buffer "
                "with sampler=PrioritizedTrajectorySampler(...) (alf_replay_buffer("
                "prioritized_sampling=True))."
            )
        with _compat.replay_lock(self), _compat.write_lock(self):
            self.sampler.use_storage(self.storage)
            update(env_ids, positions, priorities)

    def dequeue(self, n: int = 1, env_ids: Any = None) -> TensorDictBase:
        """Removes and returns the ``n`` oldest steps of each env, ``[len(env_ids), n]``."""
        with _compat.replay_lock(self), _compat.write_lock(self):
            return self.writer.dequeue(n, env_ids)

    def remove_up_to(self, n: int, env_ids: Any = None) -> None:
        """Forgets up to ``n`` oldest steps of each env in ``env_ids`` (any subset)."""
        with _compat.replay_lock(self), _compat.write_lock(self):
            self.writer.remove_up_to(n, env_ids)

    def clear(self, env_ids: Any = None) -> None:
        """Empties ``env_ids`` (all envs by default)."""
        with _compat.replay_lock(self), _compat.write_lock(self):
            self.writer.clear(env_ids)

    def gather_all(self, ignore_earliest_frames: int | bool = 0) -> tuple[TensorDictBase, torch.Tensor]:
        """All stored steps ``[E, n]`` in order, and the start positions ``[E]``, without the
        ``ignore_earliest_frames`` oldest steps of each env; ``True`` (ALF's flag) leaves out
        those no window starts at (the sampler's ``num_earliest_frames_ignored``)."""
        with _compat.replay_lock(self), _compat.write_lock(self):
            if isinstance(ignore_earliest_frames, bool):
                ignored = getattr(self.sampler, "ignored_frames", lambda storage: storage.required_lookback)
                ignore_earliest_frames = ignored(self.storage) if ignore_earliest_frames else 0
            check_int("ignore_earliest_frames", ignore_earliest_frames, minimum=0)
            return self.storage.gather_all(ignore_earliest_frames)

    def read(self, env_ids: Any, positions: Any) -> TensorDictBase:
        """Steps at absolute ``positions`` of ``env_ids`` (ALF's ``get_field``), checked."""
        with _compat.replay_lock(self), _compat.write_lock(self):
            return self.storage.read(env_ids, positions)

    def stop(self) -> None:
        """Wakes blocked writers; they return ``None`` until :meth:`revive`."""
        self.writer.stop()

    def revive(self) -> None:
        self.writer.revive()

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count=empty_write_count)  # under the buffer's locks
        self.writer.notify_room()


def _build(part: Any) -> Any:
    """A component, or what its zero-argument factory (class, ``functools.partial``) builds."""
    return part() if callable(part) and not isinstance(part, (EnvRingStorage, EnvRingWriter, Sampler)) else part
