"""velora's ``ReplayBuffer`` as a TorchRL :class:`~torchrl_ext.replay_buffers.TensorDictReplayBuffer`.

:func:`velora_replay_buffer` builds a :class:`VeloraReplayBuffer`: a ring
(:class:`~torchrl_ext.storages.FastTensorStorage` + ``RoundRobinWriter``),
uniform sampling with replacement (``RandomSampler``: ``torch.randint`` over
the stored slots, the same draws as velora for the same seed), velora's
``add``/``add_multi``/``save``/``load``/``warm`` and its files (through
:class:`~torchrl_ext.io.VeloraCheckpointer`, also used by ``rb.dumps`` /
``rb.loads``), on the keys of :data:`~torchrl_ext.io.VELORA_KEYS` (table in
:mod:`torchrl_ext.io.velora`).
:func:`~torchrl_ext.io.as_batch_experience` gives velora's ``BatchExperience``.

Differences from velora 0.2.0 (its bugs fixed, one line each):

* ``add_multi`` with more rows than ``capacity`` keeps the newest ``capacity``
  rows in order (velora writes repeated slots; the winner is unspecified).
* ``warm`` ends when ``n_samples > capacity`` (velora loops forever): it adds
  ``n_samples - len(rb)`` transitions and the oldest are overwritten.
* ``warm`` adds exactly that many transitions (velora overshoots by up to
  ``num_envs - 1``).
* ``warm`` never stores gymnasium's NEXT_STEP autoreset pseudo-transition
  (final obs -> reset obs, reward 0); velora stores it as a normal step.
  SAME_STEP envs store ``info["final_obs"]`` as the next state; DISABLED envs
  are reset here.
* ``warm`` resets the hidden state to zeros at every episode start (velora
  never resets it).
* ``warm`` takes the env from the caller (any ``num_envs``, also 1) and leaves
  it open; velora builds ``make_vec(spec.id, num_envs)``, needs
  ``num_envs >= 2`` and closes it. TorchRL envs work too.
* File prefixes with dots keep their full names (``run.v1_metadata.json``);
  velora truncates them to ``run.json`` / ``run.safetensors``.
* ``save`` is atomic (temporary files, fsync, rename, a checksum of the JSON in
  the safetensors header); velora overwrites both files in place.
* ``load`` fills this buffer and reads the JSON itself;
  :func:`load_velora_replay_buffer` builds a buffer from the files (velora's
  classmethod ``load(state_path, metadata)`` needs the JSON read by the caller).
* ``dones`` are stored as bool (float32 in files and in ``BatchExperience``);
  ``metadata()["device"]`` is the storage's device (``"cpu"`` where velora
  writes ``null`` for ``device=None``; both load the same way).
* ``save``/``load`` take velora's ``(dirpath, prefix)`` and replace TorchRL's
  aliases of ``dumps``/``loads``, which keep TorchRL's folder layout.

Kept from velora: ``done = terminated | truncated``; ``sample`` raises
``ValueError`` while fewer than ``batch_size`` transitions are stored.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import RandomSampler, RoundRobinWriter

from torchrl_ext import _compat
from torchrl_ext.presets._velora_warm import NAMES, Progress, warm_gymnasium, warm_torchrl
from torchrl_ext._checks import check_bool, check_int, read_only
from torchrl_ext.io.velora import _DIM_FIELD, VeloraCheckpointer, read_velora_metadata, velora_item_layout
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.storages.fast import FastTensorStorage

__all__ = ["VeloraReplayBuffer", "load_velora_replay_buffer", "velora_replay_buffer"]

_SIZES = ("capacity", "state_dim", "action_dim", "hidden_dim")  # velora's constructor arguments

class VeloraReplayBuffer(TensorDictReplayBuffer):
    """velora's ``ReplayBuffer(capacity, state_dim, action_dim, hidden_dim, device=)``; see the module docs.

    Use :func:`velora_replay_buffer` to build one. TorchRL's API (``extend``,
    ``sample``, ``dumps``/``loads``, transforms, ...) works as usual on the
    mapped keys.
    """

    def __init__(
        self,
        capacity: int,
        state_dim: int,
        action_dim: int,
        hidden_dim: int,
        *,
        device: torch.device | str | None = None,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
        keys: Mapping[str, Any] | None = None,
    ) -> None:
        for name, value in zip(_SIZES, (capacity, state_dim, action_dim, hidden_dim)):
            check_int(name, value, minimum=1)
        if batch_size is not None:
            check_int("batch_size", batch_size, minimum=1)
        checkpointer = VeloraCheckpointer(keys=keys)
        storage = FastTensorStorage(capacity, device="cpu" if device is None else device, strict=True)
        super().__init__(storage=storage, sampler=RandomSampler(), writer=RoundRobinWriter(),
                         batch_size=batch_size, generator=generator, checkpointer=checkpointer)
        self.keys = checkpointer.keys
        self.state_dim, self.action_dim, self.hidden_dim = state_dim, action_dim, hidden_dim
        self._layout = velora_item_layout(state_dim, action_dim, hidden_dim, self.keys)
        # velora preallocates zeros: allocate now, so an empty buffer saves and loads.
        zeros = TensorDict({k: torch.zeros(s, dtype=d) for k, (s, d) in self._layout.items()}, [])
        _compat.allocate_like(storage, zeros)
        _compat.stored_data(storage).zero_()

    # -- velora's attributes ---------------------------------------------------------
    capacity = read_only("storage.max_size", "Ring size: the oldest transitions are overwritten.")
    device = read_only("storage.device", "The storage's device.")

    @property
    def position(self) -> int:
        """The next slot written (velora's ``position``)."""
        return _compat.writer_cursor(self.writer)

    def metadata(self) -> dict[str, Any]:
        """velora's ``metadata()`` dict, same keys in the same order."""
        return {**{name: getattr(self, name) for name in _SIZES}, "position": self.position,
                "size": len(self), "device": str(self.device)}

    def config(self) -> dict[str, Any]:
        """velora's ``BufferConfig`` fields as a dict."""
        return {"type": "ReplayBuffer", **{name: getattr(self, name) for name in _SIZES}}

    # -- writing -------------------------------------------------------------------------
    def add(self, state: Any, action: Any = None, reward: Any = None, next_state: Any = None,
            done: Any = None, hidden: Any = None) -> Any:
        """velora's ``add`` of one transition; ``add(tensordict)`` is TorchRL's ``add``.

        Each argument may be a tensor, array or number whose number of values
        matches its width (``state_dim``, ``action_dim``, 1, ``state_dim``, 1,
        ``hidden_dim``); a leading 1 (e.g. a ``[1, hidden_dim]`` hidden) is fine.
        """
        if isinstance(state, TensorDictBase) and action is None:
            return super().add(state)
        self._write(self._rows("add", (state, action, reward, next_state, done, hidden)))

    def add_multi(self, states: Any, actions: Any, rewards: Any, next_states: Any,
                  dones: Any, hiddens: Any) -> None:
        """velora's ``add_multi``: ``B`` transitions, any ``B`` (also more than ``capacity``).

        Each argument is ``[B, width]``; ``actions``, ``rewards`` and ``dones``
        may be ``[B]`` when their width is 1.

        Examples:
            >>> import torch
            >>> from torchrl_ext.presets.velora import velora_replay_buffer
            >>> rb = velora_replay_buffer(3, state_dim=1, action_dim=1, hidden_dim=1)
            >>> ids = torch.arange(5.0)
            >>> rb.add_multi(ids[:, None], ids, ids, ids[:, None], ids > 3, ids[:, None])
            >>> rb.storage.get(torch.arange(3))["observation"].flatten().tolist(), rb.position, len(rb)
            ([3.0, 4.0, 2.0], 2, 3)
        """
        self._write(self._rows("add_multi", (states, actions, rewards, next_states, dones, hiddens)))

    def _rows(self, method: str, values: tuple) -> dict[str, torch.Tensor]:
        """Checked ``[B, width]`` rows (float32; dones bool) of add/add_multi arguments."""
        rows = {}
        for name, value in zip(NAMES, values):
            arg = name if method == "add_multi" else name[:-1]  # add() takes state, action, ...
            if value is None:
                raise TypeError(f"{method}: missing argument {arg!r}.")
            tensor = torch.as_tensor(value if isinstance(value, torch.Tensor) else np.asarray(value))
            tensor = tensor.detach().to(self.device)
            tensor = tensor != 0 if name == "dones" else tensor.to(torch.float32)
            width, field = self._layout[self.keys[name]][0][0], _DIM_FIELD[name] or "width"
            vector = name in ("states", "next_states")
            if method == "add":
                if tensor.numel() != width:
                    raise ValueError(
                        f"add: {arg} has {tensor.numel()} values (shape {list(tensor.shape)}); expected "
                        f"{width} ({field}={width}). Pass one transition; use add_multi for batches."
                    )
                tensor = tensor.reshape(1, width)
            elif tensor.ndim == 1 and width == 1 and not vector:
                tensor = tensor.unsqueeze(-1)
            if tensor.ndim != 2 or tensor.shape[1] != width:
                alt = " or [B]" if width == 1 and not vector else ""
                raise ValueError(
                    f"add_multi: {arg} has shape {list(tensor.shape)}; expected [B, {width}]{alt} "
                    f"({field}={width}), e.g. {arg}.reshape(B, {width})."
                )
            rows[name] = tensor
        sizes = {name: len(t) for name, t in rows.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"add_multi: arguments have different batch sizes {sizes}; pass B rows of each.")
        return rows

    def _write(self, rows: dict[str, torch.Tensor]) -> None:
        data = TensorDict({self.keys[name]: t for name, t in rows.items()}, [len(rows["states"])],
                          device=self.device)
        count, capacity = data.shape[0], self.capacity
        if count > capacity:  # the same end state as writing every row in turn
            skipped = count - capacity
            cursor = (_compat.writer_cursor(self.writer) + skipped) % capacity
            _compat.set_writer_cursor(self.writer, cursor, written=skipped)
            data = data[count - capacity:]
        super().extend(data)

    # -- reading -------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False,
               include_info: bool | None = None, *, wait: bool = False, timeout: float | None = None,
               cancel_event: Any = None) -> Any:
        """``batch_size`` transitions drawn uniformly with replacement (a TensorDict with ``index``).
        ``wait``, ``timeout`` and ``cancel_event`` go to TorchRL's ``sample`` (releases after
        0.14.1); velora's refusal below comes first.

        Raises:
            ValueError: fewer than ``batch_size`` transitions are stored (as velora).
        """
        wanted = self.batch_size if batch_size is None else batch_size
        if wanted is not None and len(self) < wanted:
            raise ValueError(
                f"sample: only {len(self)} transitions stored, batch_size={wanted}; add more "
                f"(or warm the buffer) before sampling."
            )
        return super().sample(batch_size, return_info=return_info, include_info=include_info, wait=wait,
                              timeout=timeout, cancel_event=cancel_event)

    # -- files ---------------------------------------------------------------------------
    def save(self, dirpath: str | Path, prefix: str = "buffer_") -> None:
        """Writes velora's ``<prefix>metadata.json`` + ``<prefix>state.safetensors`` atomically."""
        _compat.set_last_written(self.storage, (self.position - 1) % self.capacity if len(self) else None)
        VeloraCheckpointer(prefix, keys=self.keys).dumps(self.storage, dirpath)

    def load(self, dirpath: str | Path, prefix: str = "buffer_") -> VeloraReplayBuffer:
        """Replaces the contents with velora files of the same capacity and dims; returns ``self``."""
        metadata = read_velora_metadata(dirpath, prefix)
        theirs, mine = ({f: meta[f] for f in _SIZES} for meta in (metadata, self.metadata()))
        if theirs != mine:
            raise ValueError(
                f"{Path(dirpath) / (prefix + 'metadata.json')} describes {theirs} but this buffer has {mine}; "
                f"build a matching one with velora_replay_buffer({', '.join(map(str, theirs.values()))}) or "
                f"load_velora_replay_buffer(dirpath)."
            )
        VeloraCheckpointer(prefix, keys=self.keys).loads(self.storage, dirpath)
        _compat.set_writer_cursor(self.writer, metadata["position"])
        return self

    # -- warm-up -------------------------------------------------------------------------
    def warm(self, policy: Callable, n_samples: int, env: Any, *, progress: bool = True,
             seed: int | None = None) -> int:
        """Fills the buffer to ``n_samples`` transitions from ``env``; returns how many were added.

        Adds ``max(0, n_samples - len(self))`` transitions (with ``n_samples >
        capacity`` the oldest are overwritten). The env is reset first (with
        ``seed``) and left open. Hidden states start at zeros and are zeroed at
        every episode start.

        Args:
            policy: for a gymnasium vector env, ``policy(obs, hidden) ->
                (action, new_hidden)`` with ``obs`` float32 ``[num_envs,
                state_dim]`` and ``hidden`` ``[num_envs, hidden_dim]`` on the
                buffer's device; ``action`` is what ``env.step`` takes (tensor
                or array) and ``new_hidden`` is stored as ``hiddens``. For a
                TorchRL env, ``policy(td) -> td`` (a ``TensorDictModule``) reads
                ``"observation"`` and the root hidden key (``"hidden"``) and
                writes ``"action"`` and ``("next", "hidden")``, TorchRL's
                recurrent-module convention.
            n_samples: the number of transitions wanted in the buffer.
            env: ``gymnasium.vector.SyncVectorEnv``/``AsyncVectorEnv`` (any
                autoreset mode) or a TorchRL ``EnvBase`` (``GymEnv``,
                ``SerialEnv``, ...), stepped with ``step_and_maybe_reset``.
            progress: show a tqdm bar (a plain counter on stderr without tqdm).
            seed: passed to ``env.reset(seed=)`` / ``env.set_seed``.
        """
        check_int("n_samples", n_samples, minimum=0)
        check_bool("progress", progress)
        target = max(0, n_samples - len(self))
        if target == 0:
            return 0
        from torchrl.envs import EnvBase

        bar = Progress(target, progress)
        try:
            with torch.no_grad():
                if isinstance(env, EnvBase):
                    warm_torchrl(self, policy, target, env, seed, bar)
                elif hasattr(env, "num_envs") and hasattr(env, "step"):
                    warm_gymnasium(self, policy, target, env, seed, bar)
                else:
                    raise TypeError(
                        f"warm: env must be a gymnasium vector env (gymnasium.vector.SyncVectorEnv) "
                        f"or a TorchRL EnvBase, got {type(env).__name__}; wrap a single gymnasium env "
                        f"with SyncVectorEnv([lambda: env])."
                    )
        finally:
            bar.close()
        return target


