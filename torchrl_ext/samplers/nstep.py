"""n-step transitions sampled along per-env streams (HARL's off-policy ``sample``).

For each uniformly drawn start ``(env, p)`` the chain follows the same env
forward up to ``n_step`` steps and stops at the first ``done`` step or at the
env's newest step (whose episode is not known to be over yet). With ``m`` the
index where it stops:

* ``("next", reward) = sum_{k <= m} gamma**k r_{p+k}`` (its dtype: :class:`NStepSampler`'s Info),
* every other ``("next", ...)`` entry (observation, ``done``, ``terminated``,
  ``truncated``, ``available_actions``) comes from step ``p + m``, root entries
  (observation, action, ``valid_transitions``, ``available_actions``) from ``p``,
* ``steps_to_next_obs = m + 1``, which TorchRL's TD estimators read at the root
  to use ``gamma ** steps_to_next_obs``, and ``nstep_discount = gamma ** (m + 1)``
  (float32) for losses that take the discount directly.

Multi-agent layouts live in the keys. EP (team reward, env-level done, a
shared ``"state"``) needs nothing more. FP (``agent_group="agents"``) keeps
per-agent rewards and dones under ``("next", "agents")``, ``[..., A, ...]``:
each agent gets its own chain stopping at its own done, and every
``("next", "agents", ...)`` entry comes from that agent's chain end, with
``("agents", "steps_to_next_obs")`` and ``("agents", "nstep_discount")`` per
agent. Env-level ``"next"`` entries follow the env-level chain: it stops at
``done_key`` when stored, else where the last agent chain stops.

TorchRL's ``MultiStepTransform`` leaves the done flags of the start step in
place while moving ``("next", obs)`` to the terminal observation, so it
bootstraps past termination; here the flags and the observation always come
from the same step. The buffer keeps the one-step data: ``gamma`` and
``n_step`` can change without rewriting it.

Chains are looked up in a :mod:`~torchrl_ext.samplers._chain_table` (``O(batch)`` per sample) or
walked (FP, shared memory: ``O(batch * n_step)``); see :meth:`NStepSampler._table`.
"""
from __future__ import annotations

from typing import Any

import torch

from torchrl_ext._checks import CheckedSetting, check_batch_size, check_int, check_real
from torchrl_ext._keys import nested_key
from torchrl_ext.samplers._chain_table import ChainTable
from torchrl_ext.samplers._streams import streams_of
from torchrl_ext.samplers.trajectory import StatelessSampler

__all__ = ["NStepSampler"]


def _check_key(name: str, key: Any) -> Any:
    """``key`` as a TensorDict key (a list becomes a tuple); ``TypeError`` naming ``name`` otherwise."""
    return nested_key(key, name)


def _check_group(name: str, group: Any) -> str | None:
    """``group``, a non-empty str or ``None``; ``TypeError`` otherwise."""
    if group is not None and (not isinstance(group, str) or not group):
        raise TypeError(
            f"{name} must be the name of the agents' group key (e.g. 'agents') or None, got {name}={group!r}."
        )
    return group


