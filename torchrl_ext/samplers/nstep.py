"""n-step transitions sampled from per-environment rings (HARL's off-policy ``sample``).

For each uniformly drawn start ``(env, p)`` the chain follows the same env
forward up to ``n_step`` steps and stops at the first ``done`` step or at the
env's newest step (whose episode is not known to be over yet). With ``m`` the
index where it stops:

* ``("next", reward) = sum_{k <= m} gamma**k r_{p+k}`` (accumulated in float64),
* every other ``("next", ...)`` entry (observation, ``done``, ``terminated``,
  ``truncated``) comes from step ``p + m``, root entries from step ``p``,
* ``steps_to_next_obs = m + 1``, which TorchRL's TD estimators read at the root
  to use ``gamma ** steps_to_next_obs``, and ``nstep_discount = gamma ** (m + 1)``
  (float32) for losses that take the discount directly.

TorchRL's ``MultiStepTransform`` leaves the done flags of the start step in
place while moving ``("next", obs)`` to the terminal observation, so it
bootstraps past termination; here the flags and the observation always come
from the same step. The chain is computed at sample time, so ``gamma`` and
``n_step`` can change without rewriting the buffer, and a sample costs
``O(batch * n_step)`` (HARL draws a permutation of the whole buffer per call).
"""
from __future__ import annotations

from typing import Any

import torch
from torchrl_ext.samplers.trajectory import StatelessSampler, check_ring_sample
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["NStepSampler"]


class NStepSampler(StatelessSampler):
    """Uniform n-step transitions over the stored steps of an :class:`EnvRingStorage`.

    Args:
        n_step: maximum steps per transition (``1`` gives plain transitions).
        gamma: discount in ``[0, 1]``.

    Keyword Args:
        reward_key, done_key: where the per-step reward and episode end are stored.

    Shape contract:
        ``sample(storage, B)`` returns ``(env, start, end)`` ``[B]`` each; the
        buffer reads root entries at ``start`` and ``"next"`` entries at ``end``.
        Info: ``("next", reward)`` ``[B, *reward_shape]``, ``steps_to_next_obs``
        (int64) and ``nstep_discount`` (float32), shaped like the reward.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> from torchrl_ext.samplers import NStepSampler
        >>> rb = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=NStepSampler(3, gamma=0.5))
        >>> for t in range(4):  # rewards 1, 1, 1, 1; the episode ends at step 2
        ...     _ = rb.extend(TensorDict({"obs": torch.tensor([[float(t)]]), "next": {
        ...         "obs": torch.tensor([[t + 1.0]]), "reward": torch.ones(1, 1),
        ...         "done": torch.tensor([[t == 2]])}}, [1]))
        >>> batch = rb.storage.get((torch.tensor([0]), torch.tensor([1]), torch.tensor([2])))
        >>> batch["obs"].item(), batch["next", "obs"].item(), batch["next", "done"].item()
        (1.0, 3.0, True)
    """

    def __init__(
        self,
        n_step: int = 1,
        gamma: float = 0.99,
        *,
        reward_key: Any = ("next", "reward"),
        done_key: Any = ("next", "done"),
    ) -> None:
        super().__init__()
        if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
            raise ValueError(f"n_step must be an int >= 1, got n_step={n_step!r}.")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be a number in [0, 1], got gamma={gamma!r}.")
        self.n_step, self.gamma = n_step, float(gamma)
        self.reward_key, self.done_key = reward_key, done_key

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_step={self.n_step}, gamma={self.gamma})"

    def _leaf(self, storage: EnvRingStorage, key: Any) -> torch.Tensor:
        leaf = storage.flat_leaf(key)
        if leaf is None:
            raise ValueError(
                f"{type(self).__name__} needs {key!r} in the stored data (set reward_key / "
                "done_key to where your transitions keep them)."
            )
        return leaf

    def sample(self, storage: EnvRingStorage, batch_size: int) -> tuple[Any, dict[Any, torch.Tensor]]:
        check_ring_sample(self, storage, batch_size, "follows env streams in")
        env, start = storage._rand_given_ndim(batch_size)  # raises on an empty storage
        steps = start.unsqueeze(1) + torch.arange(self.n_step)
        newest = (storage._current_pos[env] - 1).unsqueeze(1)
        steps = torch.minimum(steps, newest)
        flat = storage._flat_index(env.unsqueeze(1).expand_as(steps), steps).reshape(-1)
        done = self._leaf(storage, self.done_key).index_select(0, flat)
        done = done.reshape(batch_size, self.n_step, -1).any(-1).cpu()
        stop = done | (steps == newest)
        # First stop along the chain (a chain of n steps without one ends at n - 1).
        m = torch.where(stop.any(1), stop.to(torch.int8).argmax(1), self.n_step - 1)
        reward = self._leaf(storage, self.reward_key).index_select(0, flat)
        reward = reward.reshape(batch_size, self.n_step, *reward.shape[1:])
        k = torch.arange(self.n_step)
        weight = torch.where(k <= m.unsqueeze(1), self.gamma ** k.double(), 0.0)
        weight = weight.to(reward.device).reshape(batch_size, self.n_step, *(1,) * (reward.dim() - 2))
        total = (weight * reward.double()).sum(1).to(reward.dtype)
        count = (m + 1).to(reward.device).reshape(batch_size, *(1,) * (reward.dim() - 2)).expand(total.shape)
        info = {
            self.reward_key: total,
            "steps_to_next_obs": count.clone(),
            "nstep_discount": (self.gamma ** count.double()).float(),
        }
        return (env, start, start + m), info