def velora_replay_buffer(
    capacity: int,
    state_dim: int,
    action_dim: int,
    hidden_dim: int,
    *,
    device: torch.device | str | None = None,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    keys: Mapping[str, Any] | None = None,
) -> VeloraReplayBuffer:
    """velora's ``ReplayBuffer(capacity, state_dim, action_dim, hidden_dim, device=device)``.

    Args:
        capacity: ring size; the oldest transitions are overwritten.
        state_dim, action_dim, hidden_dim: widths of the stored vectors.

    Keyword Args:
        device: storage device (``None``: CPU).
        batch_size: default ``sample()`` size.
        generator: RNG of the sampler (default: torch's global RNG, as velora).
        keys: velora name -> TensorDict key (default :data:`~torchrl_ext.io.VELORA_KEYS`).

    Examples:
        >>> import tempfile, torch
        >>> from torchrl_ext.io import as_batch_experience
        >>> from torchrl_ext.presets.velora import load_velora_replay_buffer, velora_replay_buffer
        >>> rb = velora_replay_buffer(100, state_dim=3, action_dim=2, hidden_dim=4)
        >>> rb.add([0.0, 1.0, 2.0], [1.0, -1.0], 0.5, [1.0, 2.0, 3.0], False, torch.zeros(1, 4))
        >>> rb.add_multi(torch.ones(8, 3), torch.zeros(8, 2), torch.ones(8), torch.ones(8, 3),
        ...              torch.zeros(8), torch.zeros(8, 4))
        >>> len(rb), rb.position
        (9, 9)
        >>> batch = as_batch_experience(rb.sample(4))
        >>> batch.states.shape, batch.dones.dtype
        (torch.Size([4, 3]), torch.float32)
        >>> folder = tempfile.mkdtemp()
        >>> rb.save(folder)
        >>> len(load_velora_replay_buffer(folder))
        9
    """
    return VeloraReplayBuffer(capacity, state_dim, action_dim, hidden_dim, device=device,
                              batch_size=batch_size, generator=generator, keys=keys)


def load_velora_replay_buffer(
    dirpath: str | Path, prefix: str = "buffer_", **kwargs: Any
) -> VeloraReplayBuffer:
    """A buffer built from velora files' metadata and filled from them (velora's ``load``).

    ``kwargs`` go to :func:`velora_replay_buffer` (``device``, ``batch_size``, ...).
    """
    metadata = read_velora_metadata(dirpath, prefix)
    rb = velora_replay_buffer(*(metadata[f] for f in _SIZES), **kwargs)
    return rb.load(dirpath, prefix)
