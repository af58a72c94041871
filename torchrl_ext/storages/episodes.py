"""Per-env rings with an episode index and recorded discounted returns (ALF's ``keep_episodic_info``).

For every stored step the storage knows where its episode began and where
it ends (or the newest step so far), even after the episode's first step
has been overwritten, and, with ``record_episodic_return``, each step's
discounted return once its episode has ended.

Bookkeeping per slot (``[E, L]``, beside the data):

* ``is_first``: the step begins an episode;
* ``indexed``: for a first step, the newest position of its episode written
  so far; for any other step, its episode's first position;
* ``headless`` (``[E]``): the newest position of the episode whose first
  step was overwritten last (only one such episode can still be stored);
* with returns: ``disc0`` (the latest position <= this one that begins an
  episode or has discount 0) and ``returns``.

Returns follow ALF: when a step ``T`` with discount 0 arrives, every stored
step ``j`` from the previous discount-0 step (or the episode start) gets
``G_j = sum_{k=j}^{T-1} gamma^(k-j) discount[k] clip(reward[k+1])``, computed
by the backward recursion ``G_j = discount[j] clip(reward[j+1]) + gamma G_{j+1}``
(no ``gamma ** k`` factors, so it stays finite for episodes of any length;
ALF overflows to NaN past about 10,000 steps, Q11). Steps of unfinished or
time-limited episodes keep ``default_return``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_ext._checks import bounds, check_bool, check_real, makes_kept_tensors
from torchrl_ext._keys import nested_key
from torchrl_ext.storages.ring import EnvRingStorage
from torchrl_ext.value.functional import discounted_cumsum

__all__ = ["EpisodicEnvRingStorage"]

RETURN_KEY = "discounted_return"


class EpisodicEnvRingStorage(EnvRingStorage):
    """:class:`EnvRingStorage` that indexes episodes and can record discounted returns.

    Args:
        num_envs, max_length: ring geometry.

    Keyword Args:
        step_type_key: key marking episode starts: ALF's ``step_type``
            (``0`` = FIRST) or a bool such as TorchRL's ``"is_init"``.
        record_episodic_return: compute returns when episodes end (needs
            ``discount_key`` and ``reward_key`` in the data).
        gamma: discount of the recorded returns.
        reward_clip: ``(low, high)`` applied to rewards first, or ``None``.
        default_return: return of steps whose episode has not ended.
        discount_key, reward_key: ALF's per-step ``discount`` (0 at a terminal
            step) and ``reward`` (received on arriving at the step).
        device: see :class:`EnvRingStorage`.

    Shape contract:
        Queries take positions and env ids of one shape and return int64 of
        that shape; ``get`` adds ``"discounted_return"`` (float32) when
        returns are recorded.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> from torchrl_ext.storages import EpisodicEnvRingStorage
        >>> storage = EpisodicEnvRingStorage(1, 8, record_episodic_return=True, gamma=0.5)
        >>> rb = EnvRingReplayBuffer(storage=storage)
        >>> for step_type, discount, reward in [(0, 1.0, 0.0), (1, 1.0, 1.0), (2, 0.0, 2.0)]:
        ...     _ = rb.extend(TensorDict({"step_type": torch.tensor([step_type]),
        ...         "discount": torch.tensor([discount]), "reward": torch.tensor([reward])}, [1]))
        >>> storage.get((torch.tensor([0, 0, 0]), torch.arange(3)))["discounted_return"].tolist()
        [2.0, 2.0, -1000.0]
        >>> storage.steps_to_episode_end(torch.tensor([0]), torch.tensor([0])).tolist()
        [2]
    """

    @makes_kept_tensors  # the episode index, updated in place later, maybe outside inference_mode
    def __init__(
        self,
        num_envs: int,
        max_length: int,
        *,
        step_type_key: Any = "step_type",
        record_episodic_return: bool = False,
        gamma: float = 0.99,
        reward_clip: tuple[float, float] | None = None,
        default_return: float = -1000.0,
        discount_key: Any = "discount",
        reward_key: Any = "reward",
        device: torch.device | str = "cpu",
        time_major: bool | None = None,
    ) -> None:
        record_episodic_return = check_bool("record_episodic_return", record_episodic_return)
        super().__init__(num_envs, max_length, device=device, time_major=time_major)
        check_real("gamma", gamma, low=0.0, high=1.0)
        if reward_clip is not None and (len(reward_clip) != 2 or not reward_clip[0] <= reward_clip[1]):
            raise ValueError(
                f"reward_clip must be (low, high) with low <= high, got reward_clip={reward_clip!r}."
            )
        self.step_type_key = None if step_type_key is None else nested_key(step_type_key, "step_type_key")
        self.discount_key = nested_key(discount_key, "discount_key")
        self.reward_key = nested_key(reward_key, "reward_key")
        self.record_episodic_return = record_episodic_return
        self.gamma, self.reward_clip = float(gamma), reward_clip
        self.default_return = check_real("default_return", default_return, low=-math.inf)
        shape = (num_envs, max_length)
        self._is_first = torch.zeros(shape, dtype=torch.bool)
        self._indexed = torch.zeros(shape, dtype=torch.long)
        self._headless = torch.zeros(num_envs, dtype=torch.long)
        self._disc0 = torch.zeros(shape, dtype=torch.long)
        self._returns = torch.full(shape, self.default_return)

    # ------------------------------------------------------------------
    @torch.no_grad()  # see EnvRingStorage.write_at
    def write_at(
        self, env: torch.Tensor, position: torch.Tensor, data: TensorDictBase, *, set_cursor: bool,
        first: torch.Tensor | None = None,
    ) -> None:
        """The ring's write, then the episode index of the written steps. ``first`` (which
        steps begin an episode) is read from ``data`` unless a subclass already has it."""
        if first is None:
            first = self._first_flags(data, env)
        discount = self._step_values(data, self.discount_key) if self.record_episodic_return else None
        if discount is not None:
            self._step_values(data, self.reward_key)  # the returns read it: refused before any write
        if discount is not None and discount.numel():
            low, high = bounds(discount)
            if not (0 <= low and high <= 1):  # NaN fails both
                raise ValueError(
                    f"{self.discount_key!r} must hold discounts in [0, 1], got values in "
                    f"[{low}, {high}]; nothing was written."
                )
        super().write_at(env, position, data, set_cursor=set_cursor)
        if env.ndim == 1:  # one step per env (envs stepped together): a block of one step
            env, position, first = env.unsqueeze(1), position.unsqueeze(1), first.reshape(-1, 1)
            discount = None if discount is None else discount.reshape(-1, 1)
        size0 = self._rings.size[env[:, 0].cpu()]  # the cursors move after the write
        if env.shape[1] > 1 and self._continues_quietly(env, position, first, size0, discount):
            self._continue_block(env, position)
            return
        for t in range(env.shape[1]):  # steps of one env must be indexed in order
            self._index_step(env[:, t], position[:, t], first[:, t].reshape(-1).cpu())
            if discount is not None:
                size = (size0 + t).clamp_(max=self.max_length)  # stored before step t
                self._record_step(env[:, t], position[:, t], discount[:, t].reshape(-1).cpu(), size)

    def write_step(self, data: TensorDictBase, skip_key: Any = None) -> int | None:
        """:meth:`EnvRingStorage.write_step` through :meth:`write_at`, for the episode index's
        bookkeeping: ``None`` only where the envs stand apart or nothing is stored yet."""
        position = None if self._rings.data is None else self._rings.common_position()
        if position is None:
            return None
        if skip_key is not None:
            data = data.exclude(skip_key)
        self.write_at(torch.arange(self.num_envs), torch.full((self.num_envs,), position), data, set_cursor=True)
        self.advance(None, 1)
        return position

    def _continues_quietly(
        self, env: torch.Tensor, pos: torch.Tensor, first: torch.Tensor, size0: torch.Tensor,
        discount: torch.Tensor | None,
    ) -> bool:
        """Whether a ``[N, T]`` block only extends open episodes: no start, no discount 0,
        no episode head overwritten. Long episodes then cost a few kernels per block."""
        first = first.reshape(env.shape).cpu()
        if bool(first.any()) or bool((pos[:, 0] == 0).any()):
            return False
        if discount is not None and bool((discount.reshape(env.shape) == 0).any()):
            return False
        slots = pos % self.max_length
        overwritten = (pos >= self.max_length) & self._is_first[env, slots]
        return not bool(overwritten.any())

    def _continue_block(self, env: torch.Tensor, pos: torch.Tensor) -> None:
        length = self.max_length
        slots = pos % length
        rows = env[:, 0]
        begin = self._indexed[rows, (pos[:, 0] - 1) % length]
        self._is_first[env, slots] = False
        self._indexed[env, slots] = begin.unsqueeze(1).expand_as(pos)
        last = pos[:, -1]
        # Same outcome as indexing the steps one by one: the head keeps the newest
        # position while it is stored, the headless record takes it otherwise.
        head_stored = begin > last - length
        self._indexed[rows[head_stored], begin[head_stored] % length] = last[head_stored]
        self._headless[rows[~head_stored]] = last[~head_stored]
        if self.record_episodic_return:
            prev = self._disc0[rows, (pos[:, 0] - 1) % length]
            self._disc0[env, slots] = prev.unsqueeze(1).expand_as(pos)
            self._returns[env, slots] = self.default_return

    def _first_flags(self, data: TensorDictBase, env: torch.Tensor) -> torch.Tensor:
        """Bool ``[N]`` / ``[N, T]``: which written steps begin an episode."""
        first = self._step_values(data, self.step_type_key)
        if first.dtype is not torch.bool:
            if first.is_floating_point() or first.is_complex():
                raise TypeError(f"{self.step_type_key!r} must hold ints (ALF's StepType) or bools, "
                                f"got dtype={first.dtype}.")
            if first.numel():
                low, high = bounds(first)
                if low < 0 or high > 2:
                    raise ValueError(
                        f"{self.step_type_key!r} must hold ALF's StepType values 0 (FIRST), 1 (MID) "
                        f"or 2 (LAST), got values in [{low}, {high}]; nothing was written."
                    )
            first = first == 0  # ALF's StepType.FIRST
        return first.reshape(env.shape)

    def _field(self, data: TensorDictBase, key: Any) -> torch.Tensor:
        value = data.get(key, None)
        if value is None:
            raise ValueError(
                f"{type(self).__name__} needs {key!r} in every written batch (episode "
                "bookkeeping); add it, or pass the key that holds it to the constructor."
            )
        return value

    def _step_values(self, data: TensorDictBase, key: Any) -> torch.Tensor:
        """``key``'s entry, refused unless it holds one value per written step, as ALF keeps
        (``[N]`` / ``[N, T]``, or with a trailing 1): more would be stored and then break the
        episode bookkeeping."""
        value = self._field(data, key)
        steps = tuple(data.batch_size)
        if tuple(value.shape) not in (steps, (*steps, 1)):
            raise ValueError(
                f"{key!r} must hold one value per step, of shape {list(steps)} or {[*steps, 1]}, "
                f"got {list(value.shape)}; nothing was written."
            )
        return value

    def _index_step(self, env: torch.Tensor, pos: torch.Tensor, first: torch.Tensor) -> None:
        # On numpy views of the CPU bookkeeping: a dozen tiny indexing ops per step, where
        # numpy's per-call overhead is far below torch's.
        env, pos, first = env.cpu().numpy(), pos.cpu().numpy(), first.numpy()
        is_first, indexed, headless = self._is_first.numpy(), self._indexed.numpy(), self._headless.numpy()
        length = self.max_length
        slot = pos % length
        # The slot is about to lose position pos - L. If that step began an
        # episode, the episode's newest position moves to the headless record.
        losing_head = (pos >= length) & is_first[env, slot]
        if losing_head.any():
            headless[env[losing_head]] = indexed[env[losing_head], slot[losing_head]]
        # The first step written (ever, or since a clear) also opens an episode
        # as far as the ring can tell. A dequeue does not: the steps it removed
        # keep their slots, and their episode goes on.
        opens = first | (pos == 0)
        is_first[env, slot] = opens
        prev = indexed[env, (pos - 1) % length]  # begin of the previous step's episode
        begin = np.where(opens, pos, prev)
        indexed[env, slot] = begin
        cont = ~opens
        head_stored = begin > pos - length
        upd = cont & head_stored
        indexed[env[upd], begin[upd] % length] = pos[upd]
        headless[env[cont & ~head_stored]] = pos[cont & ~head_stored]

    def _record_step(
        self, env: torch.Tensor, pos: torch.Tensor, discount: torch.Tensor, size: torch.Tensor
    ) -> None:
        length = self.max_length
        slot = pos % length
        f0 = self._is_first[env, slot] | (discount == 0)
        prev = self._disc0[env, (pos - 1) % length]
        self._disc0[env, slot] = torch.where(f0, pos, prev)
        self._returns[env, slot] = self.default_return
        ends = (discount == 0) & (pos > 0)
        if bool(ends.any()):
            # Oldest step still stored once pos is written.
            earliest = pos + 1 - (size + 1).clamp(max=length)
            start = torch.maximum(prev, earliest)
            self._store_returns(env[ends], start[ends], pos[ends])

    def _store_returns(self, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> None:
        """``G_j`` for ``j`` in ``[start, end - 1]`` of each env (windows right-aligned at ``end``)."""
        length = self.max_length
        width = int((end - start).max())
        if width <= 0:
            return
        j = end.unsqueeze(1) - width + torch.arange(width)  # [n, width], last column end - 1
        valid = j >= start.unsqueeze(1)
        j = torch.where(valid, j, end.unsqueeze(1))  # padding reads a harmless stored step
        discount = self._flat_leaf(self.discount_key)[self.flat_index(env.unsqueeze(1), j)]
        reward = self._flat_leaf(self.reward_key)[self.flat_index(env.unsqueeze(1), j + 1)].double()
        if self.reward_clip is not None:
            reward = reward.clamp(*self.reward_clip)
        x = torch.where(valid, discount.double() * reward, 0.0)
        g = discounted_cumsum(x.unsqueeze(-1), self.gamma, torch.zeros_like(x, dtype=torch.bool).unsqueeze(-1))
        g = g.squeeze(-1).float().cpu()
        rows, slots = env.unsqueeze(1).expand_as(j)[valid], (j % length)[valid]
        self._returns[rows, slots] = g[valid]

    def _flat_leaf(self, key: Any) -> torch.Tensor:
        leaf = self.flat_leaf(key)
        if leaf is None:
            raise ValueError(f"{key!r} is not stored; returns need it in every written batch.")
        return leaf.reshape(leaf.shape[0])

    # ------------------------------------------------------------------
    def gather(
        self, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None = None,
        skip: Any = (),
    ) -> TensorDictBase:
        if self.record_episodic_return:
            returns = self._returns[env.cpu(), (position % self.max_length).cpu()]
            extra = {**(extra or {}), RETURN_KEY: returns.to(self.device)}
        return super().gather(env, position, extra, skip)

    def get_episode_begin_position(self, positions: Any, env_ids: Any) -> torch.Tensor:
        """First position of the episode of each ``(env, position)`` (maybe no longer stored)."""
        return self._begin(*self._stored_coordinates(env_ids, positions))

    def _begin(self, env: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        slot = pos % self.max_length
        return torch.where(self._is_first[env, slot], pos, self._indexed[env, slot])

    def get_disc_0_begin_position(self, positions: Any, env_ids: Any) -> torch.Tensor:
        """Latest position <= each position that begins an episode or has discount 0."""
        if not self.record_episodic_return:
            raise RuntimeError("build the storage with record_episodic_return=True for this query.")
        env, pos = self._stored_coordinates(env_ids, positions)
        return self._disc0[env, pos % self.max_length]

    def steps_to_episode_end(self, positions: Any, env_ids: Any) -> torch.Tensor:
        """Steps from each position to the newest stored step of its episode."""
        env, pos = self._stored_coordinates(env_ids, positions)
        begin = self._begin(env, pos)
        headless = self._rings.pos[env] > begin + self.max_length
        end = torch.where(headless, self._headless[env], self._indexed[env, begin % self.max_length])
        return end - pos

    # ------------------------------------------------------------------
    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        super().reset(env_ids)
        rows = slice(None) if env_ids is None else torch.as_tensor(env_ids).cpu()
        self._is_first[rows] = False
        self._returns[rows] = self.default_return

    def _episode_index(self) -> tuple[torch.Tensor, ...]:
        """The bookkeeping a checkpoint saves, in its order."""
        return self._is_first, self._indexed, self._headless, self._disc0, self._returns

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"episodes": [t.clone() for t in self._episode_index()]}

    def _require_saved(self, state_dict: dict[str, Any], key: str, what: str, cause: str) -> None:
        """Refuses a state without the ``key`` entry this storage needs, before the ring loads
        the data and cursors (``ValueError``)."""
        if key not in state_dict:
            raise ValueError(
                f"the checkpoint has no {what} ({key!r}), which this {type(self).__name__} needs: "
                f"{cause}; build the storage as the saved one was built."
            )

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._require_saved(state_dict, "episodes", "episode index", "it was saved without one (e.g. by "
                            "alf_replay_buffer without keep_episodic_info)")
        super().load_state_dict(state_dict)
        for dest, src in zip(self._episode_index(), state_dict["episodes"]):
            dest.copy_(src)
