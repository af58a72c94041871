"""EpisodicEnvRingStorage: episode index and recorded returns against a plain-Python model."""
from __future__ import annotations

import math
import random
import re

import pytest
import torch
from tensordict import TensorDict

import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.storages import EpisodicEnvRingStorage

FIRST, MID, LAST = 0, 1, 2


class Model:
    """Full per-env history since the last clear; answers every query by brute force."""

    def __init__(self, num_envs, max_length, gamma, clip, default):
        self.E, self.L, self.gamma, self.clip, self.default = num_envs, max_length, gamma, clip, default
        self.hist = [[] for _ in range(num_envs)]  # (step_type, discount, reward, opens)
        self.size = [0] * num_envs
        self.ret = [{} for _ in range(num_envs)]

    def add(self, e, step_type, discount, reward):
        opens = step_type == FIRST or not self.hist[e]  # first step since creation or clear
        h = self.hist[e]
        pos = len(h)
        h.append((step_type, discount, reward, opens))
        self.size[e] = min(self.size[e] + 1, self.L)
        self.ret[e][pos] = self.default
        if discount == 0 and pos > 0:
            prev0 = self.disc0(e, pos - 1)
            start = max(prev0, pos + 1 - self.size[e])
            for j in range(start, pos):
                g = 0.0
                for k in range(j, pos):
                    r = h[k + 1][2]
                    if self.clip is not None:
                        r = min(max(r, self.clip[0]), self.clip[1])
                    g += self.gamma ** (k - j) * h[k][1] * r
                self.ret[e][j] = g

    def disc0(self, e, p):
        h = self.hist[e]
        while not (h[p][3] or h[p][1] == 0):
            p -= 1
        return p

    def begin(self, e, p):
        while not self.hist[e][p][3]:
            p -= 1
        return p

    def end(self, e, p):
        h = self.hist[e]
        q = p
        while q + 1 < len(h) and not h[q + 1][3]:
            q += 1
        return q

    def clear(self, e):
        self.hist[e], self.size[e], self.ret[e] = [], 0, {}

    def dequeue(self, e, n):
        self.size[e] -= n

    def stored(self, e):
        pos = len(self.hist[e])
        return range(pos - self.size[e], pos)


def batch(env_ids, step_types, discounts, rewards):
    """[N] or [N, T] batch of ALF-style steps."""
    return TensorDict(
        {
            "step_type": torch.tensor(step_types, dtype=torch.int32),
            "discount": torch.tensor(discounts, dtype=torch.float32),
            "reward": torch.tensor(rewards, dtype=torch.float32),
            "obs": torch.zeros(*torch.tensor(step_types).shape, 2),
        },
        list(torch.tensor(step_types).shape),
    ).set("env_id", torch.tensor(env_ids) if torch.tensor(step_types).ndim == 1
          else torch.tensor(env_ids).unsqueeze(1).expand(torch.tensor(step_types).shape))


def random_step(rng):
    u = rng.random()
    if u < 0.12:
        return FIRST, 1.0, round(rng.uniform(-2, 2), 2)
    if u < 0.22:
        return LAST, 0.0, round(rng.uniform(-2, 2), 2)
    if u < 0.27:
        return LAST, 1.0, round(rng.uniform(-2, 2), 2)  # time limit: no return recorded
    if u < 0.31:
        return MID, 0.0, round(rng.uniform(-2, 2), 2)  # life loss
    return MID, 1.0, round(rng.uniform(-2, 2), 2)


def check(storage, model):
    for e in range(model.E):
        positions = list(model.stored(e))
        assert int(storage.current_size[e]) == len(positions)
        if not positions:
            continue
        env = torch.full((len(positions),), e)
        pos = torch.tensor(positions)
        assert storage.get_episode_begin_position(pos, env).tolist() == [model.begin(e, p) for p in positions]
        assert storage.steps_to_episode_end(pos, env).tolist() == [model.end(e, p) - p for p in positions]
        assert storage.get_disc_0_begin_position(pos, env).tolist() == [model.disc0(e, p) for p in positions]
        got = storage.get((env, pos))["discounted_return"].double()
        want = torch.tensor([model.ret[e][p] for p in positions], dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-5), (e, positions, got, want)


