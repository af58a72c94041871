"""Per-env rings that store each observation frame once.

A transition stream of pixel observations repeats itself: ``("next", obs)``
of step ``t`` is ``obs`` of step ``t + 1`` within an episode, and a
``num_stack``-frame observation shares ``num_stack - 1`` frames with the
previous one. TorchRL's storages keep all of it: with a 4-frame 84x84 stack,
8 copies of every frame. This storage keeps one:

* ``obs``: only its newest frame (the last along ``stack_dim``) is stored;
  the stack is rebuilt at read time from the previous steps of the same env,
  padded at episode starts with the episode's first frame (gymnasium's
  ``FrameStackObservation`` with ``padding_type="reset"``) or zeros;
* ``("next", obs)``: rebuilt from the following step of the same env; at an
  episode end (``done``) its newest frame goes to a side table, which grows
  on demand and frees a row when the step's slot is overwritten; the newest
  step of each env keeps its next frame in a per-env table until the
  following step arrives.

Reads return the same keys and shapes as a plain
:class:`~torchrl_ext.storages.EnvRingStorage` holding the full stream.
Steps whose stack reaches back into overwritten frames are not readable:
:attr:`required_lookback` is ``num_stack - 1``, and the torchrl_ext samplers
and ``RandomSampler`` skip them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_ext._checks import check_bool, check_indices, check_int, makes_kept_tensors
from torchrl_ext.storages._numpy_rows import NUMPY_DTYPES
from torchrl_ext._keys import nested_key, next_key
from torchrl_ext.storages.episodes import EpisodicEnvRingStorage
from torchrl_ext.storages._gathers import select_rows

__all__ = ["DedupEnvRingStorage"]


class DedupEnvRingStorage(EpisodicEnvRingStorage):
    """:class:`EnvRingStorage` that stores each frame of ``obs_key`` once.

    Args:
        num_envs, max_length: ring geometry.

    Keyword Args:
        obs_key: the (pixel) observation; ``("next", obs_key)`` must be written too.
        num_stack: frames per observation (1: no stacking, only ``next`` is shared).
        stack_dim: dim of the stack within one observation (e.g. 0 for ``[4, 84, 84]``).
        padding: ``"reset"`` (repeat the episode's first frame) or ``"zero"``.
        done_key: the step ends its episode (the next step begins a new one).
        check_next: verify on write that every stack is what reads rebuild:
            ``("next", obs)`` is ``obs`` shifted by one frame, an episode's first
            ``obs`` is padding, and ``obs`` of a step equals ``("next", obs)`` of
            the previous step of its env, frame for frame (a stream that breaks
            this cannot be deduplicated); a mismatch raises before anything is written.
        record_episodic_return, gamma, reward_clip, default_return,
        discount_key, reward_key, device: see :class:`EpisodicEnvRingStorage`.
        time_major: see :class:`EnvRingStorage`; env-major by default here, so that
            the frames of a stack are adjacent rows.

    Shape contract:
        Writes ``[N]`` or ``[N, T]`` steps with ``obs`` ``[..., *stack_shape]``;
        reads give ``obs`` and ``("next", obs)`` at full stacked shape.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> from torchrl_ext.storages import DedupEnvRingStorage
        >>> storage = DedupEnvRingStorage(1, 8, obs_key="pixels", num_stack=2)
        >>> rb = EnvRingReplayBuffer(storage=storage)
        >>> frames = [torch.full((1, 3), float(k)) for k in range(4)]
        >>> stack = lambda a, b: torch.stack([frames[a], frames[b]])  # [2, 1, 3]
        >>> for t, (prev, cur) in enumerate([(0, 0), (0, 1), (1, 2)]):
        ...     _ = rb.extend(TensorDict({"pixels": stack(prev, cur)[None],
        ...         "next": {"pixels": stack(cur, cur + 1)[None], "done": torch.tensor([[False]])}}, [1]))
        >>> step = storage.get((torch.tensor([0]), torch.tensor([1])))
        >>> step["pixels"][0, :, 0, 0].tolist(), step["next", "pixels"][0, :, 0, 0].tolist()
        ([0.0, 1.0], [1.0, 2.0])
        >>> storage.flat_leaf("pixels").shape  # one frame per step: [E * L, 1, 3]
        torch.Size([8, 1, 3])
    """

    default_time_major = False  # a stack's frames are consecutive steps of one env: adjacent rows

    @makes_kept_tensors  # the frame tables, updated in place later, maybe outside inference_mode
    def __init__(
        self,
        num_envs: int,
        max_length: int,
        *,
        obs_key: Any = "observation",
        num_stack: int = 1,
        stack_dim: int = 0,
        padding: str = "reset",
        done_key: Any = ("next", "done"),
        check_next: bool = True,
        **kwargs: Any,
    ) -> None:
        check_next = check_bool("check_next", check_next)
        super().__init__(num_envs, max_length, step_type_key=None, **kwargs)
        check_int("num_stack", num_stack, minimum=1)
        if padding not in ("reset", "zero"):
            raise ValueError(f"padding must be 'reset' or 'zero', got padding={padding!r}.")
        self.obs_key = obs_key = nested_key(obs_key, "obs_key")
        self.next_key = next_key(obs_key)
        self.num_stack, self.padding = num_stack, padding
        self.stack_dim = check_int("stack_dim", stack_dim, minimum=-2**62)  # any dim of the observation
        self.done_key, self.check_next = nested_key(done_key, "done_key"), check_next
        self.required_lookback = num_stack - 1
        self._last_done = torch.zeros(num_envs, dtype=torch.bool)
        self._pending_next: torch.Tensor | None = None  # [E, *frame]: newest step's next frame
        self._terminal: torch.Tensor | None = None  # [C, *frame]: next frames at episode ends
        self._terminal_row = torch.full((num_envs * max_length,), -1, dtype=torch.long)
        self._free_rows: list[int] = []
        # check_next: each env's newest ("next", obs) stack as written, valid while that step
        # is still the env's newest and nothing was loaded since (else rebuilt by a read).
        self._pending_stack: torch.Tensor | None = None
        self._pending_at = np.full(num_envs, -1, dtype=np.int64)
        self._pending_loads = -1

    # ------------------------------------------------------------------
    # Writes
    def _frames(self, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """Newest frame of each stacked observation."""
        if self.num_stack == 1:
            return obs
        dim = batch_dims + (self.stack_dim % (obs.dim() - batch_dims))
        if obs.shape[dim] != self.num_stack:
            raise ValueError(
                f"{self.obs_key!r} has {obs.shape[dim]} frames along stack_dim={self.stack_dim}, "
                f"expected num_stack={self.num_stack}; set num_stack/stack_dim to the stacking "
                "your env applies."
            )
        return obs.select(dim, -1)

    @torch.no_grad()  # see EnvRingStorage.write_at
    def write_at(
        self, env: torch.Tensor, position: torch.Tensor, data: TensorDictBase, *, set_cursor: bool
    ) -> None:
        batch_dims = env.ndim
        obs, next_obs = self._field(data, self.obs_key), self._field(data, self.next_key)
        if next_obs.shape != obs.shape or next_obs.dtype != obs.dtype:
            # Checked before anything is written: the next frame is stored in obs's place.
            raise ValueError(
                f"{self.next_key!r} has shape {list(next_obs.shape)} and dtype {next_obs.dtype}, but "
                f"{self.obs_key!r} has shape {list(obs.shape)} and dtype {obs.dtype}; the next "
                "observation is stored as the following step's observation, so write both with "
                "the same shape and dtype."
            )
        frames = self._frames(obs, batch_dims)
        next_frames = self._frames(next_obs, batch_dims)
        done = self._step_values(data, self.done_key).reshape(env.shape).cpu().bool()
        rows = (env if env.ndim == 1 else env[:, 0]).cpu()  # each written env once
        # A step begins an episode when the previous step of its env was done.
        first = self._last_done[rows]
        if env.ndim == 2:
            first = torch.cat([first.unsqueeze(1), done[:, :-1]], 1)
        # One step of each env in env order (envs stepped together): its env rows are the
        # side tables' rows as they stand, so neither needs gathering or scattering.
        every_env = rows.numel() == self.num_envs and bool((rows.numpy() == np.arange(self.num_envs)).all())
        if self.check_next:
            self._check_continuity(env, rows, obs, next_obs, frames, next_frames, done, first, every_env)
        stored = data.exclude(self.next_key).set(self.obs_key, frames)
        table_rows = self._table_rows(env, position).reshape(-1)
        super().write_at(env, position, stored, set_cursor=set_cursor, first=first)  # checks the layout first
        self._store_next_frames(env, rows, table_rows, next_frames, done, every_env)
        if self.check_next and self.num_stack > 1:
            self._keep_pending_stacks(env, rows, position, next_obs, every_env)

    def _check_continuity(self, env, rows, obs, next_obs, frames, next_frames, done, first, every_env: bool) -> None:
        """Refuses steps whose stacks reads would not give back (the rules of ``check_next``)."""
        head_first = first.reshape(env.shape[0], -1)[:, 0] | torch.from_numpy(self._rings.pos_np[rows.numpy()] == 0)
        # Whole stacks, unless the ring is too short to rebuild the newest one: newest frames then.
        whole = self.num_stack == 1 or self.max_length >= self.num_stack
        got, ahead = (obs, next_obs) if whole else (frames, next_frames)
        pairs = []
        go_on = ~head_first
        if self._pending_next is not None and bool(go_on.any()):
            head = got if env.ndim == 1 else got[:, 0]
            every = every_env and bool(go_on.all())
            if not every:
                rows, head = rows[go_on], head[go_on.to(head.device)]
            pairs.append((self._previous_next(rows, every, whole), head))
        if env.ndim == 2 and env.shape[1] > 1:
            cont = ~done[:, :-1].to(got.device)
            if bool(cont.any()):
                pairs.append((ahead[:, :-1][cont], got[:, 1:][cont]))
        for expected, actual in pairs:
            if not _equal(expected, actual):
                raise ValueError(
                    f"('next', {self.obs_key!r}) of a step differs from {self.obs_key!r} of the "
                    "following step of the same env, so the stream cannot be deduplicated; write "
                    f"steps of each env in order with {self.done_key!r} set at episode ends, or "
                    "use EnvRingStorage."
                )
        if self.num_stack > 1:
            self._check_stack_layout(env, obs, next_obs, first, head_first)

    def _check_stack_layout(self, env, obs, next_obs, first, head_first) -> None:
        """``next`` is ``obs`` shifted by one frame; an episode's first stack is padding."""
        batch_dims, stack = env.ndim, self.num_stack
        dim = batch_dims + (self.stack_dim % (obs.dim() - batch_dims))
        if not _equal(obs.narrow(dim, 1, stack - 1), next_obs.narrow(dim, 0, stack - 1)):
            raise ValueError(
                f"('next', {self.obs_key!r}) is not {self.obs_key!r} shifted by one frame along "
                f"stack_dim={self.stack_dim}; only each stack's newest frame is stored, so stacks "
                "must slide one frame per step (or use EnvRingStorage)."
            )
        starts = first.reshape(env.shape).clone()
        starts.reshape(env.shape[0], -1)[:, 0] = head_first
        if bool(starts.any()):
            begun = obs[starts.to(obs.device)]  # [k, *item]
            item_dim = dim - batch_dims + 1
            older = begun.narrow(item_dim, 0, stack - 1)
            pad = (torch.zeros_like(older) if self.padding == "zero"
                   else begun.narrow(item_dim, stack - 1, 1).expand_as(older))
            if not _equal(pad, older.contiguous()):
                raise ValueError(
                    f"the first {self.obs_key!r} stack of an episode must be padded with "
                    f"{'zeros' if self.padding == 'zero' else 'its first frame'} (padding={self.padding!r}); "
                    "reads rebuild it that way, so write it that way or set padding to match your env."
                )

    def _previous_next(self, rows: torch.Tensor, every: bool, whole: bool) -> torch.Tensor:
        """``("next", obs)`` of each row's env's newest step (its newest frame unless ``whole``):
        as kept at its write, or rebuilt by a read where the env moved or the storage was
        loaded since. ``every``: ``rows`` is every env in order."""
        if self.num_stack == 1 or not whole:
            return self._pending_next if every else self._pending_next[rows.to(self.device)]
        rows_np = rows.numpy()
        if self._pending_stack is not None and self._pending_loads == self._rings.loads and bool(
                (self._pending_at[rows_np] == self._rings.pos_np[rows_np]).all()):
            return self._pending_stack if every else self._pending_stack[rows.to(self.device)]
        pos = self._rings.pos[rows] - 1
        return self._stack(rows, pos, self._begin(rows, pos), shift=1)

    def _keep_pending_stacks(self, env, rows, position, next_obs, every_env: bool) -> None:
        newest_at = (position if env.ndim == 1 else position[:, -1]).cpu().numpy() + 1
        newest = next_obs if env.ndim == 1 else next_obs[:, -1]
        if self._pending_stack is None or self._pending_loads != self._rings.loads:
            self._pending_stack = _kept_zeros(self.num_envs, *newest.shape[1:], dtype=newest.dtype, device=self.device)
            self._pending_at[:] = -1
            self._pending_loads = self._rings.loads
        if every_env:
            self._pending_stack.copy_(newest)
        else:
            self._pending_stack[rows.to(self.device)] = newest.to(self.device)
        self._pending_at[rows.numpy()] = newest_at  # the env's position once this step is its newest

    def _store_next_frames(self, env, rows, table_rows, next_frames, done, every_env: bool) -> None:
        frame_shape = next_frames.shape[env.ndim:]
        if self._pending_next is None:
            self._pending_next = _kept_zeros(self.num_envs, *frame_shape, dtype=next_frames.dtype, device=self.device)
            self._terminal = _kept_zeros(0, *frame_shape, dtype=next_frames.dtype, device=self.device)
        # Overwritten slots give their terminal rows back.
        terminal_row, table = self._terminal_row.numpy(), table_rows.numpy()
        old = terminal_row[table]
        self._free_rows.extend(old[old >= 0].tolist())
        terminal_row[table] = -1
        done_flat = done.reshape(-1)
        if bool(done_flat.any()):
            picked = done_flat.nonzero().squeeze(1)
            taken = torch.tensor(self._take_rows(picked.numel()), dtype=torch.long)
            values = next_frames.reshape(-1, *frame_shape)[picked.to(next_frames.device)]
            self._terminal.index_copy_(0, taken.to(self.device), values.to(self.device))
            self._terminal_row[table_rows[picked]] = taken
        newest = next_frames if env.ndim == 1 else next_frames[:, -1]
        if every_env:
            self._pending_next.copy_(newest)
        else:
            self._pending_next[rows.to(self.device)] = newest.to(self.device)
        self._last_done[rows] = done if env.ndim == 1 else done[:, -1]

    def _table_rows(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Entry ``env * L + slot`` of ``(env, position)`` in the terminal-row table, env-major
        whatever the rings' memory layout, as checkpoints store it."""
        env, position = env.cpu().numpy(), position.cpu().numpy()
        return torch.from_numpy(position % self.max_length + env * self.max_length)

    def _take_rows(self, n: int) -> list[int]:
        if len(self._free_rows) < n:
            have = self._terminal.shape[0]
            grow = max(n - len(self._free_rows), have, 16)
            with torch.inference_mode(False):  # updated in place later, maybe outside inference_mode
                extra = torch.zeros(grow, *self._terminal.shape[1:], dtype=self._terminal.dtype,
                                    device=self.device)
                self._terminal = torch.cat([self._terminal, extra])
            self._free_rows.extend(range(have, have + grow))
        taken, self._free_rows = self._free_rows[-n:], self._free_rows[:-n]
        return taken

    # ------------------------------------------------------------------
    # Reads
    def _check_readable(self, env: torch.Tensor, position: torch.Tensor) -> None:
        if not self.required_lookback or env.numel() == 0:
            return
        env, position = env.cpu(), position.cpu()
        # The oldest frame of each stack must still be in its slot (a dequeued
        # step's frame stays there until overwritten).
        oldest = torch.maximum(position - self.required_lookback, self._begin(env, position))
        if not bool((oldest >= self._rings.pos[env] - self.max_length).all()):
            raise ValueError(
                "a step whose stack reaches back to overwritten frames cannot be read "
                f"(its episode began more than {self.required_lookback} steps before the "
                "oldest stored step); sample with a torchrl_ext sampler, which skips them."
            )

    def gather(
        self, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None = None
    ) -> TensorDictBase:
        # The stored obs leaf holds each stack's newest frame: only read as is without stacking.
        out = super().gather(env, position, extra, skip=(self.obs_key,) if self.num_stack > 1 else ())
        env_c, pos_c = env.cpu(), position.cpu()
        begin = self._begin(env_c, pos_c)
        if self.num_stack > 1:
            out.set(self.obs_key, self._stack(env_c, pos_c, begin))
        out.set(self.next_key, self._stack(env_c, pos_c, begin, shift=1))
        return out

    def _stack(self, env: torch.Tensor, pos: torch.Tensor, begin: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """The ``num_stack`` frames ending at ``pos + shift``, stacked along ``stack_dim``.

        Older frames are clamped to the episode's first (``begin``) and, with
        ``padding="zero"``, zeroed there. All frames come from one gather into the
        output; with ``shift=1`` the newest is the next frame, which the side tables
        hold at episode ends and for each env's newest step.
        """
        offsets = torch.arange(1 - self.num_stack, 1) + shift  # e.g. -3..0, or -2..1 for next
        wanted = pos.unsqueeze(-1) + offsets
        q = torch.maximum(wanted, begin.unsqueeze(-1))  # the newest, pos + shift >= begin, stays
        leaf = self._frame_leaf()
        flat = self.flat_index(env.unsqueeze(-1).expand_as(q), q).reshape(-1)
        frames = select_rows(leaf, flat, pinned=self._pin_outputs).reshape(*q.shape, *leaf.shape[1:])
        if shift:
            self._patch_next_frames(frames.select(pos.dim(), -1), env, pos)
        if self.padding == "zero" and self.num_stack > 1:
            keep = (wanted >= begin.unsqueeze(-1)).to(self.device)
            frames.mul_(keep.reshape(*q.shape, *(1,) * (leaf.dim() - 1)).to(frames.dtype))
        if self.num_stack == 1:
            return frames.squeeze(pos.dim())
        return frames.movedim(pos.dim(), pos.dim() + self.stack_dim % leaf.dim())

    def _frame_leaf(self) -> torch.Tensor:
        leaf = self.flat_leaf(self.obs_key)
        if leaf is None:
            raise RuntimeError("the observation leaf is missing")
        return leaf

    def _patch_next_frames(self, newest: torch.Tensor, env: torch.Tensor, pos: torch.Tensor) -> None:
        """Writes into ``newest`` (gathered from row ``pos + 1``) the next frames kept aside:
        the terminal table's at episode ends, the pending one at each env's newest step."""
        row = self._terminal_row[self._table_rows(env, pos)]
        terminal = row >= 0
        if bool(terminal.any()):
            newest[terminal.to(self.device)] = self._terminal[row[terminal].to(self.device)]
        latest = (pos == self._rings.pos[env] - 1) & ~terminal
        if bool(latest.any()):
            newest[latest.to(self.device)] = self._pending_next[env[latest].to(self.device)]

    # ------------------------------------------------------------------
    def share_memory_(self, example: TensorDictBase | None = None) -> DedupEnvRingStorage:
        """Refused (``RuntimeError``): the side tables cannot live in shared memory."""
        raise RuntimeError(
            f"{type(self).__name__} cannot be shared between processes: its terminal-frame "
            "table grows by reallocation and its free rows are a Python list. Fix: keep it in "
            "one process and send it data (one Ray actor: "
            "torchrl_ext.distributed.ray_replay_buffer), or share an EnvRingStorage / "
            "EpisodicEnvRingStorage, which store every frame."
        )

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        if env_ids is None:
            rows = torch.arange(self.num_envs)
        else:  # checked before the tables below change
            rows = check_indices("env_ids", env_ids, "env ids").cpu().reshape(-1)
            self.check_env_ids(rows)
        slots = self._table_rows(rows.unsqueeze(1), torch.arange(self.max_length)).reshape(-1)
        old = self._terminal_row[slots]
        self._free_rows.extend(old[old >= 0].tolist())
        self._terminal_row[slots] = -1
        self._last_done[rows] = False
        super().reset(env_ids)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        tables = [] if self._pending_next is None else [self._pending_next.clone(), self._terminal.clone()]
        state["dedup"] = {
            "tables": tables,
            "bookkeeping": [self._terminal_row.clone(), self._last_done.clone(),
                            torch.tensor(self._free_rows, dtype=torch.long)],
        }
        return state

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._require_saved(state_dict, "dedup", "frame tables", "it was saved by another storage")
        super().load_state_dict(state_dict)
        dedup = state_dict["dedup"]
        tables = [table.to(self.device).clone() for table in dedup["tables"] or []]
        self._pending_next, self._terminal = tables or (None, None)
        row, last_done, free = dedup["bookkeeping"]
        self._terminal_row.copy_(row)
        self._last_done.copy_(last_done)
        self._free_rows = free.tolist()


@makes_kept_tensors  # updated in place later, maybe outside inference_mode
def _kept_zeros(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device=device)


def _equal(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """``torch.equal`` after moving ``expected`` to ``got``'s device; through numpy on the
    CPU, where strided frames compare with less overhead."""
    expected = expected.to(got.device)
    if got.is_cpu and got.dtype in NUMPY_DTYPES and expected.dtype == got.dtype:
        return bool(np.array_equal(expected.detach().numpy(), got.detach().numpy()))
    return torch.equal(expected, got)
