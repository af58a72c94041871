"""Prioritized n-step replay: starts drawn by priority, chains as :class:`NStepSampler` builds them.

The priority belongs to the start cell ``(time row, env)``: a priority written
back from a TD error of an n-step transition lands on the step the transition
starts at, which is the one drawn again.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from torchrl_ext._checks import check_batch_size, check_state_keys, makes_kept_tensors, read_only
from torchrl_ext.samplers._streams import storage_layout, streams_of
from torchrl_ext.samplers.nstep import NStepSampler
from torchrl_ext.samplers.prioritized import PrioritizedSampler

__all__ = ["PrioritizedNStepSampler"]


def _chain_setting(name: str, doc: str) -> property:
    """The NStepSampler half's ``name``; a new value replaces the half (NStepSampler checks it)."""

    def set_value(self: PrioritizedNStepSampler, value: Any) -> None:
        self._nstep = self._chains_with(**{name: value})

    return property(operator.attrgetter(f"_nstep.{name}"), set_value, doc=doc)


class PrioritizedNStepSampler(PrioritizedSampler):
    r"""n-step transitions whose starts are drawn with probability proportional to priority.

    A stored step ``i`` (one cell of the ``[T, num_envs]`` storage) starts a
    transition with probability :math:`(p_i + \epsilon)^\alpha / \sum_j (p_j +
    \epsilon)^\alpha`. New data's priority and the write-back work as for
    :class:`~torchrl_ext.samplers.PrioritizedSampler`, of which this is a
    subclass; the chain from each start is :class:`~torchrl_ext.samplers.NStepSampler`'s.

    Works on the ``ndim=2`` tensor storages :class:`NStepSampler` reads (``FastMemmapStorage``
    too), not on per-env rings (:class:`~torchrl_ext.storages.EnvRingStorage`): use
    :class:`NStepSampler` there.

    Args:
        max_capacity: number of cells of the storage, ``rows * num_envs``. The
            storage's ``max_size`` when it is a multiple of ``num_envs`` (a
            ``[num_envs, T]`` storage rounds its rows up otherwise).
        alpha: priority exponent, ``>= 0`` (0 gives uniform starts).
        beta: importance-sampling exponent (>= 0, schedulable).
        eps: added to every priority before the exponent. Defaults to 1e-8.

    Keyword Args:
        n_step: maximum steps per transition (``1`` gives plain transitions).
        gamma: discount in ``[0, 1]`` of the summed rewards.
        reward_key, done_key, agent_group: where the chains read rewards and
            episode ends, see :class:`NStepSampler`.
        **kwargs: ``dtype``, ``reduction``, ``max_priority_within_buffer``, ``device``,
            ``initial_priority``, ``weights``, ``fanout``: see :class:`~torchrl_ext.samplers.PrioritizedSampler`.

    Shape contract:
        ``sample(storage, B)`` returns the start coordinates ``(row [B], env
        [B])`` (a buffer stores them as ``"index"`` ``[B, 2]``, which
        ``update_tensordict_priority`` reads back) and ``info`` with
        ``priority_weight`` ``[B]`` plus :class:`NStepSampler`'s entries:
        ``("next", reward)`` ``[B, *reward_shape]`` (the discounted sum),
        ``steps_to_next_obs`` (int64) and ``nstep_discount`` (float32) shaped
        like the reward, and every other ``"next"`` entry taken at the chain
        end. ``update_priority(index, priority)`` takes ``index`` ``[N, 2]``
        (or a tuple of two ``[N]``) and ``priority`` ``[N]``, ``[N, *extra]``
        (reduced with ``reduction``) or a scalar. Through the buffer, give
        ``priority_key`` as ``[B]`` or ``[B, 1]``: TorchRL's buffer flattens the
        extra dims of a priority over a 2-D storage, so reduce per-agent TD
        errors first (or pass them to the sampler's ``update_priority`` with
        ``storage=rb.storage``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import TensorDictReplayBuffer
        >>> from torchrl_ext.samplers import PrioritizedNStepSampler
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> sampler = PrioritizedNStepSampler(16, alpha=1.0, beta=0.5, n_step=3, gamma=0.5)
        >>> rb = TensorDictReplayBuffer(storage=FastTensorStorage(16, ndim=2), sampler=sampler,
        ...                             batch_size=4)
        >>> obs = torch.arange(8.0).reshape(2, 4, 1)  # [num_envs=2, T=4]: env 1 sees 4, 5, 6, 7
        >>> _ = rb.extend(TensorDict({"obs": obs, "next": {
        ...     "obs": obs + 1, "reward": torch.ones(2, 4, 1),
        ...     "done": torch.zeros(2, 4, 1, dtype=torch.bool)}}, [2, 4]))
        >>> rb.update_priority(torch.tensor([[0, 0], [0, 1]]), torch.tensor([0.0, 100.0]))
        >>> batch = rb.sample()  # (row 0, env 1) holds almost all the mass
        >>> batch["index"][0].tolist(), batch["obs"][0].item(), batch["next", "obs"][0].item()
        ([0, 1], 4.0, 7.0)
        >>> batch["next", "reward"][0].item(), batch["steps_to_next_obs"][0].item()
        (1.75, 3)
        >>> batch["td_error"] = torch.full((4,), 0.5)
        >>> rb.update_tensordict_priority(batch)  # written back to the start cells
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        reward_key: Any = ("next", "reward"),
        done_key: Any = ("next", "done"),
        agent_group: str | None = None,
        **kwargs: Any,
    ) -> None:
        # The chain half validates n_step, gamma and the keys first: its
        # messages name the argument, the value and what is allowed.
        self._nstep = NStepSampler(
            n_step, gamma, reward_key=reward_key, done_key=done_key, agent_group=agent_group
        )
        super().__init__(max_capacity, alpha, beta, eps, **kwargs)

    def __repr__(self) -> str:
        group = "" if self.agent_group is None else f", agent_group={self.agent_group!r}"
        return (
            f"{type(self).__name__}(max_capacity={self._capacity}, alpha={self._priority_exponent}, "
            f"beta={self._weight_exponent}, eps={self._priority_offset}, n_step={self.n_step}, gamma={self.gamma}"
            f"{group}, weights={self._weights!r}, device={self.device})"
        )

    # The chain settings live in the NStepSampler this sampler delegates to.
    n_step = _chain_setting("n_step", "Maximum steps per transition; settable (from the next sample on).")
    gamma = _chain_setting("gamma", "Discount of the summed rewards; settable (from the next sample on).")

    reward_key = read_only("_nstep.reward_key", "Key of the rewards summed along a chain.")
    done_key = read_only("_nstep.done_key", "Key of the done flags that stop a chain.")
    agent_group = read_only(
        "_nstep.agent_group", "Key of the agents' group whose agents get their own chains (FP), or ``None``."
    )

    def _chains_with(self, **changes: Any) -> NStepSampler:
        """The chain half with ``changes`` to its ``n_step`` / ``gamma`` (checked by NStepSampler)."""
        chains = self._nstep
        return NStepSampler(
            changes.get("n_step", chains.n_step), changes.get("gamma", chains.gamma),
            reward_key=chains.reward_key, done_key=chains.done_key, agent_group=chains.agent_group,
        )

    # ------------------------------------------------------------------
    # Sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict[Any, Any]]:
        self._check_storage(storage)
        check_batch_size(batch_size)
        # Draws are with replacement, as for PrioritizedSampler: unlike the
        # uniform NStepSampler, no minimum fill is asked for.
        streams = streams_of(self._nstep, storage)
        self._check_capacity(storage)
        # The sum tree's flat leaf of cell (row, env) is row * num_envs + env,
        # the order in which GridStreams counts cells: the parent's draw
        # unravels it into the chain starts.
        (row, env), weights = super().sample(storage, batch_size)
        index, info = self._nstep._chains(streams, env, row)
        info["priority_weight"] = weights["priority_weight"]
        return index, info

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        # The buffer reports every write here (new data gets the default
        # priority): an unsupported storage or a too-small tree fails at the
        # first extend rather than at the first sample.
        if storage is not None:
            self._check_storage(storage)
            self._check_capacity(storage)
        super().mark_update(index, storage=storage)
        self._nstep.mark_update(index, storage=storage)

    def extend(self, index: torch.Tensor | tuple) -> None:
        super().extend(index)
        self._nstep.extend(index)

    add = extend  # as in both halves: PrioritizedSampler.add and NStepSampler.add are their extend

    def _check_storage(self, storage: Any) -> None:
        if isinstance(storage, TensorStorage) and storage.ndim == 2:
            return
        raise TypeError(
            f"{type(self).__name__} supports tensor storages with ndim=2 extended with "
            "[num_envs, T] collector batches (FastTensorStorage(max_size, ndim=2), "
            f"FastMemmapStorage(max_size, ndim=2), LazyTensorStorage(max_size, ndim=2)), got "
            f"{storage_layout(storage)}; for per-env rings (EnvRingStorage) use NStepSampler."
        )

    # ------------------------------------------------------------------
    # Checkpointing: the trees as the parent saves them, plus the chain settings.
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"n_step": self.n_step, "gamma": self.gamma}

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        chains = None
        if "n_step" in state_dict or "gamma" in state_dict:  # a plain PrioritizedSampler's has neither
            check_state_keys(state_dict, ("gamma", "n_step"), f"pass a {type(self).__name__}'s own state_dict()")
            # Built (so checked) before the trees change.
            chains = self._chains_with(n_step=state_dict["n_step"], gamma=state_dict["gamma"])
        super().load_state_dict(state_dict)
        if chains is not None:
            self._nstep = chains
