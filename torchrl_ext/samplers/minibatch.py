"""On-policy minibatch samplers: one epoch of minibatches over a ``[T, *threads]`` rollout.

The storage holds a rollout with time first and any number of "thread" dims
after it: ``[T, N]`` (one agent, or agents kept inside each step under nested
keys) or ``[T, N, A]`` (agents as threads, HARL's FP critic). Thread dims are
flattened row-major (thread ``n * A + a``), so one code path covers EP and FP.

The samplers differ in their unit: single steps (:class:`FeedForwardMinibatchSampler`),
whole thread sequences (:class:`NaiveRecurrentMinibatchSampler`) or chunks of one
thread (:class:`ChunkedRecurrentMinibatchSampler`); recurrent minibatches are batch
first, time second, as TorchRL's recurrent modules expect.

Each ``sample`` returns the next minibatch of the current epoch; after the last
one ``ran_out`` is set, so ``for batch in rb:`` iterates exactly one epoch
(TorchRL's convention), and the next call starts a new epoch with a new
permutation. Unlike HARL, which drops the ``units % num_mini_batch`` leftover
units of every epoch, every unit appears exactly once per epoch by default
(minibatch sizes then differ by at most one); ``drop_last=True`` restores
HARL's equal-size minibatches.
"""
from __future__ import annotations

from typing import Any

import torch
from torchrl.data.replay_buffers.samplers import Sampler

from torchrl_ext import _compat
from torchrl_ext._checks import (
    CheckedSetting, check_bool, check_indices, check_int, check_state_keys, makes_kept_tensors,
)
from torchrl_ext.io.state_files import StateFiles

__all__ = [
    "ChunkedRecurrentMinibatchSampler",
    "FeedForwardMinibatchSampler",
    "NaiveRecurrentMinibatchSampler",
]


def check_optional_count(name: str, value: int | None) -> int | None:
    """A split setting: ``None`` or an int ``>= 1`` (:func:`~torchrl_ext._checks.check_int`'s error)."""
    return None if value is None else check_int(name, value, minimum=1)