@pytest.mark.parametrize("seed", range(6))
def test_index_and_returns_match_the_model_on_random_streams(seed):
    rng = random.Random(seed)
    num_envs, max_length = rng.randint(1, 3), rng.randint(2, 7)
    clip = (-1.0, 1.5) if seed % 2 else None
    storage = EpisodicEnvRingStorage(num_envs, max_length, record_episodic_return=True,
                                     gamma=0.9, reward_clip=clip, default_return=-50.0)
    rb = EnvRingReplayBuffer(storage=storage)
    model = Model(num_envs, max_length, 0.9, clip, -50.0)
    for _ in range(80):
        u = rng.random()
        if u < 0.6:
            envs = sorted(rng.sample(range(num_envs), rng.randint(1, num_envs)))
            steps = [random_step(rng) for _ in envs]
            rb.extend(batch(envs, *zip(*steps)))
            for e, st in zip(envs, steps):
                model.add(e, *st)
        elif u < 0.8:
            # [N, T] blocks, sometimes long quiet stretches (the vectorised path).
            envs = sorted(rng.sample(range(num_envs), rng.randint(1, num_envs)))
            length = rng.randint(2, max_length)
            quiet = rng.random() < 0.5
            rows = [[(MID, 1.0, round(rng.uniform(-2, 2), 2)) if quiet else random_step(rng)
                     for _ in range(length)] for _ in envs]
            rb.extend(batch(envs, *[[[s[i] for s in row] for row in rows] for i in range(3)]))
            for e, row in zip(envs, rows):
                for st in row:
                    model.add(e, *st)
        elif u < 0.9:
            e = rng.randrange(num_envs)
            rb.clear(env_ids=[e])
            model.clear(e)
        else:
            e = rng.randrange(num_envs)
            if model.size[e]:
                n = rng.randint(1, model.size[e])
                rb.dequeue(n, env_ids=[e])
                model.dequeue(e, n)
        check(storage, model)


def test_alf_life_loss_example():
    # ALF's own test: [F, MID(d=0), MID, LAST] with rewards [., 0, -1, -1] -> [0, -0.99, -1, default].
    storage = EpisodicEnvRingStorage(1, 8, record_episodic_return=True, gamma=0.99)
    rb = EnvRingReplayBuffer(storage=storage)
    for st, d, r in [(FIRST, 1.0, 5.0), (MID, 0.0, 0.0), (MID, 1.0, -1.0), (LAST, 0.0, -1.0)]:
        rb.extend(batch([0], [st], [d], [r]))
    got = storage.get((torch.zeros(4, dtype=torch.long), torch.arange(4)))["discounted_return"]
    assert got.tolist() == pytest.approx([0.0, -0.99, -1.0, -1000.0])


def test_headless_episode_end_is_kept():
    storage = EpisodicEnvRingStorage(1, 4)
    rb = EnvRingReplayBuffer(storage=storage)
    rb.extend(batch([0], [FIRST], [1.0], [0.0]))
    for _ in range(6):
        rb.extend(batch([0], [MID], [1.0], [0.0]))
    # Positions 3..6 stored; the episode began at 0 (overwritten) and ends at 6 so far.
    pos = torch.arange(3, 7)
    env = torch.zeros(4, dtype=torch.long)
    assert storage.get_episode_begin_position(pos, env).tolist() == [0, 0, 0, 0]
    assert storage.steps_to_episode_end(pos, env).tolist() == [3, 2, 1, 0]


def test_returns_stay_finite_for_an_episode_of_100k_steps():
    # ALF's float32 gamma ** k underflows past about 10,000 steps and gives NaN (Q11).
    n = 100_000
    storage = EpisodicEnvRingStorage(1, n + 8, record_episodic_return=True, gamma=0.99)
    rb = EnvRingReplayBuffer(storage=storage)
    rewards = torch.rand(n, generator=torch.Generator().manual_seed(0))
    rb.extend(batch([0], [FIRST], [1.0], [0.0]))
    for start in range(1, n - 1, 20_000):
        stop = min(start + 20_000, n - 1)
        k = stop - start
        rb.extend(batch([0], [[MID] * k], [[1.0] * k], [rewards[start:stop].tolist()]))
    rb.extend(batch([0], [LAST], [0.0], [float(rewards[n - 1])]))
    got = storage.get((torch.zeros(n, dtype=torch.long), torch.arange(n)))["discounted_return"]
    assert bool(torch.isfinite(got).all())
    # float64 reference: G_j = r_{j+1} + 0.99 G_{j+1}
    ref = torch.zeros(n, dtype=torch.float64)
    g = 0.0
    r64 = rewards.double()
    for j in range(n - 2, -1, -1):
        g = float(r64[j + 1]) + 0.99 * g
        ref[j] = g
    assert torch.allclose(got[:-1].double(), ref[:-1], rtol=1e-5, atol=1e-4)
    assert float(got[-1]) == -1000.0


