"""Process and actor bodies for the distributed tests (importable by spawned processes)."""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict


def tagged_steps(tags: torch.Tensor) -> TensorDict:
    """``[N]`` steps whose every field is a function of the tag: a torn row shows.

    ``obs`` ``[N, 3]`` is ``tag + (0, 1, 2)``, ``reward`` is ``-tag`` and
    ``done`` is ``tag % 2``.
    """
    tags = tags.long()
    return TensorDict(
        {
            "tag": tags,
            "obs": tags.unsqueeze(-1).double() + torch.arange(3, dtype=torch.float64),
            "reward": -tags.double(),
            "done": (tags % 2).bool(),
        },
        batch_size=tags.shape,
    )


def torn_rows(data: TensorDict) -> int:
    """Number of rows (over any batch shape) whose fields disagree with their tag."""
    expected = tagged_steps(data["tag"].reshape(-1))
    bad = torch.zeros(data["tag"].numel(), dtype=torch.bool)
    for key in ("obs", "reward", "done"):
        got = data[key].reshape(expected[key].shape)
        diff = got != expected[key]
        bad |= diff.reshape(diff.shape[0], -1).any(1)
    return int(bad.sum())


def write_envs(rb: Any, env_ids: list[int], first_tag: int, steps: int, chunk: int = 1) -> int:
    """Writes ``steps`` steps to each env of ``env_ids`` (``chunk`` steps a call).

    Tags are ``first_tag + t * len(env_ids) + i`` for step ``t`` of env ``i``.
    """
    ids = torch.tensor(env_ids)
    n = len(env_ids)
    for t0 in range(0, steps, chunk):
        t = torch.arange(t0, min(t0 + chunk, steps))
        tags = first_tag + t.unsqueeze(0) * n + torch.arange(n).unsqueeze(1)  # [N, T]
        data = tagged_steps(tags.reshape(-1)).reshape(n, t.numel())
        rb.extend(data if chunk > 1 else data[:, 0], env_ids=ids)
    return steps * n


def process_writer(rb: Any, env_ids: list[int], first_tag: int, steps: int, chunk: int) -> None:
    """Body of a ``torch.multiprocessing`` writer process."""
    torch.set_num_threads(1)
    write_envs(rb, env_ids, first_tag, steps, chunk)


def write_grid(rb: Any, rows: int, num_envs: int = 2) -> None:
    """Extends an ``ndim=2`` buffer with ``rows`` steps of ``num_envs`` envs, one ``[num_envs, 1]``
    batch a call; step ``t`` of every env has observation ``t`` and reward 1."""
    for t in range(rows):
        obs = torch.full((num_envs, 1, 1), float(t), dtype=torch.float64)
        rb.extend(TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(num_envs, 1, 1),
                                                   "done": torch.zeros(num_envs, 1, 1, dtype=torch.bool)}},
                             [num_envs, 1]))