class _EpochMinibatchSampler(StateFiles, Sampler):
    """Hands out one epoch's permutation of units, ``num_mini_batch`` pieces at a time; subclasses
    define the units (``_units``: how many, ``_index``: their storage coordinates)."""

    state_files = ("minibatch_sampler.safetensors", "minibatch_sampler.json")
    unit_name = "unit"

    def __init__(
        self,
        num_mini_batch: int | None = None,
        *,
        mini_batch_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if (num_mini_batch is None) == (mini_batch_size is None):
            raise ValueError(
                "give exactly one of num_mini_batch and mini_batch_size, got "
                f"num_mini_batch={num_mini_batch!r}, mini_batch_size={mini_batch_size!r}."
            )
        self._num_mini_batch, self._mini_batch_size = None, None
        if num_mini_batch is not None:
            self.num_mini_batch = num_mini_batch
        else:
            self.mini_batch_size = mini_batch_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self._empty()
        self._injected: torch.Tensor | None = None

    # ------------------------------------------------------------------
    # The split: exactly one of num_mini_batch and mini_batch_size is set (from the next epoch on).
    num_mini_batch = CheckedSetting(
        check_optional_count, "Minibatches per epoch, or ``None`` when ``mini_batch_size`` decides; setting an int "
        "clears ``mini_batch_size``.", hook="_split_changed",
    )
    mini_batch_size = CheckedSetting(
        check_optional_count, "Units per minibatch, or ``None`` when ``num_mini_batch`` decides; setting an int "
        "clears ``num_mini_batch``.", hook="_split_changed",
    )

    shuffle = CheckedSetting(check_bool, "A new random permutation every epoch (else in order), a bool.")
    drop_last = CheckedSetting(
        check_bool, "Drop the units left over by an equal split (HARL) instead of spreading them, a bool."
    )

    def _split_changed(self, **setting: int | None) -> None:
        """An int >= 1 clears the other split setting; ``None`` keeps it but only if it is set."""
        ((name, value),) = setting.items()
        other = "_mini_batch_size" if name == "num_mini_batch" else "_num_mini_batch"
        if value is not None:
            setattr(self, other, None)
        elif getattr(self, other) is None:
            raise ValueError(
                f"{name}=None leaves neither num_mini_batch nor mini_batch_size set; "
                "set the other one to an int >= 1 instead."
            )

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = bool(value)

    def new_epoch(self) -> None:
        """Starts a fresh epoch at the next sample: a new permutation, ``ran_out`` cleared."""
        self._ran_out = False
        self._splits = None

    def set_permutation(self, permutation: torch.Tensor) -> None:
        """Uses ``permutation`` (of all units) for the next epoch instead of a random one."""
        self._injected = check_indices("permutation", permutation, "unit indices")
        self._splits = None

    @staticmethod
    def _layout(storage: Any) -> tuple[int, torch.Size]:
        if len(storage) == 0 and getattr(storage, "ndim", 1) >= 2:  # its shape is unknown until written
            raise RuntimeError("Cannot sample from an empty storage.")
        shape = getattr(storage, "shape", None)
        if shape is None or len(shape) < 2:
            raise ValueError(
                "on-policy minibatch samplers need a storage of shape [T, *threads] "
                "(e.g. LazyTensorStorage(T * N, ndim=2) extended with a [T, N] rollout, "
                f"dim_extend=0); got shape {None if shape is None else list(shape)}."
            )
        threads = shape[1:]
        filled = len(storage) // max(threads.numel(), 1)
        if filled == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        return filled, threads

    def check_split(self, storage: Any) -> None:
        """Raises the error an epoch over ``storage`` would raise for this split, before anything is
        drawn (so a caller can refuse a split without changing any state)."""
        steps, threads = self._layout(storage)
        self._check_split(self._units(steps, threads.numel()))

    def _check_split(self, count: int) -> None:
        if self.num_mini_batch is not None and self.num_mini_batch > count:
            raise ValueError(
                f"num_mini_batch={self.num_mini_batch} is larger than the {count} "
                f"{self.unit_name}s of the rollout; use at most {count} minibatches."
            )
        size = self.mini_batch_size
        if size is not None and size > count and self.drop_last:
            raise ValueError(
                f"mini_batch_size={size} is larger than the {count} {self.unit_name}s of the "
                "rollout and drop_last=True leaves no minibatch."
            )

    def _new_epoch(self, count: int) -> None:
        # Every check before the injected permutation is used up: a refused epoch keeps it.
        self._check_split(count)
        size = self.mini_batch_size
        if self._injected is not None:
            order = self._injected
            if order.numel() != count or not torch.equal(order.sort().values, torch.arange(count)):
                raise ValueError(
                    f"the injected permutation must hold each of the {count} {self.unit_name}s "
                    "once; call set_permutation() with such a permutation."
                )
            self._injected = None
        elif self.shuffle:
            order = torch.randperm(count, generator=_compat.generator(self))
        else:
            order = torch.arange(count)
        if self.drop_last:  # HARL: equal sizes, the leftover units unused this epoch
            order = order[: count - count % (size or self.num_mini_batch)]
        splits = torch.tensor_split(order, self.num_mini_batch) if size is None else torch.split(order, size)
        self._splits, self._next = list(splits), 0
        _compat.set_remaining_batches(self, len(splits))

    def sample(self, storage: Any, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        """The next minibatch of the epoch (``batch_size`` is ignored: the split decides)."""
        steps, threads = self._layout(storage)
        count = self._units(steps, threads.numel())
        if self._splits is None or self._next >= len(self._splits) or self._epoch_units != count:
            self._epoch_units = count
            self._new_epoch(count)
        units = self._splits[self._next]
        self._next += 1
        _compat.set_remaining_batches(self, len(self._splits) - self._next)
        # TorchRL: set with the last batch of the epoch, cleared by the other batches.
        self.ran_out = self._next == len(self._splits)
        return self._index(units, steps, threads), {}

    @staticmethod
    def _thread_coordinates(thread: torch.Tensor, threads: torch.Size) -> tuple[torch.Tensor, ...]:
        return tuple(torch.unravel_index(thread, threads)) if len(threads) > 1 else (thread,)

    # ------------------------------------------------------------------
    def _empty(self) -> None:
        self._splits: list[torch.Tensor] | None = None
        self._next, self._ran_out = 0, False

    def state_dict(self) -> dict[str, Any]:
        return {
            "next": self._next,
            "ran_out": self._ran_out,
            "units": getattr(self, "_epoch_units", 0),
            "splits": [s.clone() for s in self._splits or []],
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_keys(state_dict, ("next", "ran_out", "splits", "units"),
                         f"pass a {type(self).__name__}'s own state_dict()")
        splits = state_dict["splits"]
        self._splits = [s.clone() for s in splits] if splits else None
        self._next, self._ran_out = int(state_dict["next"]), bool(state_dict["ran_out"])
        self._epoch_units = int(state_dict["units"])
        if self._splits:  # the prefetcher's count of batches left in this epoch
            _compat.set_remaining_batches(self, len(self._splits) - self._next)

    def __repr__(self) -> str:
        split = (f"num_mini_batch={self.num_mini_batch}" if self.num_mini_batch is not None
                 else f"mini_batch_size={self.mini_batch_size}")
        return f"{type(self).__name__}({split}, shuffle={self.shuffle}, drop_last={self.drop_last})"


class FeedForwardMinibatchSampler(_EpochMinibatchSampler):
    """Minibatches of single steps; unit ``t * threads + thread`` (HARL's time-major order).

    Args:
        num_mini_batch: minibatches per epoch (or give ``mini_batch_size``).

    Keyword Args:
        mini_batch_size: steps per minibatch instead.
        shuffle: a new random permutation every epoch (else in order).
        drop_last: drop the remainder (HARL) instead of spreading it.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_ext.samplers import FeedForwardMinibatchSampler
        >>> T, N = 5, 2
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(T * N, ndim=2), dim_extend=0,
        ...     sampler=FeedForwardMinibatchSampler(3), batch_size=1)
        >>> _ = rb.extend(TensorDict({"t": torch.arange(T).repeat_interleave(N).view(T, N)}, [T, N]))
        >>> [batch.shape[0] for batch in rb]  # one epoch: 10 steps in 3 minibatches
        [4, 3, 3]
    """

    unit_name = "step"

    def _units(self, steps: int, threads: int) -> int:
        return steps * threads

    def _index(self, units, steps, threads):
        n = threads.numel()
        return (units // n, *self._thread_coordinates(units % n, threads))


class NaiveRecurrentMinibatchSampler(_EpochMinibatchSampler):
    """Minibatches of whole thread sequences, ``[k, T]``; start recurrent states from ``batch[:, 0]``.

    Args:
        num_mini_batch: minibatches per epoch (or ``mini_batch_size`` threads each).
    """

    unit_name = "thread"

    def _units(self, steps: int, threads: int) -> int:
        return threads

    def _index(self, units, steps, threads):
        time = torch.arange(steps).expand(units.numel(), steps)
        thread = units.unsqueeze(1).expand_as(time)
        return (time, *self._thread_coordinates(thread, threads))


class ChunkedRecurrentMinibatchSampler(_EpochMinibatchSampler):
    """Minibatches of ``data_chunk_length``-step chunks of one thread, ``[k, L]``.

    Chunk ``c`` is thread ``c // (T / L)``, steps ``t0 ... t0 + L - 1`` with
    ``t0 = (c % (T / L)) * L`` (HARL's order). Chunks may span an episode end;
    the ``masks`` inside them mark where a recurrent state must reset.

    Args:
        num_mini_batch: minibatches per epoch (or ``mini_batch_size`` chunks each).

    Keyword Args:
        data_chunk_length: steps per chunk ``L``; must divide the rollout length.
    """

    unit_name = "chunk"

    def __init__(self, num_mini_batch: int | None = None, *, data_chunk_length: int, **kwargs: Any) -> None:
        super().__init__(num_mini_batch, **kwargs)
        self.data_chunk_length = data_chunk_length

    data_chunk_length = CheckedSetting(
        check_int, "Steps per chunk ``L``, an int ``>= 1`` that divides the rollout length.", minimum=1
    )

    def _units(self, steps: int, threads: int) -> int:
        length = self.data_chunk_length
        if length > steps or steps % length:
            raise ValueError(
                f"data_chunk_length={length} must divide the rollout length T={steps} "
                f"(chunks never cross threads); use a divisor of {steps}."
            )
        return threads * (steps // length)

    def _index(self, units, steps, threads):
        per_thread = steps // self.data_chunk_length
        thread = units // per_thread
        t0 = (units % per_thread) * self.data_chunk_length
        time = t0.unsqueeze(1) + torch.arange(self.data_chunk_length)
        return (time, *self._thread_coordinates(thread.unsqueeze(1).expand_as(time), threads))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", data_chunk_length={self.data_chunk_length})"
