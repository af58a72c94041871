"""The demo record shared by :mod:`torchrl_ext.demos.store` and :mod:`torchrl_ext.demos.files`.

A demo is a plain ``dict``:

* ``"observation"``: ``[L, *obs_shape]`` tensor, the observation at which ``action[k]`` was taken;
* ``"action"``: ``[L, *action_shape]`` tensor;
* ``"reward"``: ``[L, 1]`` tensor;
* ``"id"`` (str), ``"length"`` (``L``), ``"total_reward"`` (float), ``"human"`` (bool);
* ``"max_value"`` (float), for value demos only.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchrl_ext._checks import check_finite, check_int, check_real

DEMO_KEYS = ("observation", "action", "reward")


def demo_tensors(
    demo: Any, *, where: str = "demo", device: torch.device | str | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Checks a mapping with ``observation``/``action``/``reward`` and returns the three tensors.

    The reward becomes ``[L, 1]``; the tensors are copies, so the caller may reuse its buffers.

    Raises:
        ValueError: A key is missing, the demo is empty or the lengths differ.

    Examples:
        >>> obs, act, rew = demo_tensors({"observation": torch.zeros(3, 2),
        ...                               "action": torch.zeros(3), "reward": torch.ones(3)})
        >>> rew.shape
        torch.Size([3, 1])
    """
    try:
        present = set(demo.keys())  # dict, TensorDict and npz files alike
    except AttributeError:
        raise TypeError(
            f"a demo must be a dict or TensorDict with keys {DEMO_KEYS}, got {type(demo).__name__}."
        ) from None
    missing = [key for key in DEMO_KEYS if key not in present]
    if missing:
        raise ValueError(
            f"{where} has no key(s) {missing}; a demo needs {list(DEMO_KEYS)} "
            "(one row per step, reward [L] or [L, 1])."
        )
    out = []
    for key in DEMO_KEYS:
        value = demo[key]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value))  # copy: npz members may be read-only
        out.append(torch.as_tensor(value).detach().to(device=device, copy=True))
    obs, act, rew = out
    if act.ndim == 0 or act.shape[0] == 0:
        raise ValueError(
            f"{where} is empty (action shape {tuple(act.shape)}); a demo needs >= 1 step."
        )
    length = act.shape[0]
    if obs.ndim == 0 or obs.shape[0] != length or rew.numel() != length:
        raise ValueError(
            f"{where} has mismatched lengths: observation {tuple(obs.shape)}, action "
            f"{tuple(act.shape)}, reward {tuple(rew.shape)}; all three need the same number of "
            "rows L (reward [L] or [L, 1]), one per step."
        )
    return obs, act, rew.reshape(length, 1)


def make_demo(
    observation: Tensor,
    action: Tensor,
    reward: Tensor,
    *,
    demo_id: str,
    human: bool = False,
) -> dict[str, Any]:
    """Builds the demo record from checked tensors (see :func:`demo_tensors`)."""
    return {
        "observation": observation,
        "action": action,
        "reward": reward,
        "id": str(demo_id),
        "length": int(action.shape[0]),
        "total_reward": float(reward.sum(dtype=torch.float64)),
        "human": bool(human),
    }


def check_settings(
    rho: Any, phi: Any, alpha: Any, num_demos_to_save: Any, initial_reward_threshold: Any
) -> tuple[float, float, float, float | None]:
    """Validates :class:`DemoStore` settings; returns ``rho, phi, alpha, threshold`` as floats."""
    rho, phi = check_real("rho", rho, low=0.0, high=1.0), check_real("phi", phi, low=0.0, high=1.0)
    if rho + phi > 1.0 + 1e-12:
        raise ValueError(
            "rho and phi must satisfy rho + phi <= 1 (1 - rho - phi is the probability of a real env "
            f"episode), got rho={rho} and phi={phi} (sum {rho + phi:g}); lower one of them, e.g. "
            f"phi={1.0 - rho:g}."
        )
    alpha = check_real("alpha", alpha, low=0.0, open_low=True, hint="the default is 10")
    check_int("num_demos_to_save", num_demos_to_save, minimum=0)
    if initial_reward_threshold is not None:  # -inf (every episode qualifies) is a threshold too
        initial_reward_threshold = check_real(
            "initial_reward_threshold", initial_reward_threshold, low=-math.inf, finite=False
        )
    return rho, phi, alpha, initial_reward_threshold


def cut_episode(run: dict[str, list]) -> tuple[Tensor, Tensor, Tensor, float]:
    """Stacks a finished episode, cut after its last positive reward (kept whole if none).

    The returned max value covers every tracked step, the cut tail included.
    """
    positive = (torch.stack(run["reward"]).reshape(-1) > 0).nonzero()
    end = int(positive[-1]) + 1 if positive.numel() else len(run["reward"])
    obs, act, rew = (torch.stack(run[key][:end]) for key in DEMO_KEYS)
    return obs, act, rew, max(run["value"])


