"""PathGAEReplayBuffer's gamma / lam / eps stay checked when set after construction."""
from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import PathGAEReplayBuffer


def _path(rb: PathGAEReplayBuffer) -> torch.Tensor:
    """Stores rewards 1, 2, 4 with V = 0, finishes the path at a terminal state, samples it all."""
    rb.store(TensorDict({"observation": torch.zeros(3, 2), "state_value": torch.zeros(3, 1),
                         "next": {"reward": torch.tensor([[1.0], [2.0], [4.0]])}}, [3]))
    rb.finish_path(last_val=0.0)
    return rb.sample_batch()["advantage"].flatten().sort().values


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("gamma", 1.5, r"gamma must be a number in \[0, 1\], got gamma=1.5"),
        ("gamma", math.nan, r"gamma must be a number in \[0, 1\], got gamma=nan"),
        ("lam", -0.1, r"lam must be a number in \[0, 1\], got lam=-0.1"),
        ("lam", "0.9", r"lam must be a real number, got '0.9'"),
        ("eps", math.nan, r"eps must be >= 0.0, got eps=nan"),
        ("eps", -1e-3, r"eps must be >= 0.0, got eps=-0.001"),
        ("eps", math.inf, r"eps must be a finite number, got eps=inf"),
    ],
)
def test_a_setting_set_later_is_checked_like_the_constructor_argument(name, bad, match):
    # Was: a plain attribute; rb.eps = nan made every sampled advantage NaN.
    error = TypeError if isinstance(bad, str) else ValueError
    with pytest.raises(error, match=match):
        PathGAEReplayBuffer(8, 4, **{name: bad})
    rb = PathGAEReplayBuffer(8, 4)
    before = getattr(rb, name)
    with pytest.raises(error, match=match):
        setattr(rb, name, bad)
    assert getattr(rb, name) == before
    torch.testing.assert_close(_path(rb), _path(PathGAEReplayBuffer(8, 4)))  # the old value is still used


def test_settings_set_later_are_used():
    rb = PathGAEReplayBuffer(8, 4, gamma=0.99, lam=0.5, eps=1e-3)
    rb.gamma, rb.lam, rb.eps = 0.5, 1.0, 1.0
    # Reference: with V = 0 and lam = 1 the advantages are the discounted returns
    # [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4] = [3, 4, 4], normalised by (x - mean) / (std + eps).
    returns = torch.tensor([3.0, 4.0, 4.0])
    mean = sum(returns.tolist()) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in returns.tolist()) / 3)
    torch.testing.assert_close(_path(rb), (returns - mean) / (std + 1.0))


def _random_path(steps: int) -> TensorDict:
    g = torch.Generator().manual_seed(steps)
    return TensorDict({"observation": torch.arange(float(steps)).unsqueeze(1),
                       "state_value": torch.randn(steps, 1, generator=g),
                       "next": {"reward": torch.randn(steps, 1, generator=g)}}, [steps])


def _finished_by_step(rb: PathGAEReplayBuffer) -> dict[float, tuple[float, float]]:
    stored = rb.storage[: len(rb)]
    return {float(o): (float(a), float(v)) for o, a, v in zip(
        stored["observation"][:, 0], stored["advantage"][:, 0], stored["value_target"][:, 0])}


@pytest.mark.parametrize("steps", [5, 8, 13])
def test_a_path_longer_than_the_ring_keeps_its_newest_steps_in_one_store(steps):
    # Was: one store() of more steps than the ring holds raised (advising strict=False, which
    # this buffer does not take); one step at a time kept the newest steps, as documented.
    whole, one_by_one = PathGAEReplayBuffer(5, 4, gamma=0.9, lam=0.8), PathGAEReplayBuffer(5, 4, gamma=0.9, lam=0.8)
    path = _random_path(steps)
    whole.store(path)
    for t in range(steps):
        one_by_one.store(path[t])
    whole.finish_path(0.5)
    one_by_one.finish_path(0.5)
    assert _finished_by_step(whole) == _finished_by_step(one_by_one)
    assert sorted(_finished_by_step(whole)) == [float(t) for t in range(steps - 5, steps)]
    # The next path overwrites the oldest steps first in both.
    for rb in (whole, one_by_one):
        rb.store(_random_path(2))
        rb.finish_path(0.0)
    assert sorted(whole.storage[:5]["observation"][:, 0].tolist()) == \
        sorted(one_by_one.storage[:5]["observation"][:, 0].tolist())