def test_checkpoint_keeps_the_index(tmp_path):
    storage = EpisodicEnvRingStorage(2, 5, record_episodic_return=True)
    rb = EnvRingReplayBuffer(storage=storage)
    rng = random.Random(3)
    for _ in range(12):
        rb.extend(batch([0, 1], *zip(*[random_step(rng) for _ in range(2)])))
    rb.dumps(tmp_path / "rb")
    fresh = EpisodicEnvRingStorage(2, 5, record_episodic_return=True)
    rb2 = EnvRingReplayBuffer(storage=fresh)
    rb2.loads(tmp_path / "rb")
    env = torch.tensor([0, 0, 1, 1])
    pos = torch.tensor([8, 11, 7, 10])
    assert torch.equal(fresh.steps_to_episode_end(pos, env), storage.steps_to_episode_end(pos, env))
    assert torch.equal(fresh.get((env, pos))["discounted_return"], storage.get((env, pos))["discounted_return"])


def test_bad_input():
    storage = EpisodicEnvRingStorage(1, 4, record_episodic_return=True)
    rb = EnvRingReplayBuffer(storage=storage)
    with pytest.raises(ValueError, match="needs 'step_type' in every written batch"):
        rb.extend(TensorDict({"obs": torch.zeros(1, 2)}, [1]))
    assert len(rb) == 0
    rb.extend(batch([0], [FIRST], [1.0], [0.0]))
    with pytest.raises(ValueError, match="position 1 of env 0 is not stored"):
        storage.steps_to_episode_end(torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\], got gamma=1.5"):
        EpisodicEnvRingStorage(1, 4, gamma=1.5)
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\], got gamma=nan"):
        EpisodicEnvRingStorage(1, 4, gamma=float("nan"))
    with pytest.raises(TypeError, match="gamma must be a real number"):
        EpisodicEnvRingStorage(1, 4, gamma="0.9")
    with pytest.raises(ValueError, match="reward_clip must be"):
        EpisodicEnvRingStorage(1, 4, reward_clip=(1.0, -1.0))
    with pytest.raises(RuntimeError, match="record_episodic_return=True"):
        EpisodicEnvRingStorage(1, 4).get_disc_0_begin_position(torch.tensor([0]), torch.tensor([0]))


def test_torchrl_is_init_flags_work_as_step_types():
    storage = EpisodicEnvRingStorage(1, 6, step_type_key="is_init")
    rb = EnvRingReplayBuffer(storage=storage)
    for flag in [True, False, False, True, False]:
        rb.extend(TensorDict({"is_init": torch.tensor([flag]), "obs": torch.zeros(1, 2)}, [1]))
    pos = torch.arange(5)
    env = torch.zeros(5, dtype=torch.long)
    assert storage.get_episode_begin_position(pos, env).tolist() == [0, 0, 0, 3, 3]
    assert storage.steps_to_episode_end(pos, env).tolist() == [2, 1, 0, 1, 0]


@pytest.mark.parametrize(("key", "value", "match"), [
    ("step_type", 7, r"'step_type' must hold ALF's StepType values 0 \(FIRST\), 1 \(MID\) or 2 \(LAST\)"),
    ("step_type", -1, r"'step_type' must hold ALF's StepType values"),
    ("discount", math.nan, r"'discount' must hold discounts in \[0, 1\]"),
    ("discount", 1.5, r"'discount' must hold discounts in \[0, 1\], got values in \[1.5, 1.5\]"),
])
def test_step_types_and_discounts_outside_their_range_are_refused_before_writing(key, value, match):
    # Were accepted: a step type of 7 counted as "not an episode start" and a NaN
    # discount made the recorded returns wrong without a word.
    storage = EpisodicEnvRingStorage(2, 5, record_episodic_return=True, gamma=0.9)
    rb = EnvRingReplayBuffer(storage=storage)
    rb.extend(batch([0, 1], [0, 0], [1.0, 1.0], [1.0, 2.0]))
    before = storage.state_dict()
    bad = batch([0, 1], [1, 1], [1.0, 1.0], [1.0, 1.0])
    bad[key] = torch.full_like(bad[key], value)
    with pytest.raises(ValueError, match=match):
        rb.extend(bad)
    after = storage.state_dict()
    for name in ("counters", "episodes"):
        assert all(torch.equal(a, b) for a, b in zip(after[name], before[name])), name
    assert len(rb) == 2


def _episode_state(storage):
    return [t.clone() for t in (storage.current_pos, storage.current_size, storage._is_first,
                                storage._indexed, storage._headless, storage._disc0, storage._returns)]


@pytest.mark.parametrize("fast", [True, False])
def test_write_without_reward_is_refused_before_anything_changes(fast):
    storage = EpisodicEnvRingStorage(1, 4, record_episodic_return=True, gamma=0.5)
    rb = EnvRingReplayBuffer(storage=storage)
    rb.extend(batch([0], [0], [1.0], [0.0]))
    rb.extend(batch([0], [1], [1.0], [1.0]))
    before = _episode_state(storage)
    for data in (batch([0], [2], [0.0], [2.0]).exclude("reward"),
                 batch([0], [2], [0.0], [2.0]).exclude("discount")):
        with torchrl_ext.fastpath(fast), pytest.raises(ValueError, match="needs '(reward|discount)' in every"):
            rb.extend(data)
        for got, expected in zip(_episode_state(storage), before):
            assert torch.equal(got, expected)
    assert storage.steps_to_episode_end(torch.tensor([0]), torch.tensor([0])).tolist() == [1]
    rb.extend(batch([0], [2], [0.0], [2.0]))  # the same step with its reward: G_0 = 1 + 0.5 * 2
    assert storage.get((torch.tensor([0, 0]), torch.arange(2)))["discounted_return"].tolist() == [2.0, 2.0]


