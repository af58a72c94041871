"""``VeloraReplayBuffer.warm``'s loops: gymnasium vector envs (every autoreset mode) and TorchRL envs.

``rb`` is always the ``VeloraReplayBuffer`` being warmed (typed ``Any``: ``presets/velora.py``
imports this module, not the other way round).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np
import torch

from torchrl_ext._keys import has_leaf
from torchrl_ext.io.velora import VELORA_KEYS

NAMES = tuple(VELORA_KEYS)  # velora's field order

class Progress:
    """A tqdm bar if tqdm is installed, else a counter on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.count, self._bar, self._plain = total, 0, None, enabled
        try:
            from tqdm import tqdm
        except ImportError:
            return
        if enabled:
            self._bar, self._plain = tqdm(total=total, desc="warm", unit="transition"), False

    def update(self, n: int) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._plain:
            print(f"\rwarm: {self.count}/{self.total} transitions", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._plain:
            print(file=sys.stderr)


def warm_gymnasium(rb: Any, policy: Callable, target: int, env: Any,
                    seed: int | None, bar: Progress) -> None:
    from gymnasium.vector import AutoresetMode

    mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
    n = env.num_envs
    raw, _ = env.reset(seed=seed)
    obs = _observations(rb, raw, n)
    hidden = torch.zeros(n, rb.hidden_dim, device=rb.device)
    resetting = np.zeros(n, dtype=bool)  # NEXT_STEP: these envs reset on this step
    added = 0
    while added < target:
        result = policy(obs, hidden)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError("warm: a gymnasium-env policy is called as policy(obs, hidden) and must "
                            f"return (action, new_hidden), got {type(result).__name__}.")
        action, new_hidden = result
        new_hidden = torch.as_tensor(new_hidden).detach().to(rb.device, torch.float32)
        if tuple(new_hidden.shape) != (n, rb.hidden_dim):
            raise ValueError(
                f"warm: policy returned a hidden state of shape {list(new_hidden.shape)}; expected "
                f"[num_envs={n}, hidden_dim={rb.hidden_dim}]."
            )
        env_action = action.detach().cpu().numpy() if isinstance(action, torch.Tensor) else np.asarray(action)
        raw, reward, terminated, truncated, info = env.step(env_action)
        done = np.logical_or(terminated, truncated)
        next_obs = _observations(rb, raw, n)
        stored_next = next_obs
        if mode == AutoresetMode.SAME_STEP and done.any():
            stored_next = next_obs.clone()
            for i in np.flatnonzero(done):
                stored_next[i] = _observations(rb, np.asarray(info["final_obs"][i])[None], 1)[0]
        rows = np.flatnonzero(~resetting)[: target - added]
        if rows.size:
            idx = torch.as_tensor(rows, device=rb.device)
            actions = torch.as_tensor(env_action).reshape(n, -1)
            rb.add_multi(obs[idx], actions[rows], np.asarray(reward)[rows], stored_next[idx],
                         done[rows], new_hidden[idx])
            added += rows.size
            bar.update(int(rows.size))
        if mode == AutoresetMode.NEXT_STEP:
            started, resetting = resetting, done
        else:
            started = done
            if mode == AutoresetMode.DISABLED and done.any():
                raw, _ = env.reset(options={"reset_mask": done})
                next_obs = _observations(rb, raw, n)
        hidden = new_hidden.masked_fill(torch.as_tensor(started, device=rb.device)[:, None], 0.0)
        obs = next_obs


def warm_torchrl(rb: Any, policy: Callable, target: int, env: Any,
                  seed: int | None, bar: Progress) -> None:
    keys = rb.keys
    hidden_out = keys["hiddens"]
    hidden_in = hidden_out[1:] if isinstance(hidden_out, tuple) and hidden_out[0] == "next" else hidden_out
    hidden_in = hidden_in[0] if isinstance(hidden_in, tuple) and len(hidden_in) == 1 else hidden_in
    if seed is not None:
        env.set_seed(seed)
    td = env.reset()
    td.set(hidden_in, torch.zeros(*env.batch_size, rb.hidden_dim, device=td.device))
    n = max(env.batch_size.numel(), 1)
    added = 0
    while added < target:
        out = policy(td)
        td = td if out is None else out
        if not has_leaf(td, hidden_out):
            raise KeyError(
                f"warm: the policy must write {hidden_out!r} (the new hidden state, "
                f"[..., hidden_dim={rb.hidden_dim}]) next to 'action'; it wrote "
                f"{sorted(map(str, td.keys(True, True)))}."
            )
        td, td_next = env.step_and_maybe_reset(td)
        flat = td.reshape(-1)
        rows = {name: flat.get(key).reshape(n, -1) for name, key in keys.items()}
        done = rows["dones"].bool().any(-1)
        if done.any() and torch.isnan(rows["next_states"][done].float()).any():
            raise ValueError(
                "warm: the env reports NaN final observations (native autoreset); use an env "
                "that returns the true final observation in ('next', 'observation')."
            )
        k = min(n, target - added)
        rb.add_multi(*(rows[name][:k] for name in NAMES))
        added += k
        bar.update(k)
        new_hidden = td.get(hidden_out)
        ended = done.reshape(*env.batch_size, 1)  # the rows' done flags, in the env's batch shape
        td_next.set(hidden_in, new_hidden.masked_fill(ended, 0.0))
        td = td_next


def _observations(rb: Any, raw: Any, n: int) -> torch.Tensor:
    obs = torch.as_tensor(np.asarray(raw), dtype=torch.float32, device=rb.device)
    if tuple(obs.shape) != (n, rb.state_dim):
        raise ValueError(
            f"warm: env observations have shape {list(obs.shape)}; expected [num_envs={n}, "
            f"state_dim={rb.state_dim}] (flatten them, e.g. gymnasium.wrappers.vector.FlattenObservation)."
        )
    return obs
