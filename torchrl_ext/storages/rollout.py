"""On-policy rollout storage with the ``[T + 1, N]`` convention (HARL, pytorchrl).

Slot ``t`` holds what is known *before* acting at step ``t``: the observation,
the recurrent state, the value. Step ``t``'s own results (action, log-prob,
``("next", ...)`` reward and done flags) sit in slot ``t`` too. Slot ``T``
holds the observation (and any other carried entry) after the last step: it
bootstraps the returns and becomes slot 0 of the next rollout
(:meth:`RolloutStorage.after_update`).

Written with TorchRL step TensorDicts (:meth:`RolloutStorage.insert`, :meth:`insert_steps`,
or ``rb.extend(batch)`` through :class:`~torchrl_ext.writers.RolloutWriter`); the on-policy
minibatch samplers read the ``T`` filled steps as a ``[T, N]`` storage.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.storages import Storage

from torchrl_ext import _compat
from torchrl_ext._checks import (
    bounds, check_device, check_int, is_int_tensor, makes_kept_tensors, read_only, resolve_time_dim,
)
from torchrl_ext._keys import has_leaf, nested_key, next_key
from torchrl_ext.io.state_files import (
    StateFilesCheckpointer,
    tensordict_from_state,
    tensordict_state,
)
from torchrl_ext.storages._gathers import gather_coordinates, item_batch_shapes
from torchrl_ext.storages._layouts import StorageLayoutError
from torchrl_ext.storages._numpy_rows import leaf_items
from torchrl_ext.storages._output_memory import PinnedOutputs

__all__ = ["RolloutStorage"]


class _RolloutCheckpointer(StateFilesCheckpointer):
    state_files = ("rollout.safetensors", "rollout.json")


class RolloutStorage(PinnedOutputs, Storage):
    """``[T + 1, N]`` rollout, filled by :meth:`insert`, sampled as ``[T, N]``.

    Args:
        num_steps: rollout length ``T``.

    Keyword Args:
        carry_keys: entries copied from ``("next", key)`` of step ``t`` into
            slot ``t + 1`` (default: every key found both at the root and
            under ``"next"`` of the first step).
        device: where the rollout lives.

    Shape contract:
        :attr:`data` is ``[T + 1, N]``; ``shape`` and ``get`` address the
        first ``T`` slots (``[T, N]``), with nested per-agent entries kept
        inside each step.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages import RolloutStorage
        >>> rollout = RolloutStorage(num_steps=2)
        >>> for t in range(2):
        ...     rollout.insert(TensorDict({"observation": torch.full((3, 1), float(t)),
        ...         "next": {"observation": torch.full((3, 1), t + 1.0),
        ...                  "reward": torch.ones(3, 1)}}, [3]))
        >>> rollout.data["observation"][:, 0, 0].tolist()  # slots 0, 1 and the bootstrap slot 2
        [0.0, 1.0, 2.0]
        >>> rollout.after_update()
        >>> rollout.data["observation"][0, 0, 0].item()
        2.0
    """

    _default_checkpointer = _RolloutCheckpointer
    ndim = 2
    returns_tensordicts = True  # reads give one TensorDict: no collate function needed

    def __init__(
        self,
        num_steps: int,
        *,
        carry_keys: Sequence[Any] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        check_int("num_steps", num_steps, minimum=1)
        super().__init__(num_steps)
        self._num_steps = num_steps
        self._device = check_device("device", device)
        if isinstance(carry_keys, str):
            raise TypeError(f"carry_keys must be a list of keys, got carry_keys={carry_keys!r}; pass [{carry_keys!r}].")
        self._carry_keys = None if carry_keys is None else [
            nested_key(key, f"carry_keys[{i}]") for i, key in enumerate(carry_keys)]
        self._storage: TensorDictBase | None = None
        self._step_keys: set[Any] = set()
        self._step = 0

    # ------------------------------------------------------------------
    @property
    def step_keys(self) -> frozenset:
        """Keys of the per-step entries written so far (the rest are per-rollout entries)."""
        return frozenset(self._step_keys)

    num_steps = read_only("_num_steps", "Rollout length ``T``.")
    step = read_only("_step", "Steps inserted since the last :meth:`after_update`.")
    device = read_only("_device", "Where the rollout lives.")

    @property
    def data(self) -> TensorDictBase:
        """The whole ``[T + 1, N]`` rollout."""
        if self._storage is None:
            raise RuntimeError("the rollout is empty: insert a step first.")
        return self._storage

    @property
    def shape(self) -> torch.Size:
        if self._storage is None:
            return torch.Size([self._num_steps, 0])
        return torch.Size([self._num_steps, *self._storage.batch_size[1:]])

    @property
    def carry_keys(self) -> list[Any]:
        return list(self._carry_keys or [])

    def __len__(self) -> int:
        if self._storage is None:
            return 0
        return self._step * self._storage.batch_size[1:].numel()

    # ------------------------------------------------------------------
    def insert(self, step: TensorDictBase) -> None:
        """Writes one step ``[N]`` into slot ``t`` and its carried next entries into ``t + 1``.

        Raises:
            RuntimeError: when ``T`` steps were inserted since :meth:`after_update`.
            ValueError: when the step's keys or shapes differ from the first step's, or
                (:class:`StorageLayoutError`) a dtype the stored one cannot hold without loss.
        """
        if not isinstance(step, TensorDictBase):
            raise TypeError(f"step must be a TensorDict, got {type(step).__name__}.")
        self._write_steps(step.unsqueeze(0))

    def insert_steps(self, data: TensorDictBase, *, time_dim: int | None = None) -> None:
        """Writes a block of consecutive steps, such as a collector batch, at the current step.

        Args:
            data: steps with a time dim, in TorchRL's collector layout by
                default: ``[N, L]`` (time last) from a collector over ``N``
                envs, or ``[L]`` from one env (stored as ``N = 1``).

        Keyword Args:
            time_dim: the time dim of ``data`` (default: its last batch dim).

        Raises:
            RuntimeError: when the ``L`` steps do not fit in the rollout's free slots.
            ValueError: when keys or shapes differ from the rollout's steps, or
                (:class:`StorageLayoutError`) a dtype the stored one cannot hold without loss.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl_ext.storages import RolloutStorage
            >>> rollout = RolloutStorage(num_steps=3)
            >>> batch = TensorDict({"observation": torch.arange(3.0).view(1, 3, 1), "next": {
            ...     "observation": torch.arange(1.0, 4.0).view(1, 3, 1)}}, [1, 3])  # [N=1, L=3]
            >>> rollout.insert_steps(batch)
            >>> rollout.data["observation"].flatten().tolist(), rollout.step
            ([0.0, 1.0, 2.0, 3.0], 3)
        """
        if not isinstance(data, TensorDictBase) or data.batch_dims < 1:
            raise TypeError(
                "data must be a TensorDict with a time dim ([N, L] from a collector, or [L]), got "
                f"{type(data).__name__}{list(data.batch_size) if isinstance(data, TensorDictBase) else ''}."
            )
        time_dim = data.batch_dims - 1 if time_dim is None else resolve_time_dim(time_dim, data.batch_dims)
        steps = data.movedim(time_dim, 0) if data.batch_dims > 1 else data.unsqueeze(1)
        self._write_steps(steps)

    def _write_steps(self, steps: TensorDictBase) -> None:
        """Writes ``steps`` ``[L, N]`` into slots ``t ... t + L - 1`` (carried entries one later)."""
        length = steps.shape[0]
        if length == 0:  # a block of no steps writes nothing, as every write of no rows
            return
        if self._step + length > self._num_steps:
            raise RuntimeError(
                f"the rollout holds {self._step} of num_steps={self._num_steps} steps and cannot "
                f"take {length} more; call after_update() (or empty()) before inserting more."
            )
        if self._storage is None:
            self._allocate(steps[0])
        step_keys = _entry_keys(steps)
        if step_keys != self._step_keys:
            missing = sorted(map(str, self._step_keys - step_keys))
            extra = sorted(map(str, step_keys - self._step_keys))
            raise ValueError(
                f"step keys differ from the rollout's (missing: {missing}, extra: {extra}); "
                "insert the same entries at every step."
            )
        if steps.batch_size[1:] != self._storage.batch_size[1:]:
            raise ValueError(
                f"step has batch size {list(steps.batch_size[1:])} but the rollout holds "
                f"{list(self._storage.batch_size[1:])} envs per step."
            )
        self._check_items(steps)
        first = self._step
        self._storage[first:first + length] = steps.to(self._device)
        # Only the slot after the block gets carried "next" entries: inside it, slot t + 1 keeps
        # what the policy saw (after a reset, the reset observation), as step-by-step inserts do.
        after = self._storage[first + length]
        last = steps[length - 1]
        for key in self._carry_keys:
            after.set_(key, last.get(next_key(key)).to(self._device))
        self._step += length
        _compat.bump_mutation_revision(self)

    def _check_items(self, steps: TensorDictBase) -> None:
        """``ValueError`` unless each leaf of ``steps`` (``[L, N, ...]``) has the stored per-env
        shape; :class:`StorageLayoutError` for a dtype the copy would truncate silently (a float
        into an int slot, an int into a bool one). Widening casts (float64 into float32) pass."""
        stored = self._storage
        for key, leaf in steps.items(include_nested=True, leaves_only=True):
            if not isinstance(leaf, torch.Tensor):
                continue
            slot = stored.get(key)
            if leaf.shape[2:] != slot.shape[2:]:
                raise ValueError(
                    f"key {key!r}: the rollout's steps have item shape {list(slot.shape[2:])}, got "
                    f"{list(leaf.shape[2:])}; insert the same per-env shapes at every step."
                )
            if not torch.can_cast(leaf.dtype, slot.dtype):
                raise StorageLayoutError(
                    f"key {key!r}: the rollout stores dtype {slot.dtype}, got {leaf.dtype}, which "
                    f"it cannot hold without loss; convert the data, e.g. tensor.to({slot.dtype}) "
                    "(rounding first if needed)."
                )

    @makes_kept_tensors  # even at a first step inserted inside torch.inference_mode()
    def _allocate(self, step: TensorDictBase) -> None:
        carry_keys = self._carry_keys
        if carry_keys is None:
            nested_next = step.get("next", None)
            carry_keys = [] if nested_next is None else [
                key for key in nested_next.keys(True, True)
                if has_leaf(step, key) and key != "next"
            ]
        for key in carry_keys:  # checked before anything is set: a bad first step changes nothing
            carried = step.get(next_key(key), None)
            if carried is None:
                raise ValueError(f"carry key {key!r} is missing under 'next' of the step.")
            if carried.shape != step.get(key).shape:
                raise ValueError(
                    f"carry key {key!r} has shape {list(step.get(key).shape)} but its 'next' entry "
                    f"{list(carried.shape)}; the next step's entry is stored in the next slot, so "
                    "give both the same shape."
                )
        batch = (self._num_steps + 1, *step.batch_size)
        self._storage = step.to(self._device).unsqueeze(0).expand(batch).clone().zero_()
        self._step_keys, self._carry_keys = _entry_keys(step), carry_keys

    def write_rollout(self, data: TensorDictBase) -> None:
        """Replaces the rollout by ``data`` ``[L + 1, N]``: ``L`` filled steps and the slot after them.

        This is how a rollout collected elsewhere (a remote worker's
        ``data[: step + 1]``) is handed to a learner; derived entries are not
        shipped and are recomputed there.
        """
        if not isinstance(data, TensorDictBase) or data.batch_dims < 2:
            raise TypeError(
                f"data must be a TensorDict [L + 1, N] (filled steps plus the next slot), got "
                f"{type(data).__name__}{'' if not hasattr(data, 'shape') else list(data.shape)}."
            )
        filled = data.shape[0] - 1
        if not 1 <= filled <= self._num_steps:
            raise ValueError(
                f"data holds {data.shape[0]} slots, i.e. {filled} steps; a rollout of num_steps="
                f"{self._num_steps} takes 2 to {self._num_steps + 1} slots."
            )
        if self._storage is None:
            self._allocate(data[0])
        keys = _entry_keys(data)
        if keys != self._step_keys or data.batch_size[1:] != self._storage.batch_size[1:]:
            raise ValueError(
                f"data has keys {sorted(map(str, keys))} and envs {list(data.batch_size[1:])}; the "
                f"rollout's steps have {sorted(map(str, self._step_keys))} and "
                f"{list(self._storage.batch_size[1:])}."
            )
        self._check_items(data)
        self._storage[: filled + 1] = data.to(self._device)
        self._step = filled
        _compat.bump_mutation_revision(self)

    def after_update(self) -> None:
        """Copies the carried entries of the slot after the last inserted step (slot ``T`` after
        a full rollout) into slot 0 and restarts at step 0."""
        if self._storage is not None:
            last, first = self._storage[self._step], self._storage[0]
            for key in self._carry_keys:
                first.set_(key, last.get(key))
        self._step = 0
        _compat.bump_mutation_revision(self)

    def set_derived(self, key: Any, value: torch.Tensor) -> None:
        """Stores ``value`` under ``key``, computed from the rollout: ``[T + 1, N, ...]`` for
        every slot, or ``[T, N, ...]`` for the steps only (an estimator's output on
        ``data[:T]``; the bootstrap slot ``T`` keeps its value, zeros for a new key).

        Derived entries (value targets, advantages) are sampled with the
        steps but are not expected in inserted steps; they keep their last
        value until set again.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl_ext.storages import RolloutStorage
            >>> storage = RolloutStorage(2)
            >>> for t in range(2):
            ...     storage.insert(TensorDict({"obs": torch.zeros(3, 1)}, [3]))
            >>> storage.set_derived("advantage", torch.ones(2, 3, 1))  # [T, N, 1]: the steps
            >>> storage.data["advantage"][:, 0, 0].tolist()  # the bootstrap slot stays 0
            [1.0, 1.0, 0.0]
        """
        data = self.data
        slots, item_dims = tuple(data.batch_size), tuple(value.shape[data.batch_dims:])
        steps = (slots[0] - 1, *slots[1:])
        if tuple(value.shape[: data.batch_dims]) not in (slots, steps):
            raise ValueError(
                f"{key!r} must be shaped [T + 1, N, ...] = {list(slots)} or [T, N, ...] = {list(steps)} "
                f"plus item dims, got {list(value.shape)}; pass one value per slot or per step."
            )
        self.check_derived_key(key)
        value = value.to(self._device)
        if value.shape[0] == slots[0]:
            data.set(key, value)
            return
        if key not in data.keys(include_nested=True) or data.get(key).shape[data.batch_dims:] != item_dims:
            data.set(key, value.new_zeros(*slots, *item_dims))
        data.get(key)[: steps[0]] = value

    def check_derived_key(self, key: Any) -> None:
        """Refuses ``key`` for a derived entry when inserted steps write it (``ValueError``)."""
        if key in self._step_keys:
            raise ValueError(
                f"{key!r} is written by inserted steps; store derived results under another key."
            )

    def fill_next(self, key: Any = "state_value") -> None:
        """Sets ``("next", key)`` of steps ``0 ... T - 1`` to ``key`` of slots ``1 ... T``.

        Run it after the critic has evaluated all ``T + 1`` slots, so that a
        TorchRL value estimator finds the bootstrap values where it looks.
        """
        data = self.data
        value = data.get(key)
        data.set(next_key(key), torch.cat([value[1:], value[-1:]]))

    # ------------------------------------------------------------------
    def get(self, index: Any) -> TensorDictBase:
        stored = self.data
        batch = stored.batch_size
        if (
            isinstance(index, tuple) and len(index) == len(batch)
            and all(map(is_int_tensor, index))
        ):
            # Coordinates from a sampler: flat rows gathered with index_select, which
            # beats TensorDict's advanced indexing (benchmarks/bench_storage.py).
            index = self._checked_coordinates(index, (self._num_steps, *batch[1:]))
            return gather_coordinates(stored, index, pinned=self._pin_outputs,
                                      item_shapes=item_batch_shapes(stored, stored.batch_dims))
        return stored[: self._num_steps][index]

    @staticmethod
    def _checked_coordinates(index: tuple[torch.Tensor, ...], shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """``index`` with negative coordinates counted from the end of their dim, as TorchRL's
        ``ndim=2`` storage reads them; ``IndexError`` for one out of ``shape`` (``[T, N, ...]``),
        which the flat-row gather would read as another step or env, or as the bootstrap slot."""
        checked = []
        for dim, (coordinate, size) in enumerate(zip(index, shape)):
            if coordinate.numel():
                low, high = bounds(coordinate)
                if low < -size or high >= size:
                    raise IndexError(
                        f"index[{dim}] holds {high if high >= size else low}, out of range for dim "
                        f"{dim} of the rollout's {list(shape)} steps; use values in [{-size}, {size - 1}]."
                    )
                if low < 0:
                    coordinate = coordinate.remainder(size)
            checked.append(coordinate)
        return tuple(checked)

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise RuntimeError(
            f"{type(self).__name__} is written with insert(step), insert_steps(batch), or a "
            "buffer's extend(batch) through RolloutWriter (torchrl_ext's TensorDictReplayBuffer "
            "uses it by default), which appends steps instead of writing at indices."
        )

    def contains(self, item: Any) -> bool:
        t = item[0] if isinstance(item, tuple) else item
        return 0 <= int(t) < self._step

    def state_dict(self) -> dict[str, Any]:
        return {
            "num_steps": self._num_steps,
            "step": self._step,
            # None: not chosen yet (inferred from the first step), unlike [] (carry nothing).
            "carry_keys": None if self._carry_keys is None
            else [list(k) if isinstance(k, tuple) else [k] for k in self._carry_keys],
            "step_keys": [list(k) if isinstance(k, tuple) else [k] for k in self._step_keys],
            "data": tensordict_state(self._storage),
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["num_steps"] != self._num_steps:
            raise ValueError(
                f"the checkpoint has num_steps={state_dict['num_steps']} but this rollout has "
                f"num_steps={self._num_steps}."
            )
        self._storage = tensordict_from_state(state_dict["data"], self._device)
        saved = state_dict["carry_keys"]
        # [] from an empty rollout (or an older checkpoint of one) may mean "not chosen yet";
        # once steps are stored, [] means that nothing is carried.
        self._carry_keys = None if saved is None or (not saved and self._storage is None) else [
            tuple(k) if len(k) > 1 else k[0] for k in saved]
        self._step_keys = {tuple(k) if len(k) > 1 else k[0] for k in state_dict["step_keys"]}
        self._step = int(state_dict["step"])

    def _empty(self) -> None:
        self._step = 0


def _entry_keys(data: TensorDictBase) -> set[Any]:
    """The leaf keys of ``data``, non-tensor entries included (TensorDict's default listing leaves
    them out, so a step that adds or lacks one would pass the key check)."""
    return {key for key, _ in leaf_items(data)}
