"""TrajectorySampler: valid windows, env balance, strata, recent data, float64 starts, errors."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler


def ring_buffer(sizes, max_length, sampler, seed=0, offset=0) -> EnvRingReplayBuffer:
    """Env e written ``sizes[e]`` steps; x = 1000 * e + position."""
    rb = EnvRingReplayBuffer(num_envs=len(sizes), max_length=max_length, sampler=sampler,
                             generator=torch.Generator().manual_seed(seed))
    for t in range(max(sizes)):
        envs = [e for e, n in enumerate(sizes) if t < n]
        rb.extend(TensorDict({"x": torch.tensor([1000.0 * e + t for e in envs])}, [len(envs)]),
                  env_ids=envs)
    if offset:  # move every env's positions far up (same slots), as after a long run
        state = rb.storage.state_dict()
        pos, size, resets = state["counters"]
        state["counters"] = [pos + offset, size, resets]
        rb.storage.load_state_dict(state)
    return rb


def check_windows(batch, storage, sampler):
    env = batch["env_ids"][:, 0]
    start = batch["positions"][:, 0]
    earliest = storage.earliest_position()[env] + sampler.num_earliest_frames_ignored
    latest = storage.current_pos[env] - sampler.batch_length
    assert bool(((start >= earliest) & (start <= latest)).all())
    expected = 1000.0 * env.unsqueeze(1) + (start.unsqueeze(1) + torch.arange(sampler.batch_length)) % 1000
    assert torch.equal(batch["x"], expected.float())


@pytest.mark.parametrize("with_replacement", [False, True])
@pytest.mark.parametrize("batch_length, ignored", [(1, 0), (3, 0), (2, 2)])
def test_windows_are_stored_consecutive_steps_of_one_env(with_replacement, batch_length, ignored):
    sampler = TrajectorySampler(batch_length, num_earliest_frames_ignored=ignored,
                                with_replacement=with_replacement)
    rb = ring_buffer([12, 7, 9], max_length=8, sampler=sampler)
    batch = rb.sample(64)
    assert batch.shape == torch.Size([64, batch_length])
    check_windows(batch, rb.storage, sampler)


def test_without_replacement_each_env_covers_its_starts_exactly_once():
    # Env e has count_e valid starts; B = 3 * 6 with 6 starts each: every start once.
    sampler = TrajectorySampler(3)
    rb = ring_buffer([8, 20, 8], max_length=8, sampler=sampler)
    batch = rb.sample(18)
    for e in range(3):
        starts = batch["positions"][batch["env_ids"][:, 0] == e, 0].tolist()
        earliest = int(rb.storage.earliest_position()[e])
        assert sorted(starts) == list(range(earliest, earliest + 6))


def test_envs_are_balanced_with_distinct_random_extras():
    sampler = TrajectorySampler(1)
    rb = ring_buffer([5, 5, 5, 5], max_length=5, sampler=sampler)
    for seed in range(5):
        rb.set_rng(torch.Generator().manual_seed(seed))
        counts = Counter(rb.sample(10)["env_ids"][:, 0].tolist())
        assert sorted(counts.values()) == [2, 2, 3, 3]


def test_envs_without_a_valid_start_are_skipped():
    sampler = TrajectorySampler(4)
    rb = ring_buffer([10, 3, 6], max_length=10, sampler=sampler)  # env 1 is too short
    batch = rb.sample(20)
    assert set(batch["env_ids"][:, 0].tolist()) == {0, 2}
    check_windows(batch, rb.storage, sampler)


def test_no_valid_start_anywhere_raises():
    sampler = TrajectorySampler(4, num_earliest_frames_ignored=1)
    rb = ring_buffer([4, 3], max_length=10, sampler=sampler)
    with pytest.raises(ValueError, match=r"no env holds a window of batch_length=4 after ignoring 1 earliest steps \(steps per env: \[4, 3\]\)"):
        rb.sample(2)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        EnvRingReplayBuffer(num_envs=2, max_length=3).sample(2)


def test_uniform_with_replacement_matches_a_chi_square_bound():
    sampler = TrajectorySampler(2, with_replacement=True)
    rb = ring_buffer([11], max_length=11, sampler=sampler)  # 10 valid starts
    starts = rb.sample(20000)["positions"][:, 0]
    observed = torch.bincount(starts, minlength=10).double()
    expected = 20000 / 10
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 99.9% quantile, 9 degrees of freedom


def assert_uniform(counts, draws, probability):
    """Each count within 5 standard deviations of ``draws * probability`` (binomial, or fewer:
    distinct windows of one draw are negatively correlated)."""
    expected = draws * probability
    bound = 5 * math.sqrt(draws * max(probability * (1 - probability), probability))
    assert all(abs(c - expected) < bound for c in counts), (counts, expected, bound)


@pytest.mark.parametrize("starts, windows", [(3, 2), (5, 3), (7, 4), (4, 3), (9, 9), (2, 3), (3, 5)])
def test_without_replacement_every_start_is_equally_likely_and_windows_distinct(starts, windows):
    # Was: integer strata of unequal width ([0, 1) and [1, 3) for 3 starts, 2 windows) drew
    # the start of a narrow stratum every time, those of wide ones half as often.
    sampler = TrajectorySampler(2)
    rb = ring_buffer([starts + 1], max_length=starts + 1, sampler=sampler)
    counts, draws = [0] * starts, 3000
    for _ in range(draws):
        own = sampler.sample(rb.storage, windows)[1]["positions"].tolist()
        if starts >= windows:
            assert len(set(own)) == windows, own
        for s in own:
            counts[s] += 1
    assert_uniform(counts, draws, windows / starts)


def test_env_balanced_draws_are_uniform_within_each_env():
    # batch 7 over 3 envs: one random env takes a third window. Valid starts: 5, 3, 4.
    sampler = TrajectorySampler(1)
    rb = ring_buffer([5, 3, 4], max_length=5, sampler=sampler)
    counts, draws = [[0] * n for n in (5, 3, 4)], 3000
    for _ in range(draws):
        info = sampler.sample(rb.storage, 7)[1]
        for e in range(3):
            own = info["positions"][info["env_ids"] == e].tolist()
            assert len(set(own)) == len(own) in (2, 3)
            for s in own:
                counts[e][s] += 1
    for e, n in enumerate((5, 3, 4)):
        assert_uniform(counts[e], draws, (2 + 1 / 3) / n)


def test_recent_windows_are_uniform_over_the_newest_starts():
    # 2 recent windows among the newest 3 of 10 starts: each of those is drawn 2/3 of the time.
    sampler = TrajectorySampler(1, recent_data_steps=3, recent_data_ratio=0.5)
    rb = ring_buffer([10], max_length=10, sampler=sampler)
    counts, draws = [0] * 3, 3000
    for _ in range(draws):
        recent = sampler.sample(rb.storage, 4)[1]["positions"][:2].tolist()
        assert len(set(recent)) == 2 and min(recent) >= 7
        for s in recent:
            counts[s - 7] += 1
    assert_uniform(counts, draws, 2 / 3)


def test_recent_windows_come_first_and_start_among_the_newest():
    sampler = TrajectorySampler(2, recent_data_steps=3, recent_data_ratio=0.25)
    rb = ring_buffer([40, 40], max_length=40, sampler=sampler)
    batch = rb.sample(16)
    recent = math.ceil(16 * 0.25)
    start = batch["positions"][:, 0]
    latest = 40 - 2
    assert bool((start[:recent] > latest - 3).all())
    # The rest is plain sampling: spread over all 39 starts, strata per env.
    assert int(start[recent:].min()) < latest - 3
    check_windows(batch, rb.storage, sampler)


def test_recent_share_is_unused_when_plain_sampling_reaches_recent_data():
    # (stored / envs - (T - 1)) * ratio = (6 - 1) * 0.5 = 2.5 <= recent_data_steps = 3.
    sampler = TrajectorySampler(2, recent_data_steps=3, recent_data_ratio=0.5)
    rb = ring_buffer([6, 6], max_length=6, sampler=sampler)
    assert sampler._recent_batch_size(rb.storage, 10) == 0
    sampler.recent_data_ratio = 0.7  # 3.5 > 3
    assert sampler._recent_batch_size(rb.storage, 10) == 7


def test_starts_are_exact_far_beyond_float32():
    # ALF computes starts in float32 and loses positions above 2**24 (bug Q19).
    sampler = TrajectorySampler(1)
    rb = ring_buffer([8], max_length=8, sampler=sampler, offset=2**40 + 3)
    starts = rb.sample(8)["positions"][:, 0].tolist()
    assert sorted(starts) == list(range(2**40 + 3, 2**40 + 11))


def test_same_seed_same_batch():
    sampler = TrajectorySampler(2)
    first = ring_buffer([9, 9], max_length=9, sampler=sampler, seed=3).sample(5)
    second = ring_buffer([9, 9], max_length=9, sampler=TrajectorySampler(2), seed=3).sample(5)
    assert torch.equal(first["x"], second["x"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_length": 0}, "batch_length must be an int >= 1, got batch_length=0"),
        ({"num_earliest_frames_ignored": -1}, "num_earliest_frames_ignored must be an int >= 0"),
        ({"recent_data_steps": 0}, "recent_data_steps must be an int >= 1"),
        ({"recent_data_ratio": 1.5}, r"recent_data_ratio must be a number in \[0, 1\], got recent_data_ratio=1.5"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrajectorySampler(**kwargs)


def test_bad_batch_size_and_storage_raise():
    sampler = TrajectorySampler(1)
    rb = ring_buffer([3], max_length=3, sampler=sampler)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got batch_size=0"):
        sampler.sample(rb.storage, 0)
    with pytest.raises(TypeError, match="samples windows from an EnvRingStorage, got LazyTensorStorage"):
        sampler.sample(LazyTensorStorage(4), 2)


# --------------------------------------------------------------------------- settings after construction
@pytest.mark.parametrize(
    "name,value,exc,match",
    [
        ("recent_data_ratio", 5.0, ValueError, "recent_data_ratio must be a number in \\[0, 1\\], got recent_data_ratio=5.0"),
        ("recent_data_ratio", math.nan, ValueError, "recent_data_ratio must be a number in \\[0, 1\\]"),
        ("recent_data_steps", 0, ValueError, "recent_data_steps must be an int >= 1, got recent_data_steps=0"),
        ("num_earliest_frames_ignored", -1, ValueError, "num_earliest_frames_ignored must be an int >= 0"),
        ("batch_length", 0, ValueError, "batch_length must be an int >= 1"),
    ],
)
def test_settings_are_checked_as_the_constructor_checks_them(name, value, exc, match):
    sampler = TrajectorySampler(2, recent_data_steps=3, recent_data_ratio=0.5)
    old = getattr(sampler, name)
    with pytest.raises(exc, match=match):
        setattr(sampler, name, value)
    assert getattr(sampler, name) == old
    kwargs = {"recent_data_steps": 3, "recent_data_ratio": 0.5}
    with pytest.raises(exc, match=match):
        TrajectorySampler(**{"batch_length": 2, **kwargs, name: value})


def test_recent_data_ratio_set_later_is_used():
    sampler = TrajectorySampler(1)
    rb = ring_buffer([50], 100, sampler)
    sampler.recent_data_ratio, sampler.recent_data_steps = 1.0, 2
    starts = rb.sample(8)["positions"][:, 0]
    assert set(starts.tolist()) <= {48, 49}  # every window from the two newest starts


def test_with_replacement_refuses_other_values_in_the_constructor_and_the_setter():
    """The string "False" is truthy: taken as a flag it would draw with replacement."""
    with pytest.raises(TypeError, match="with_replacement must be True or False, got with_replacement='False'"):
        TrajectorySampler(2, with_replacement="False")
    sampler = TrajectorySampler(2)
    with pytest.raises(TypeError, match="with_replacement must be True or False, got with_replacement='False'"):
        sampler.with_replacement = "False"
    assert sampler.with_replacement is False