def env_index(env_ids: Any, n: int | None) -> list[int]:
    """Env indices of ``n`` rows (any number if ``None``) from None/int/indices/bool mask."""
    if env_ids is None:
        return list(range(n))
    if isinstance(env_ids, numbers.Integral) and not isinstance(env_ids, bool):
        ids = [int(env_ids)]
    else:
        t = torch.as_tensor(env_ids)
        ids = (t.nonzero().flatten() if t.dtype == torch.bool else t.flatten()).tolist()
    if n is None:
        n = len(ids)
    if len(ids) != n or len(set(ids)) != n or any(i < 0 for i in ids):
        raise ValueError(
            f"`env_ids` selects envs {ids} but the inputs have {n} rows; give {n} distinct "
            "non-negative indices (or a bool mask with that many true entries)."
        )
    return ids


def step_batch(
    env_ids: Any,
    observation: Any,
    action: Any,
    reward: Any,
    value: Any,
    done: Any,
    device: torch.device,
) -> tuple[list[int], Tensor, Tensor, Tensor, list[float], list[bool]]:
    """Checks one batched env step (see :meth:`DemoStore.track`) and copies it to ``device``."""
    single = isinstance(env_ids, numbers.Integral) and not isinstance(env_ids, bool)
    tensors = [torch.as_tensor(x) for x in (observation, action, reward, value, done)]
    if single:
        tensors = [x.unsqueeze(0) for x in tensors]
    obs, act, rew, val, dn = tensors
    n = obs.shape[0] if obs.ndim else 0
    ids = env_index(env_ids, n)
    for name, x, per_row in (("action", act, False), ("reward", rew, True),
                             ("value", val, True), ("done", dn, True)):
        if x.ndim == 0 or x.shape[0] != n or (per_row and x.numel() != n):
            want = f"[{n}] or [{n}, 1]" if per_row else f"[{n}, ...]"
            raise ValueError(
                f"`{name}` has shape {tuple(x.shape)} but observation has {n} rows; "
                f"`{name}` must be {want}, one row per selected env."
            )
    check_finite("reward", rew, "nothing was tracked; pass finite rewards.")
    obs, act, rew = (x.detach().to(device, copy=True) for x in (obs, act, rew))
    values, dones = val.detach().reshape(n).double().tolist(), dn.detach().reshape(n).bool().tolist()
    return ids, obs, act, rew.reshape(n, 1), values, dones


def priority_weights(values: list[float], alpha: float) -> Tensor:
    """Normalised ``max(v, 0) ** alpha`` in float64, computed in log space.

    NaN and -inf count as 0; +inf values share all the mass; all zero gives uniform weights.

    Examples:
        >>> priority_weights([1.0, -5.0, 3.0], 2.0)
        tensor([0.1000, 0.0000, 0.9000], dtype=torch.float64)
        >>> priority_weights([-1.0, 0.0], 1.5)
        tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    v = torch.tensor(values, dtype=torch.float64)
    if v.numel() == 0:
        return v
    v = torch.nan_to_num(v, nan=0.0, neginf=0.0, posinf=math.inf).clamp(min=0.0)
    if torch.isinf(v).any():
        weights = torch.isinf(v).double()
    elif v.max() <= 0:
        weights = torch.ones_like(v)
    else:
        weights = torch.exp(alpha * (v.log() - v.max().log()))
    return weights / weights.sum()


_META = ("id", "length", "total_reward", "human", "max_value")


def demos_state(demos: list[dict[str, Any]]) -> dict[str, Any]:
    """Columns of a demo list: one list of tensors per data key, JSON-able metadata."""
    return {**{key: [d[key] for d in demos] for key in DEMO_KEYS},
            "meta": [{k: d[k] for k in _META if k in d} for d in demos]}


def demos_from_state(state: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """Inverse of :func:`demos_state` (tensors moved to ``device``)."""
    demos = []
    if any(len(state[key]) != len(state["meta"]) for key in DEMO_KEYS):
        raise ValueError(f"{[len(state[key]) for key in DEMO_KEYS]} tensors for {len(state['meta'])} demos.")
    for k, meta in enumerate(state["meta"]):
        demo = {key: state[key][k].to(device) for key in DEMO_KEYS}
        if not {"id", "length", "total_reward", "human"} <= set(meta):
            raise ValueError(f"demo #{k} lacks id, length, total_reward or human: {sorted(meta)}.")
        demos.append({**demo, **meta})
    return demos


def running_state(running: dict[int, dict[str, list]]) -> dict[str, Any]:
    """Columns of the per-env running episodes (envs without steps are left out)."""
    envs = [env for env, run in sorted(running.items()) if run["action"]]
    return {**{key: [torch.stack(running[env][key]) for env in envs] for key in DEMO_KEYS},
            "env": envs, "value": [list(running[env]["value"]) for env in envs]}


def running_from_state(state: dict[str, Any], device: torch.device) -> dict[int, dict[str, list]]:
    """Inverse of :func:`running_state`."""
    running = {}
    for k, env in enumerate(state["env"]):
        run = {key: list(state[key][k].to(device).unbind(0)) for key in DEMO_KEYS}
        run["value"] = [float(v) for v in state["value"][k]]
        running[int(env)] = run
    return running
