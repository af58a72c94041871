"""Windows of consecutive steps from per-environment rings (ALF's ``get_batch``).

Draws ``batch_size`` windows of ``batch_length`` consecutive steps, each from
one env of an :class:`~torchrl_ext.storages.EnvRingStorage`. A window start
``s`` of env ``e`` is valid when the whole window is stored and does not begin
in the ``num_earliest_frames_ignored`` oldest steps:
``current_pos - current_size + num_earliest_frames_ignored <= s <= current_pos - batch_length``.

Differences from ALF, all deliberate:

* envs without a valid start are skipped (ALF asserts that *every* env has
  one); a ``ValueError`` is raised only when no env has any;
* the start of a window is computed in float64, exact for any position
  (ALF's float32 product loses precision above 2**24, bug Q19);
* the result is ``[batch_size, batch_length]``; the sampler info gives
  ``env_ids`` and the window start ``positions`` (``[batch_size]``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import Sampler

from torchrl_ext import _compat
from torchrl_ext._checks import CheckedSetting, check_batch_size, check_bool, check_int, check_real
from torchrl_ext.io.state_files import NoState
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["TrajectorySampler"]


class StatelessSampler(NoState, Sampler):
    """A sampler whose only state is the buffer's RNG: nothing to empty, save or load."""

    def _empty(self) -> None:
        return


