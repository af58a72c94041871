"""The n-step chain of every stored start step, tabulated and kept in step with the writes.

A chain from start ``p`` reads ``n_step`` steps forward, so a write at ``p``
can change only the chains from ``p - n_step + 1 .. p`` (it may extend them or
cut them at a new ``done``). The table holds, per flat storage row, where the
chain from that row stops (``m``, int8) and its discounted reward sum (in the n-step
reward's dtype), so a sample looks each draw up once instead of reading ``n_step``
rewards and done flags per draw.

A write reported one storage revision after the last catch-up is applied in place
(:meth:`ChainTable.written`); any other change leaves the table stale until
``NStepSampler._table`` rebuilds it.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from torchrl_ext import _compat
from torchrl_ext.storages._numpy_rows import numpy_view
from torchrl_ext.storages._gathers import take

__all__ = ["ChainTable"]

# Chains computed per block in a full rebuild: bounds the [block, n_step]
# temporaries (float64 rewards) to a few MiB whatever the buffer size.
_BLOCK = 1 << 17

ChainFn = Callable[[Any, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class ChainTable:
    """Per-row chain stop ``m`` and n-step reward of one storage, for one ``(n_step, gamma)``.

    Args:
        streams: the storage's stream view (:mod:`torchrl_ext.samplers._streams`).
        settings: ``(n_step, gamma, ...)`` the chains were computed with (the sampler's
            keys follow: a change of any rebuilds the table).
        chains: ``chains(streams, env, start) -> (m [K], reward [K, *reward_shape])``.
        counts: ``counts(m, reward_shape, device) -> (steps_to_next_obs, nstep_discount)``.

    Shape contract:
        ``lookup(flat [B])`` returns ``m`` int64 ``[B]``, the reward
        ``[B, *reward_shape]``, ``steps_to_next_obs = m + 1`` (int64) and
        ``nstep_discount = gamma ** (m + 1)`` (float32), both shaped like the
        reward, all on the reward leaf's device.
    """

    def __init__(self, streams: Any, settings: tuple, chains: ChainFn, counts: Callable) -> None:
        self.streams, self.settings, self._chains, self._counts = streams, settings, chains, counts
        self.storage = streams.storage
        self.revision = _compat.mutation_revision(self.storage)
        self.served = 0  # rows looked up since the build: what the build has paid for
        self.stop: torch.Tensor | None = None
        self.reward: torch.Tensor | None = None
        env, start = streams.all_starts()
        for lo in range(0, env.numel(), _BLOCK):
            self._fill(env[lo:lo + _BLOCK], start[lo:lo + _BLOCK])
        if self.stop is None:  # nothing stored yet: sized on the first write
            self.revision = -1

    def current(self, streams: Any, settings: tuple) -> bool:
        """Whether the table describes ``streams``' storage as it is now, for ``settings``."""
        return (
            streams is self.streams or streams.same_source(self.streams)
        ) and settings == self.settings and self.revision == _compat.mutation_revision(self.storage)

    def lookup(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Every op here costs microseconds per sample: no copies or moves that are not needed.
        if flat.device != self.stop.device:
            flat = flat.to(self.stop.device)
        reward = numpy_view(self.reward) if flat.is_cpu else None
        if reward is not None:
            # numpy's take beats index_select on a sample's few hundred rows.
            rows = flat.numpy()
            m = self.stop.numpy().take(rows).astype(np.int64)
            return (torch.from_numpy(m), take(reward, rows),
                    take(self._steps_by_stop.numpy(), m), take(self._discount_by_stop.numpy(), m))
        m = self.stop.index_select(0, flat).long()
        reward = self.reward.index_select(0, flat)
        return m, reward, self._steps_by_stop.index_select(0, m), self._discount_by_stop.index_select(0, m)

    def written(self, index: Any, *, reported_twice: bool) -> None:
        """Applies a write the buffer reported at ``index``.

        ``reported_twice``: the same write may already have been applied
        (TorchRL reports a write to ``mark_update`` and then to ``extend``).
        """
        revision = _compat.mutation_revision(self.storage)
        if self.revision == revision and reported_twice:
            return
        coordinates = self.streams.written(index)
        if self.revision not in (revision, revision - 1) or coordinates is None or self.stop is None:
            self.revision = -1  # something else changed the storage too: rebuild at the next sample
            return
        env, start = self.streams.reaching(*coordinates, self.settings[0])
        if env.numel():
            self._fill(env, start)
        self.revision = revision

    def _fill(self, env: torch.Tensor, start: torch.Tensor) -> None:
        m, reward = self._chains(self.streams, env, start)
        if self.stop is None:
            rows = self.streams.num_rows()
            # int8 holds every stop of chains up to 128 steps, the usual case, in a byte
            # (a 1M-step table fits in cache far better than int64's 8 MiB).
            dtype = torch.int8 if self.settings[0] <= 128 else torch.int64
            # Filled in place by later writes, maybe outside an inference_mode() this runs in.
            with torch.inference_mode(False):
                self.stop = torch.zeros(rows, dtype=dtype, device=reward.device)
                self.reward = torch.zeros(rows, *reward.shape[1:], dtype=reward.dtype, device=reward.device)
            # Row m: what a chain stopping at m gives, shaped like one reward.
            stops = torch.arange(self.settings[0])
            self._steps_by_stop, self._discount_by_stop = self._counts(
                stops, (stops.numel(), *reward.shape[1:]), reward.device
            )
        flat = self.streams.flat(env, start).to(self.stop.device)
        self.stop.index_copy_(0, flat, m.to(device=self.stop.device, dtype=self.stop.dtype))
        self.reward.index_copy_(0, flat, reward)