class NStepSampler(StatelessSampler):
    """Uniform n-step transitions over per-env streams, single-agent, EP or FP.

    Works on an :class:`~torchrl_ext.storages.EnvRingStorage` (any subset of
    envs per write) and on a tensor storage with ``ndim=2``
    (``FastTensorStorage(max_size, ndim=2)`` or TorchRL's ``LazyTensorStorage``)
    extended with ``[num_envs, T]`` collector batches, which TorchRL stores
    time-major as ``[T_max, num_envs]``.

    Args:
        n_step: maximum steps per transition (``1`` gives plain transitions).
        gamma: discount in ``[0, 1]``.

    Keyword Args:
        reward_key, done_key: env-level reward and episode end. With
            ``agent_group`` set they are optional (FP layouts may keep only
            per-agent ones).
        agent_group: FP layout: the group key whose ``("next", group, "reward")``
            and ``("next", group, "done")`` ``[..., A, 1]`` drive per-agent chains.

    Shape contract:
        ``sample(storage, B)`` returns ``(env, start, end)`` ``[B]`` each on
        rings (the buffer reads root entries at ``start`` and ``"next"`` entries
        at ``end``) or ``(time, env)`` start coordinates on ``[T, E]`` storages.
        Info: ``("next", reward)`` ``[B, *reward_shape]`` (a floating reward keeps its
        dtype, an integer or bool one gives ``torch.get_default_dtype()``), ``steps_to_next_obs``
        (int64) and ``nstep_discount`` (float32) shaped like the reward, plus
        every ``"next"`` entry taken at a chain end where the storage does not
        read chains itself (``[T, E]`` storages, FP agents).

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
        agent_group: str | None = None,
    ) -> None:
        super().__init__()
        # Checked by the setters, which also check later assignments.
        self.n_step, self.gamma = n_step, gamma
        self.agent_group, self.reward_key, self.done_key = agent_group, reward_key, done_key

    n_step = CheckedSetting(
        check_int, "Maximum steps per transition, an int ``>= 1``; settable (takes effect at the next sample).",
        minimum=1,
    )
    gamma = CheckedSetting(
        check_real, "Discount in ``[0, 1]``; settable (takes effect at the next sample).", low=0.0, high=1.0
    )
    reward_key = CheckedSetting(_check_key, "Key of the env-level rewards summed along a chain; settable.")
    done_key = CheckedSetting(_check_key, "Key of the env-level done flags that stop a chain; settable.")
    agent_group = CheckedSetting(
        _check_group, "Key of the agents' group whose agents get their own chains (FP), or ``None``; settable.",
    )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Views of a storage and what is derived from it: rebuilt on the next sample.
        state.pop("_chain_table", None)
        state.pop("_walked", None)
        return state

    def __repr__(self) -> str:
        group = "" if self.agent_group is None else f", agent_group={self.agent_group!r}"
        return f"{type(self).__name__}(n_step={self.n_step}, gamma={self.gamma}{group})"

    def _leaf(self, streams: Any, key: Any) -> torch.Tensor:
        leaf = streams.leaf(key)
        if leaf is None:
            raise ValueError(
                f"{type(self).__name__} needs {key!r} in the stored data (set reward_key / "
                "done_key / agent_group to where your transitions keep them)."
            )
        return leaf

    def sample(self, storage: Any, batch_size: int) -> tuple[Any, dict[Any, Any]]:
        streams = self._streams(storage, batch_size)
        env, start = streams.draw(batch_size)
        return self._chains(streams, env, start)

    def _streams(self, storage: Any, batch_size: int) -> Any:
        """The stream view of ``storage`` once ``batch_size`` and the fill level are checked."""
        check_batch_size(batch_size)
        streams = streams_of(self, storage)
        stored = streams.stored()
        if stored == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        # A frame-stacking ring cannot read each env's oldest steps: they are stored, not drawn.
        lookback = getattr(storage, "required_lookback", 0)
        if lookback and not (storage.size_array > lookback).any():
            raise ValueError(
                f"no env holds a step to start a transition from after ignoring {lookback} earliest "
                f"steps, whose frame stacks the storage cannot rebuild (steps per env: "
                f"{storage.sizes.tolist()}); add more data."
            )
        if stored < batch_size:
            raise ValueError(
                f"{type(self).__name__} needs at least batch_size={batch_size} stored transitions, "
                f"the buffer holds {stored}: collect more first (a warm-up) or sample fewer."
            )
        return streams

    def _chains(self, streams: Any, env: torch.Tensor, start: torch.Tensor) -> tuple[Any, dict[Any, Any]]:
        """The n-step chains from the drawn starts ``(env, start)`` ``[B]``: ``(index, info)``.

        Shared by every way of drawing starts (uniform here, by priority in
        :class:`~torchrl_ext.samplers.PrioritizedNStepSampler`).
        """
        info: dict[Any, Any] = {}
        if self.agent_group is None:  # env-level chains: looked up in the chain table, or walked
            table = self._table(streams, env.shape[0])
            if table is not None:
                m, reward, steps, discount = table.lookup(streams.flat(env, start))
            else:
                m, reward = self._chain_values(streams, env, start)
                steps, discount = self._counts(m, reward.shape, reward.device)
        else:  # FP: the agents' chains first, then the env-level one
            done_leaf, reward_leaf = streams.leaf(self.done_key), streams.leaf(self.reward_key)
            to_newest, flat = self._chain_rows(streams, env, start)
            agent_end = self._agent_chains(streams, flat, to_newest, info)
            if done_leaf is not None:
                m = self._stop_index(done_leaf, flat, to_newest, agent_dims=0)
            else:  # FP without an env-level done: the env chain ends with the last agent's
                m = agent_end.amax(1)
            reward = None if reward_leaf is None else self._discounted_sum(reward_leaf, flat, m, agent_dims=0)
            if reward is None:
                steps, discount = self._counts(m, (env.shape[0], 1), flat.device)
            else:
                steps, discount = self._counts(m, reward.shape, reward_leaf.device)
        end = start + m.to(start.device)
        if not streams.reads_chains:
            self._next_entries(streams, streams.flat(env, end), info)
        if reward is not None:
            info[self.reward_key] = reward
        info["steps_to_next_obs"], info["nstep_discount"] = steps, discount
        return streams.index(env, start, end), info

    def _next_entries(self, streams: Any, end_flat: torch.Tensor, info: dict[Any, Any]) -> None:
        """Every ``"next"`` leaf at the chain ends ``end_flat`` into ``info`` (FP agents' own aside)."""
        for key, leaf in streams.leaves_under(("next",)):
            if self.agent_group is None or key[:2] != ("next", self.agent_group):
                info[key] = leaf.index_select(0, end_flat.to(leaf.device))

    def _chain_settings(self) -> tuple:
        """Everything the chain table is computed from besides the stored data."""
        return (self.n_step, self.gamma, self.reward_key, self.done_key, self.agent_group)

    def _table(self, streams: Any, batch_size: int) -> ChainTable | None:
        """The chain table of ``streams``' storage, current, or ``None``: walk this sample's chains.

        A stale table is rebuilt at once when it had served at least the
        buffer's size in lookups (a one-off change: a load, a new ``gamma``).
        Otherwise the chains are walked until the walks have cost about one
        rebuild, so storage writes the sampler is never told about (a
        ``storage.set`` before every sample) cost at most twice the walks.
        Storages in shared memory are written by other processes, which cannot
        report to this sampler: their chains are always walked.
        """
        table = self.__dict__.get("_chain_table")
        settings = self._chain_settings()
        if table is not None and table.current(streams, settings):
            table.served += batch_size
            return table
        if streams.shared():
            return None
        stored = streams.stored()
        walked = self.__dict__.get("_walked", 0)
        if table is None or table.served >= stored or walked >= stored:
            table = self._chain_table = ChainTable(streams, settings, self._chain_values, self._counts)
            self._walked = 0
            table.served += batch_size
            return table
        self._walked = walked + batch_size
        return None

    def _chain_values(
        self, streams: Any, env: torch.Tensor, start: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Walks the chains from ``(env, start)`` ``[K]``: stop index ``m`` and n-step reward."""
        done_leaf = self._leaf(streams, self.done_key)
        reward_leaf = self._leaf(streams, self.reward_key)
        to_newest, flat = self._chain_rows(streams, env, start)
        m = self._stop_index(done_leaf, flat, to_newest, agent_dims=0)
        return m, self._discounted_sum(reward_leaf, flat, m, agent_dims=0)

    def _chain_rows(
        self, streams: Any, env: torch.Tensor, start: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps from each start to its env's newest step ``[K]``, and the flat rows of its
        ``n_step`` chain steps ``[K, n_step]`` (steps past the newest one are held there)."""
        to_newest = streams.steps_to_newest(env, start)
        steps = start.unsqueeze(1) + torch.minimum(torch.arange(self.n_step, device=to_newest.device), to_newest.unsqueeze(1))
        return to_newest, streams.flat(env.unsqueeze(1).expand_as(steps), steps)

    # ------------------------------------------------------------------
    # Writes: the buffer reports each one; the chain table follows them.
    def extend(self, index: Any) -> None:
        self._written(index, reported_twice=True)

    add = extend

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        self._written(index, reported_twice=False)

    def _written(self, index: Any, *, reported_twice: bool) -> None:
        table = self.__dict__.get("_chain_table")
        if table is None:  # none yet: the first sample builds it from the whole buffer
            return
        if table.settings != self._chain_settings():
            # The new rows' chains would be computed with today's settings into a table of
            # others: if the settings came back, the table would look current but mix both.
            del self.__dict__["_chain_table"]
            return
        table.written(index, reported_twice=reported_twice)

    def _counts(self, m: torch.Tensor, shape: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``steps_to_next_obs = m + 1`` and ``nstep_discount = gamma**(m + 1)`` (float32), reward-shaped."""
        discount = (self.gamma ** torch.arange(1, self.n_step + 1).double()).float()
        discount = discount.index_select(0, m.reshape(-1).cpu()).reshape(m.shape)
        return _like(m + 1, shape, device), _like(discount, shape, device)

    # ------------------------------------------------------------------
    def _stop_index(
        self, done_leaf: torch.Tensor, flat: torch.Tensor, to_newest: torch.Tensor, agent_dims: int
    ) -> torch.Tensor:
        """First step of each chain that is done or newest, ``[B]`` (``[B, A]`` per agent)."""
        batch = flat.shape[0]
        done = done_leaf.index_select(0, flat.reshape(-1).to(done_leaf.device))
        done = done.reshape(batch, self.n_step, *done.shape[1:1 + agent_dims], -1).any(-1).cpu()
        done[:, -1] = True  # a chain of n steps ends at n - 1
        first_done = done.to(torch.int8).argmax(1)
        return torch.minimum(first_done, to_newest.reshape(batch, *(1,) * agent_dims))

    def _discounted_sum(
        self, reward_leaf: torch.Tensor, flat: torch.Tensor, m: torch.Tensor, agent_dims: int
    ) -> torch.Tensor:
        batch = flat.shape[0]
        reward = reward_leaf.index_select(0, flat.reshape(-1).to(reward_leaf.device))
        reward = reward.reshape(batch, self.n_step, *reward.shape[1:])
        k = torch.arange(self.n_step, device=reward.device)
        powers = (self.gamma ** torch.arange(self.n_step).double()).to(reward.device)
        # gamma**k up to each chain's stop m, 0 after it (float64): [B, n, *agents]
        weight = torch.where(k <= m.to(reward.device).unsqueeze(-1), powers, 0.0).movedim(-1, 1)
        weight = weight.reshape(*weight.shape, *(1,) * (reward.dim() - weight.dim()))
        # A discounted sum of integer (or bool) rewards is fractional: it gets torch's default float dtype.
        dtype = reward.dtype if reward.is_floating_point() else torch.get_default_dtype()
        return (weight * reward.double()).sum(1).to(dtype)

    def _agent_chains(
        self, streams: Any, flat: torch.Tensor, to_newest: torch.Tensor, info: dict[Any, Any]
    ) -> torch.Tensor:
        """FP: per-agent chain ends ``[B, A]``; fills ``info`` with the group's n-step entries."""
        group = self.agent_group
        done_key, reward_key = ("next", group, "done"), ("next", group, "reward")
        done_leaf = self._leaf(streams, done_key)
        reward_leaf = self._leaf(streams, reward_key)
        if done_leaf.dim() < 3:  # flat rows, agents, flag
            raise ValueError(
                f"{done_key!r} must hold one flag per agent, [..., num_agents, 1]; got per-step "
                f"shape {tuple(done_leaf.shape[1:])}."
            )
        num_agents = done_leaf.shape[1]
        m = self._stop_index(done_leaf, flat, to_newest, agent_dims=1)  # [B, A]
        end_flat = flat.gather(1, m)  # [B, A]: each agent's chain end
        agent = torch.arange(num_agents)
        for key, leaf in streams.leaves_under(("next", group)):
            if leaf.dim() < 2 or leaf.shape[1] != num_agents:
                raise ValueError(
                    f"{key!r} has per-step shape {tuple(leaf.shape[1:])}; entries under "
                    f"('next', {group!r}) need the agent dim first ({num_agents} agents)."
                )
            rows = (end_flat * num_agents + agent).reshape(-1).to(leaf.device)
            picked = leaf.reshape(-1, *leaf.shape[2:]).index_select(0, rows)
            info[key] = picked.reshape(*m.shape, *leaf.shape[2:])
        info[reward_key] = self._discounted_sum(reward_leaf, flat, m, agent_dims=1)
        count, discount = self._counts(m, info[reward_key].shape, reward_leaf.device)
        info[(group, "steps_to_next_obs")], info[(group, "nstep_discount")] = count, discount
        return m


def _like(value: torch.Tensor, shape: Any, device: torch.device) -> torch.Tensor:
    """``value`` ``[B, *agents]`` broadcast to the reward's shape (a fresh copy)."""
    value = value.reshape(*value.shape, *(1,) * (len(shape) - value.dim())).to(device)
    return value if value.shape == shape else value.expand(shape).clone()