class TrajectorySampler(StatelessSampler):
    """Env-balanced uniform windows, with an optional share of recent data.

    Envs take turns: with ``k`` eligible envs each gets ``batch_size // k``
    windows and ``batch_size % k`` distinct random envs one more. Without
    replacement (the default, as in ALF) the windows of one env come from
    disjoint integer strata of its randomly rotated valid starts, so they are
    distinct whenever the env has at least as many valid starts as windows,
    and each valid start of an env is equally likely.

    Args:
        batch_length: steps per window ``T``.

    Keyword Args:
        num_earliest_frames_ignored: oldest stored steps of each env that never
            start a window (e.g. to let a frame stacker look back).
        with_replacement: draw each window independently.
        recent_data_steps: how many of the newest valid starts count as recent.
        recent_data_ratio: share of the batch drawn from the recent starts.
            Used only when plain sampling would reach recent data too rarely:
            when ``(stored_steps / num_envs - T + 1 - ignored) * ratio >
            recent_data_steps``. Recent windows come first in the batch.

    Shape contract:
        ``sample(storage, B)`` returns ``index = (env [B, T], position [B, T])`` and
        ``info = {"env_ids": [B], "positions": [B]}`` (window starts).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> from torchrl_ext.samplers import TrajectorySampler
        >>> rb = EnvRingReplayBuffer(num_envs=2, max_length=8,
        ...                          sampler=TrajectorySampler(batch_length=3))
        >>> for t in range(5):
        ...     _ = rb.extend(TensorDict({"t": torch.full((2,), float(t))}, [2]))
        >>> batch = rb.sample(4)
        >>> batch.shape, bool((batch["t"].diff(dim=1) == 1).all())
        (torch.Size([4, 3]), True)
    """

    def __init__(
        self,
        batch_length: int = 1,
        *,
        num_earliest_frames_ignored: int = 0,
        with_replacement: bool = False,
        recent_data_steps: int = 1,
        recent_data_ratio: float = 0.0,
    ) -> None:
        super().__init__()
        # Each setter runs the check of its argument.
        self.batch_length = batch_length
        self.num_earliest_frames_ignored = num_earliest_frames_ignored
        self.with_replacement = with_replacement
        self.recent_data_steps = recent_data_steps
        self.recent_data_ratio = recent_data_ratio

    batch_length = CheckedSetting(check_int, "Steps per window, an int ``>= 1``.", minimum=1)
    num_earliest_frames_ignored = CheckedSetting(
        check_int, "Oldest stored steps of each env that never start a window, an int ``>= 0``.", minimum=0
    )
    with_replacement = CheckedSetting(check_bool, "Draw each window independently, a bool.")
    recent_data_steps = CheckedSetting(
        check_int, "How many of the newest valid starts count as recent, an int ``>= 1``.", minimum=1
    )
    recent_data_ratio = CheckedSetting(
        check_real, "Share of the batch drawn from the recent starts, in ``[0, 1]``.", low=0.0, high=1.0
    )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_length={self._batch_length}, num_earliest_frames_ignored="
            f"{self.num_earliest_frames_ignored}, with_replacement={self.with_replacement}, "
            f"recent_data_steps={self.recent_data_steps}, recent_data_ratio={self.recent_data_ratio})"
        )

    # ------------------------------------------------------------------
    def ignored_frames(self, storage: EnvRingStorage) -> int:
        """Oldest steps that never start a window: this sampler's own setting, or more if
        the storage needs them (a frame-stacking storage needs ``num_stack - 1``)."""
        return max(self.num_earliest_frames_ignored, storage.required_lookback)

    def valid_starts(self, storage: EnvRingStorage) -> tuple[torch.Tensor, torch.Tensor]:
        """Per env: the number of valid window starts and the latest one (``[E]`` each)."""
        count, latest = self._valid_starts_np(storage)
        return torch.from_numpy(count), torch.from_numpy(latest)

    def _valid_starts_np(self, storage: EnvRingStorage) -> tuple[np.ndarray, np.ndarray]:
        # numpy: the storage's counters are numpy views, and the draw's bookkeeping on
        # small [E] and [B] arrays pays less per op there than in torch.
        lookback = self._batch_length - 1 + self.ignored_frames(storage)
        return np.maximum(storage.size_array - lookback, 0), storage.position_array - self._batch_length

    def sample(self, storage: EnvRingStorage, batch_size: int) -> tuple[Any, dict[str, torch.Tensor]]:
        if not isinstance(storage, EnvRingStorage):
            raise TypeError(
                f"{type(self).__name__} samples windows from an EnvRingStorage, got {type(storage).__name__}."
            )
        check_batch_size(batch_size)
        count, latest = self._valid_starts_np(storage)  # per env: valid starts, latest start
        eligible = np.flatnonzero(count)  # the envs with any
        if eligible.size == 0:
            if len(storage) == 0:
                raise RuntimeError("Cannot sample from an empty storage.")
            raise ValueError(
                f"no env holds a window of batch_length={self._batch_length} after ignoring "
                f"{self.ignored_frames(storage)} earliest steps (steps per env: "
                f"{storage.sizes.tolist()}); sample shorter windows or add more data."
            )
        recent = self._recent_batch_size(storage, batch_size)
        env, start, info = self._draw_windows(storage, batch_size - recent, eligible, count, latest)
        if recent:
            # Recent windows are drawn uniformly: nothing to correct, weight 1.
            env_r, start_r = self._draw(recent, eligible, count, latest, cap=self.recent_data_steps)
            env, start = torch.cat([env_r, env]), torch.cat([start_r, start])
            info = {key: torch.cat([torch.ones(recent, dtype=value.dtype), value]) for key, value in info.items()}
        steps = start.unsqueeze(1) + torch.arange(self._batch_length)
        index = (env.unsqueeze(1).expand_as(steps), steps)
        return index, {"env_ids": env, "positions": start, **info}

    def _draw_windows(
        self, storage: EnvRingStorage, n: int, eligible: np.ndarray, count: np.ndarray, latest: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The ``n`` windows not drawn from recent data: ``(env, start)`` and their own info."""
        return (*self._draw(n, eligible, count, latest, cap=None), {})

    def _recent_batch_size(self, storage: EnvRingStorage, batch_size: int) -> int:
        if self.recent_data_ratio <= 0:
            return 0
        lookback = self._batch_length - 1 + self.ignored_frames(storage)
        average_starts = len(storage) / storage.num_envs - lookback
        if average_starts * self.recent_data_ratio <= self.recent_data_steps:
            return 0  # plain sampling already reaches the recent starts often enough
        return math.ceil(batch_size * self.recent_data_ratio)

    def _draw(
        self,
        n: int,
        eligible: np.ndarray,
        count: np.ndarray,
        latest: np.ndarray,
        cap: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` (env, start) pairs, envs balanced over ``eligible`` (the arrays :meth:`sample` computes),
        each start among its env's last ``starts`` valid ones.

        With replacement: ``floor(r * starts)``. Without, when ``starts >= m``: env
        ``e``'s ``j``-th of ``m`` windows lies in the integer stratum ``[j * starts
        // m, (j + 1) * starts // m)``, rotated by ``floor(u * starts)`` (mod
        ``starts``) with one ``u`` per env, so its starts are distinct (ALF's real
        strata can share a start) and each is drawn with probability ``m / starts``.
        With fewer starts than windows the strata are real-valued as in ALF.
        """
        k = eligible.size
        rounds, extra = divmod(n, k)
        slot = np.tile(np.arange(k), rounds)  # each window's env, as a position in eligible
        stratum = np.repeat(np.arange(rounds), k)
        strata = np.full(k, rounds, dtype=np.int64)
        if extra:
            chosen = torch.randperm(k, generator=_compat.generator(self))[:extra].numpy()
            slot = np.concatenate([slot, chosen])
            stratum = np.concatenate([stratum, np.full(extra, rounds, dtype=np.int64)])
            strata[chosen] += 1
        env, windows = eligible[slot], strata[slot]
        # One draw: an offset per window, then (without replacement) a rotation per env.
        r = torch.rand(slot.size + (0 if self.with_replacement else k), dtype=torch.float64,
                       generator=_compat.generator(self)).numpy()
        r, turn = r[:slot.size], r[slot.size:]
        starts = count[env] if cap is None else np.minimum(count[env], cap)
        if self.with_replacement:
            offset = np.minimum((r * starts).astype(np.int64), starts - 1)  # r >= 0: truncation floors
        else:
            low = stratum * starts // windows
            width = (stratum + 1) * starts // windows - low
            # The rotation of the docstring: a bijection, even over strata of unequal width.
            spread = (low + (r * width).astype(np.int64) + (turn[slot] * starts).astype(np.int64)) % starts
            shared = np.minimum(((r + stratum) * starts / windows).astype(np.int64), starts - 1)
            offset = np.where(starts >= windows, spread, shared)
        return torch.from_numpy(env), torch.from_numpy(offset + latest[env] - (starts - 1))