def test_queries_refuse_float_positions_env_ids_and_unequal_lengths():
    storage = EpisodicEnvRingStorage(2, 8)
    rb = EnvRingReplayBuffer(storage=storage)
    for t in range(4):
        rb.extend(batch([0, 1], [0 if t == 0 else 1] * 2, [1.0, 1.0], [0.0, 0.0]))
    for query in (storage.get_episode_begin_position, storage.steps_to_episode_end):
        with pytest.raises(TypeError, match=r"positions must hold integer positions, got dtype=torch\.float32"):
            query(torch.tensor([3.5]), torch.tensor([0]))
        with pytest.raises(TypeError, match=r"env_ids must hold integer env ids, got dtype=torch\.float32"):
            query(torch.tensor([3]), torch.tensor([0.9]))
        with pytest.raises(ValueError, match=r"env_ids of shape \(2,\) and positions of shape \(3,\)"):
            query(torch.tensor([1, 2, 3]), torch.tensor([0, 1]))
    assert storage.get_episode_begin_position(torch.tensor([3, 2]), torch.tensor([0, 1])).tolist() == [0, 0]
    assert storage.steps_to_episode_end(torch.tensor([1, 3]), torch.tensor([1, 0])).tolist() == [2, 0]


@pytest.mark.parametrize("fast", [True, False])
def test_first_write_inside_inference_mode(fast):
    storage = EpisodicEnvRingStorage(2, 4, record_episodic_return=True, gamma=0.5)
    rb = EnvRingReplayBuffer(storage=storage, batch_size=2)
    with torchrl_ext.fastpath(fast):
        with torch.inference_mode():
            rb.extend(batch([0, 1], [0, 0], [1.0, 1.0], [0.0, 0.0]))
            rb.sample()
        rb.extend(batch([0, 1], [1, 2], [1.0, 0.0], [1.0, 2.0]))
        rb.sample()
    assert storage.get((torch.tensor([1]), torch.tensor([0])))["discounted_return"].tolist() == [2.0]
    assert storage.steps_to_episode_end(torch.tensor([0, 0]), torch.tensor([0, 1])).tolist() == [1, 1]


@pytest.mark.parametrize("bad", ["False", 2, 0, None, torch.tensor(True)])
def test_record_episodic_return_must_be_a_bool(bad):
    # bool("False") is True: a coerced flag would record returns the caller turned off.
    with pytest.raises(TypeError, match=rf"record_episodic_return must be True or False, got "
                                        rf"record_episodic_return={re.escape(repr(bad))}\."):
        EpisodicEnvRingStorage(2, 4, record_episodic_return=bad)


@pytest.mark.parametrize("first_write", [True, False])
@pytest.mark.parametrize("bad_key", ["reward", "discount", "step_type"])
def test_episode_fields_with_several_values_per_step_are_refused_first(bad_key, first_write):
    """ALF keeps one step type, discount and return per step: a [N, 2] entry was stored and then
    broke the episode bookkeeping (or left rings no valid write fit)."""
    storage = EpisodicEnvRingStorage(2, 4, record_episodic_return=True)
    rb = EnvRingReplayBuffer(storage=storage)
    if not first_write:
        rb.extend(batch([0, 1], [0, 0], [1.0, 1.0], [1.0, 1.0]))
    before = None if first_write else _episode_state(storage)
    bad = batch([0, 1], [0, 0], [1.0, 1.0], [1.0, 1.0])
    bad[bad_key] = bad[bad_key].unsqueeze(-1).expand(2, 2).clone()
    with pytest.raises(ValueError, match=rf"'{bad_key}' must hold one value per step, of shape \[2\] or \[2, 1\], got \[2, 2\]"):
        rb.extend(bad)
    if first_write:
        assert not storage.initialized and len(rb) == 0
    else:
        for got, expected in zip(_episode_state(storage), before):
            assert torch.equal(got, expected)
    # The storage takes valid steps as if nothing had happened: a 2-step episode, then its returns.
    rb.extend(batch([0, 1], [0, 0], [1.0, 1.0], [1.0, 1.0]))
    rb.extend(batch([0, 1], [2, 2], [0.0, 0.0], [1.0, 1.0]))
    assert len(rb) == (4 if first_write else 6)
