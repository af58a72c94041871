"""A ring of steps whose advantages are computed one finished path at a time (l2r's PPOBuffer).

A path is an episode, or the part of it an epoch end cut off; it may wrap across the ring's end.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl_ext import _compat
from torchrl_ext._checks import (
    CheckedSetting, check_device, check_finite, check_int, check_real, makes_kept_tensors,
)
from torchrl_ext._keys import has_leaf, nested_key
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.uniform import DistinctUniformSampler
from torchrl_ext.storages.fast import FastTensorStorage
from torchrl_ext.value.functional import generalized_advantage_estimate

__all__ = ["PathGAEReplayBuffer"]

_DERIVED = ("advantage", "value_target")


class PathGAEReplayBuffer(TensorDictReplayBuffer):
    """Steps in a ring, GAE per finished path, distinct uniform minibatches.

    Args:
        size: ring capacity (steps).
        batch_size: items per :meth:`sample_batch` (fewer while fewer steps are finished).

    Keyword Args:
        gamma, lam: discount and GAE lambda, in ``[0, 1]``.
        eps: added to the (population) std when normalising advantages, ``>= 0``.
        reward_key, value_key: where a stored step keeps its reward and ``V(s)``.
        device: where the ring lives.
        generator: RNG of the minibatch draws.

    Shape contract:
        :meth:`store` takes one step ``[]`` or a batch of consecutive steps
        ``[n]`` of one path; :meth:`sample_batch` returns ``[min(batch_size,
        finished)]`` with ``advantage`` and ``value_target`` added.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import PathGAEReplayBuffer
        >>> rb = PathGAEReplayBuffer(8, 4, gamma=0.5, lam=1.0)
        >>> rb.store(TensorDict({"observation": torch.zeros(3, 2), "state_value": torch.zeros(3, 1),
        ...     "next": {"reward": torch.ones(3, 1)}}, [3]))
        >>> rb.finish_path(last_val=0.0)
        >>> rb.storage[:3]["value_target"][:, 0].tolist()  # rewards-to-go
        [1.75, 1.5, 1.0]
        >>> rb.sample_batch().shape
        torch.Size([3])
    """

    gamma = CheckedSetting(check_real, "Discount in ``[0, 1]``; settable (used by the next finish_path).",
                           low=0.0, high=1.0)
    lam = CheckedSetting(check_real, "GAE lambda in ``[0, 1]``; settable (used by the next finish_path).",
                         low=0.0, high=1.0)
    eps = CheckedSetting(check_real, "Added to the advantages' std, ``>= 0``; settable (used by the next "
                         "sample_batch).", low=0.0)

    @makes_kept_tensors  # which steps are finished: updated in place later, maybe outside inference_mode
    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        gamma: float = 0.99,
        lam: float = 0.95,
        eps: float = 1e-3,
        reward_key: Any = ("next", "reward"),
        value_key: Any = "state_value",
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        check_int("size", size, minimum=1)
        check_int("batch_size", batch_size, minimum=1)
        self.gamma, self.lam, self.eps = gamma, lam, eps
        self.reward_key, self.value_key = nested_key(reward_key, "reward_key"), nested_key(value_key, "value_key")
        self._finished = torch.zeros(size, dtype=torch.bool)
        self._path_length = 0  # steps stored since the last finish_path
        super().__init__(
            storage=FastTensorStorage(size, device=check_device("device", device), strict=True),
            sampler=DistinctUniformSampler(among=self._finished_steps),
            batch_size=batch_size,
            generator=generator,
        )

    # ------------------------------------------------------------------
    def _finished_steps(self, storage: Any) -> torch.Tensor:
        return self._finished[: len(storage)].nonzero().squeeze(1)

    def store(self, step: TensorDictBase) -> None:
        """Appends one step (or ``[n]`` consecutive steps of the current path)."""
        if not isinstance(step, TensorDictBase):
            raise TypeError(f"step must be a TensorDict, got {type(step).__name__}.")
        batch = step if step.batch_dims else step.unsqueeze(0)
        for key in (self.reward_key, self.value_key):
            if not has_leaf(batch, key):
                raise ValueError(
                    f"step has no {key!r}; store the reward under reward_key and V(s) under value_key."
                )
        # finish_path pairs each reward with its V(s) element-wise: another shape would be
        # stored now and make every later finish_path fail.
        reward_shape, value_shape = batch.get(self.reward_key).shape, batch.get(self.value_key).shape
        if reward_shape != value_shape:
            raise ValueError(
                f"step[{self.reward_key!r}] has shape {list(reward_shape)} but step[{self.value_key!r}] "
                f"has shape {list(value_shape)}; store one reward per value, e.g. both [n, 1]."
            )
        steps, size = batch.shape[0], self.storage.max_size
        # A path longer than the ring keeps its newest steps, as storing them one by one does.
        batch = batch[steps - size:] if steps > size else batch.clone(False)
        for key in _DERIVED:  # filled by finish_path
            batch.set(key, torch.zeros_like(batch.get(self.value_key)))
        index = self.extend(batch)
        self._finished[index] = False
        self._path_length += steps

    @torch.no_grad()  # targets, as OnPolicyReplayBuffer.compute_returns: no graph through V
    def finish_path(self, last_val: float | torch.Tensor = 0.0) -> None:
        """GAE and rewards-to-go over the steps stored since the previous call.

        Args:
            last_val: ``0`` when the path ended in a terminal state, else
                ``V(s_T)`` of the state after its last step.
        """
        size = self.storage.max_size
        length = min(self._path_length, size)  # older steps of a longer path were overwritten
        if length == 0:
            return
        end = _compat.writer_cursor(self.writer)  # one past the newest step
        index = (end - length + torch.arange(length)) % size
        stored = _compat.stored_data(self.storage)
        reward = stored.get(self.reward_key)[index]
        value = stored.get(self.value_key)[index]
        last = _last_value(last_val, value)
        next_value = torch.cat([value[1:], last.expand(1, *value.shape[1:])])
        never = torch.zeros_like(reward, dtype=torch.bool)
        advantage, advantage_1 = (
            generalized_advantage_estimate(self.gamma, lam, value, next_value, reward, never, never, time_dim=0)[0]
            for lam in (self.lam, 1.0)
        )
        self._path_length = 0
        stored.get("advantage")[index] = advantage
        stored.get("value_target")[index] = advantage_1 + value  # bootstrapped rewards-to-go
        self._finished[index] = True

    def sample_batch(self) -> TensorDictBase:
        """Distinct finished steps with advantages normalised over all finished steps."""
        finished = self._finished_steps(self.storage)
        if finished.numel() == 0:
            raise RuntimeError("no finished path to sample from: call finish_path() after a path ends.")
        advantage = _compat.stored_data(self.storage).get("advantage")[finished]
        mean, std = advantage.mean(), advantage.std(correction=0)
        batch = self.sample()
        batch.set("advantage", (batch.get("advantage") - mean) / (std + self.eps))
        return batch

    def _extra_state(self) -> dict[str, Any]:
        """Adds which steps are finished and the current path's length (saved by ``dumps`` and ``state_dict``)."""
        state = super()._extra_state()
        state["finished"], state["path_length"] = [self._finished.clone()], self._path_length
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        finished = state["finished"][0]
        if finished.shape != self._finished.shape:
            raise ValueError(
                f"the checkpoint's ring holds {finished.numel()} steps but this buffer's size is "
                f"{self._finished.numel()}; build it with size={finished.numel()}."
            )
        self._finished.copy_(finished)
        self._path_length = int(state["path_length"])


def _last_value(last_val: Any, value: torch.Tensor) -> torch.Tensor:
    """``last_val`` as one row shaped like a stored value, checked finite."""
    try:  # torch refuses str and bytes here too
        last = torch.as_tensor(last_val, dtype=value.dtype, device=value.device)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"last_val must be a number or a tensor, got last_val={last_val!r}.") from error
    width = value.shape[1:].numel()
    if last.numel() != width:
        raise ValueError(
            f"last_val must hold {width} value(s) (one V(s_T) per stored value), got shape {list(last.shape)}."
        )
    check_finite("last_val", last, "the path is still open; pass 0 at a terminal state, else a finite V(s_T).")
    return last.reshape(1, *value.shape[1:])
