"""PrioritizedNStepSampler: n-step chains, the prioritized draw, PER weights, write-back, checkpoints.

Every stored observation names its step (``1000 * env + time``), so a walk over
the written history in float64 Python says what each sampled transition must hold.
"""
from __future__ import annotations

import math
import pickle
import random

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedNStepSampler, PrioritizedSampler
from torchrl_ext.storages import FastTensorStorage

GAMMA = 0.9
# 99.9% quantile of the chi-square distribution with 7 degrees of freedom.
CHI2_999_DF7 = 24.322


def collect(rng: random.Random, history: list[list[dict]], steps: int) -> TensorDict:
    """``[num_envs, steps]`` transitions continuing each env's history (episodes end at random)."""
    num_envs = len(history)
    rows = [[] for _ in range(num_envs)]
    for env in range(num_envs):
        for _ in range(steps):
            t = len(history[env])
            row = {"obs": 1000.0 * env + t, "next_obs": 1000.0 * env + t + 0.5,
                   "reward": round(rng.uniform(-1, 1), 3), "done": rng.random() < 0.2}
            row["terminated"] = row["done"] and rng.random() < 0.5
            history[env].append(row)
            rows[env].append(row)
    col = lambda name, dtype=torch.float32: torch.tensor(  # noqa: E731
        [[r[name] for r in env_rows] for env_rows in rows], dtype=dtype).unsqueeze(-1)
    return TensorDict({
        "obs": col("obs"), "action": col("obs") + 0.25,
        "next": {"obs": col("next_obs"), "reward": col("reward"), "done": col("done", torch.bool),
                 "terminated": col("terminated", torch.bool)},
    }, [num_envs, steps])


def make_buffer(kind: str, rows: int, num_envs: int, **sampler_kwargs) -> tuple:
    sampler_kwargs = {"alpha": 1.0, "beta": 0.5, "eps": 0.0, "n_step": 3, "gamma": GAMMA} | sampler_kwargs
    sampler = PrioritizedNStepSampler(rows * num_envs, **sampler_kwargs)
    storage_cls = FastTensorStorage if kind == "fast" else LazyTensorStorage
    buffer_cls = TorchRLTensorDictReplayBuffer if kind == "torchrl" else TensorDictReplayBuffer
    rb = buffer_cls(storage=storage_cls(rows * num_envs, ndim=2), sampler=sampler,
                    generator=torch.Generator().manual_seed(0), priority_key="td_error")
    return rb, sampler


def fill(kind: str, seed: int, num_envs: int = 3, rows: int = 7, steps: int = 17):
    rng = random.Random(seed)
    rb, sampler = make_buffer(kind, rows, num_envs)
    history = [[] for _ in range(num_envs)]
    written = 0
    while written < steps:
        # TorchRL's own buffer cannot take [num_envs, 1] batches: chunks of 2+.
        chunk = min(rng.randint(2, 4), steps - written)
        chunk = max(chunk, 2) if kind == "torchrl" else chunk
        rb.extend(collect(rng, history, chunk))
        written += chunk
    return rb, sampler, history


def start_time(rb, index: torch.Tensor, history) -> tuple[int, int, int]:
    """``(env, start time, newest time)`` of a sampled ``(row, env)`` index."""
    row, env = index.tolist()
    rows = rb.storage._storage.shape[0]
    newest = len(history[env]) - 1
    return env, newest - (newest % rows - row) % rows, newest


def walk(history, env: int, start: int, newest: int, n: int) -> tuple[float, int]:
    """float64 discounted reward sum and the chain's last offset ``m``."""
    total, k = 0.0, 0
    while True:
        row = history[env][start + k]
        total += GAMMA ** k * row["reward"]
        if row["done"] or start + k == newest or k == n - 1:
            return total, k
        k += 1


def cells(rb) -> int:
    return int(rb.storage._storage.shape[0] * rb.storage._storage.shape[1])


# --------------------------------------------------------------------------- n-step values
@pytest.mark.parametrize("kind", ["fast", "lazy", "torchrl"])
@pytest.mark.parametrize("seed", range(4))
def test_chains_equal_a_float64_walk_over_the_streams(kind, seed):
    rb, sampler, history = fill(kind, seed)
    # Uneven priorities so the draw is not uniform; every cell stays drawable.
    flat = torch.arange(sampler.max_size)
    sampler.update_priority(flat, torch.rand(flat.numel(), generator=torch.Generator().manual_seed(seed)) + 0.1)
    count = cells(rb)  # the sampler wants at least batch_size stored steps
    batch = torch.cat([rb.sample(count) for _ in range(3)])
    assert batch["priority_weight"].shape == (3 * count,)
    assert batch["index"].shape == (3 * count, 2)
    for i in range(3 * count):
        env, start, newest = start_time(rb, batch["index"][i], history)
        reward, m = walk(history, env, start, newest, sampler.n_step)
        first, last = history[env][start], history[env][start + m]
        assert batch["obs"][i, 0].item() == first["obs"]
        assert batch["action"][i, 0].item() == first["obs"] + 0.25
        assert batch["next", "obs"][i, 0].item() == last["next_obs"]
        assert bool(batch["next", "done"][i, 0]) == last["done"]
        assert bool(batch["next", "terminated"][i, 0]) == last["terminated"]
        assert int(batch["steps_to_next_obs"][i, 0]) == m + 1
        assert batch["next", "reward"][i, 0].item() == pytest.approx(reward, abs=1e-5)
        assert batch["nstep_discount"][i, 0].item() == pytest.approx(GAMMA ** (m + 1), rel=1e-6)


def test_chains_stop_at_the_newest_step_of_each_env():
    rb, sampler = make_buffer("fast", rows=6, num_envs=2, n_step=4)
    rb.extend(TensorDict({"obs": torch.arange(6.0).reshape(2, 3, 1), "next": {
        "obs": torch.arange(6.0).reshape(2, 3, 1) + 1, "reward": torch.ones(2, 3, 1),
        "done": torch.zeros(2, 3, 1, dtype=torch.bool)}}, [2, 3]))
    # Only the newest step of env 1 (time 2, obs 5) keeps a priority.
    sampler.update_priority(torch.arange(12), 0.0)
    rb.update_priority(torch.tensor([[2, 1]]), torch.tensor([1.0]))
    batch = rb.sample(8)
    assert batch["obs"].flatten().tolist() == [5.0] * 8
    assert batch["steps_to_next_obs"].flatten().tolist() == [1] * 8
    assert batch["next", "reward"].flatten().tolist() == [1.0] * 8


# --------------------------------------------------------------------------- sampling law
def test_one_huge_priority_dominates_and_zero_priorities_are_never_drawn():
    rb, sampler, history = fill("fast", seed=1)
    n = sampler.max_size
    priority = torch.ones(n)
    priority[: n // 2] = 0.0  # eps=0: these cells cannot be drawn at all
    priority[n - 1] = 1e6
    sampler.update_priority(torch.arange(n), priority)
    drawn = torch.cat([rb.sample(256)["index"] for _ in range(8)])
    flat = drawn[:, 0] * 3 + drawn[:, 1]
    assert bool((flat >= n // 2).all())
    assert (flat == n - 1).float().mean().item() > 0.99


def test_tiny_priorities_are_drawn_rarely_with_eps():
    rb, sampler = make_buffer("fast", rows=8, num_envs=2, eps=1e-6, alpha=0.6)
    rb.extend(collect(random.Random(0), [[], []], 8))
    priority = torch.full((16,), 1e-9)
    priority[5] = 10.0
    rb.update_priority(torch.stack([torch.arange(16) // 2, torch.arange(16) % 2], 1), priority)
    drawn = torch.cat([rb.sample(500)["index"] for _ in range(4)])
    flat = drawn[:, 0] * 2 + drawn[:, 1]
    # P(any tiny cell) = 15 * (1e-6)^0.6 / (10^0.6 + 15 * (1e-6)^0.6) ~ 1e-3: ~2 of 2000 draws.
    assert (flat != 5).sum().item() <= 12


def test_start_frequencies_follow_priorities_to_the_alpha():
    rb, sampler = make_buffer("fast", rows=4, num_envs=2, alpha=0.7, eps=1e-8)
    rb.extend(collect(random.Random(3), [[], []], 4))
    priority = torch.tensor([1.0, 2.0, 3.0, 0.5, 8.0, 1.0, 4.0, 2.5])
    sampler.update_priority(torch.arange(8), priority)
    counts = torch.zeros(8)
    for _ in range(20):
        index = rb.sample(500)["index"]
        counts += torch.bincount(index[:, 0] * 2 + index[:, 1], minlength=8)
    expected = (priority + 1e-8) ** 0.7
    expected = expected / expected.sum() * counts.sum()
    assert float(((counts - expected) ** 2 / expected).sum()) < CHI2_999_DF7


# --------------------------------------------------------------------------- weights
@pytest.mark.parametrize("alpha, beta, eps", [(1.0, 0.5, 0.0), (0.6, 0.4, 1e-3), (0.5, 1.0, 1e-6)])
def test_importance_weights_follow_the_per_formula(alpha, beta, eps):
    rb, sampler, _ = fill("lazy", seed=2)
    rb._sampler = sampler = PrioritizedNStepSampler(sampler.max_size, alpha, beta, eps,
                                                    n_step=3, gamma=GAMMA)
    n = cells(rb)
    raw = [0.05 * (i % 9) + 0.01 * i for i in range(n)]
    sampler.update_priority(torch.arange(n), torch.tensor(raw))
    batch = rb.sample(64)
    # Schaul et al.: P(i) = p_i^a / sum_k p_k^a, w_i = (N P(i))^-b / max_j (N P(j))^-b.
    powered = [(p + eps) ** alpha for p in raw]
    total = sum(powered)
    prob = [p / total for p in powered]
    # Zero-priority cells are never drawn, so they need no weight: the max is over the others.
    w_max = max((n * p) ** -beta for p in prob if p > 0)
    for (row, env), weight in zip(batch["index"].tolist(), batch["priority_weight"].tolist()):
        i = row * 3 + env
        assert weight == pytest.approx((n * prob[i]) ** -beta / w_max, rel=1e-4)


# --------------------------------------------------------------------------- priorities
def test_new_steps_get_the_largest_priority_seen():
    rb, sampler, history = fill("fast", seed=4, steps=4)
    assert sampler.default_priority == 1.0
    rb.update_priority(torch.tensor([[0, 0], [1, 2]]), torch.tensor([0.5, 7.0]))
    rb.extend(collect(random.Random(9), history, 2))  # times 4 and 5 -> rows 4 and 5
    new = sampler.tree.leaves[4 * 3: 6 * 3]
    torch.testing.assert_close(new, torch.full((6,), 7.0))


def test_written_back_td_errors_change_the_next_samples():
    rb, sampler, history = fill("fast", seed=5)
    batch = rb.sample(16)
    favourite = batch["index"][0].clone()
    # Everything else drops to zero priority; the favourite's start gets 5.
    sampler.update_priority(torch.arange(sampler.max_size), 0.0)
    batch["td_error"] = torch.zeros(16, 1)
    same = (batch["index"] == favourite).all(-1)
    batch["td_error"][same] = 5.0
    rb.update_tensordict_priority(batch)
    again = rb.sample(32)
    assert bool((again["index"] == favourite).all())
    assert torch.allclose(again["priority_weight"], torch.ones(32))
    row, env = favourite.tolist()
    assert sampler.tree.leaves[row * 3 + env].item() == pytest.approx(5.0)


def test_per_agent_priorities_are_reduced_by_the_sampler():
    rb, sampler, _ = fill("fast", seed=6)
    sampler.reduction = "mean"
    # [N, A] priorities (one per agent) straight to the sampler; TorchRL's buffer
    # flattens multi-dim priorities of a 2-D storage, so reduce before going through it.
    sampler.update_priority(torch.tensor([[1, 1]]), torch.tensor([[2.0, 4.0]]), storage=rb.storage)
    assert sampler.tree.leaves[1 * 3 + 1].item() == pytest.approx(3.0)


# --------------------------------------------------------------------------- TorchRL hooks
def test_is_a_prioritized_sampler_for_torchrl():
    sampler = PrioritizedNStepSampler(12, 0.6, 0.4, n_step=2)
    assert isinstance(sampler, PrioritizedSampler)
    assert isinstance(sampler, TorchRLPrioritizedSampler)
    assert "n_step=2" in repr(sampler)


def test_n_step_and_gamma_can_change_between_samples():
    rb, sampler, history = fill("fast", seed=7)
    sampler.n_step, sampler.gamma = 1, 0.5
    batch = rb.sample(32)
    assert bool((batch["steps_to_next_obs"] == 1).all())
    assert torch.allclose(batch["nstep_discount"], torch.full((32, 1), 0.5))
    with pytest.raises(ValueError, match="n_step must be an int >= 1, got n_step=0"):
        sampler.n_step = 0


def test_state_dict_round_trip(tmp_path):
    rb, sampler, _ = fill("fast", seed=8)
    n = sampler.max_size
    sampler.update_priority(torch.arange(n), torch.linspace(0.1, 3.0, n))
    sampler.gamma = 0.8
    state = sampler.state_dict()
    restored = PrioritizedNStepSampler(n, 0.1, 0.1, n_step=1)
    restored.load_state_dict(state)
    assert (restored.n_step, restored.gamma, restored.alpha, restored.beta) == (3, 0.8, 1.0, 0.5)
    torch.testing.assert_close(restored.tree.leaves, sampler.tree.leaves)
    # Same trees and RNG state: same draws, same weights, same chains. (A new
    # buffer over the filled storage would re-mark every stored step as new.)
    sampler._rng = torch.Generator().manual_seed(1)
    restored._rng = torch.Generator().manual_seed(1)
    (row, env), expected = sampler.sample(rb.storage, 16)
    (row_r, env_r), got = restored.sample(rb.storage, 16)
    assert torch.equal(row, row_r) and torch.equal(env, env_r)
    for key in ("priority_weight", ("next", "reward"), "steps_to_next_obs"):
        torch.testing.assert_close(got[key], expected[key])
    # Files and pickles too.
    sampler.dumps(tmp_path / "sampler")
    from_files = PrioritizedNStepSampler(n, 0.1, 0.1)
    from_files.loads(tmp_path / "sampler")
    torch.testing.assert_close(from_files.tree.leaves, sampler.tree.leaves)
    assert from_files.gamma == 0.8
    clone = pickle.loads(pickle.dumps(sampler))
    torch.testing.assert_close(clone.tree.leaves, sampler.tree.leaves)


@pytest.mark.parametrize("dropped", ["gamma", "n_step"])
def test_a_state_with_half_the_chain_settings_is_refused_before_anything_changes(dropped):
    # Was: a state with n_step but no gamma raised a bare KeyError('gamma'); one with gamma but
    # no n_step was loaded and its gamma silently ignored.
    state = PrioritizedNStepSampler(8, 0.5, 0.5, n_step=2, gamma=0.3).state_dict()
    del state[dropped]
    sampler = PrioritizedNStepSampler(8, 0.9, 0.9, n_step=5, gamma=0.9)
    with pytest.raises(ValueError, match=rf"state_dict lacks \['{dropped}'\]: it is damaged or of another "
                                         r"sampler; pass a PrioritizedNStepSampler's own state_dict\(\)"):
        sampler.load_state_dict(state)
    assert (sampler.n_step, sampler.gamma, sampler.alpha, sampler.beta) == (5, 0.9, 0.9, 0.9)


def test_empty_resets_the_priorities():
    rb, sampler, _ = fill("fast", seed=9)
    rb.empty()
    assert sampler.tree.leaves.sum().item() == 0
    with pytest.raises(RuntimeError, match="empty storage"):
        rb.sample(4)


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("kwargs, error, match", [
    ({"n_step": 0}, ValueError, r"n_step must be an int >= 1, got n_step=0"),
    ({"n_step": 2.5}, ValueError, r"n_step must be an int >= 1, got n_step=2.5"),
    ({"gamma": 1.5}, ValueError, r"gamma must be a number in \[0, 1\], got gamma=1.5"),
    ({"alpha": -1.0}, ValueError, r"alpha must be >= 0.0, got alpha=-1.0"),
    ({"beta": -2.0}, ValueError, r"beta must be >= 0\.0, got beta=-2.0"),
    ({"eps": -1.0}, ValueError, r"eps must be >= 0.0, got eps=-1.0"),
    ({"max_capacity": 0}, ValueError, r"max_capacity must be an int >= 1, got max_capacity=0"),
    ({"weights": "rank"}, ValueError, r"weights must be one of \('per', 'alf'\), got weights='rank'"),
    ({"agent_group": 3}, TypeError, r"agent_group must be the name of the agents' group key"),
])
def test_bad_arguments_raise(kwargs, error, match):
    args = {"max_capacity": 12, "alpha": 0.6, "beta": 0.4} | kwargs
    with pytest.raises(error, match=match):
        PrioritizedNStepSampler(**args)


def test_bad_storages_and_sizes_raise():
    # Refused when the ring buffer is built: at its first extend, the batch was already stored.
    with pytest.raises(TypeError, match=r"supports tensor storages with ndim=2 .* got EnvRingStorage; "
                                        r"for per-env rings \(EnvRingStorage\) use NStepSampler"):
        EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=PrioritizedNStepSampler(8, 0.6, 0.4))
    # Was: refused at the first extend, after the batch was stored (len(rb) 0 -> 4 or 8).
    with pytest.raises(TypeError, match="got a 1-D FastTensorStorage"):
        TensorDictReplayBuffer(storage=FastTensorStorage(8), sampler=PrioritizedNStepSampler(8, 0.6, 0.4))
    with pytest.raises(TypeError, match="got ListStorage; "):  # TorchRL's default storage
        TensorDictReplayBuffer(sampler=PrioritizedNStepSampler(8, 0.6, 0.4))
    for storage in (FastTensorStorage(8, ndim=2), LazyTensorStorage(8, ndim=2)):
        with pytest.raises(ValueError, match=r"the sampler holds max_capacity=4 priorities but the storage "
                                             r"holds max_size=8 cells; build the sampler with max_capacity=8"):
            TensorDictReplayBuffer(storage=storage, sampler=PrioritizedNStepSampler(4, 0.6, 0.4))
    # 10 cells over 3 envs round up to 4 rows = 12 cells: a tree of 10 is too small, which only
    # the first batch tells; it is refused before anything is stored.
    for storage in (FastTensorStorage(10, ndim=2), LazyTensorStorage(10, ndim=2)):
        small = TensorDictReplayBuffer(storage=storage, sampler=PrioritizedNStepSampler(10, 0.6, 0.4))
        with pytest.raises(ValueError, match=r"max_capacity=10 is smaller than the storage's 12 cells "
                                             r"\(4 rows x 3 envs\): build the sampler with max_capacity=12"):
            small.extend(collect(random.Random(0), [[], [], []], 2))
        assert len(small) == 0 and not small.storage.initialized
        small.extend(collect(random.Random(0), [[], [], [], [], []], 2))  # 5 envs: 2 rows, 10 cells
        assert len(small) == 10
    rb, _, _ = fill("fast", seed=0, steps=2)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got batch_size=0"):
        rb.sample(0)
    assert rb.sample(7)["index"].shape == (7, 2)  # with replacement: no minimum fill
    with pytest.raises(ValueError, match="needs .'next', 'reward'. in the stored data"):
        bare = TensorDictReplayBuffer(storage=FastTensorStorage(4, ndim=2),
                                      sampler=PrioritizedNStepSampler(4, 0.6, 0.4))
        bare.extend(TensorDict({"obs": torch.zeros(2, 2, 1), "next": {
            "done": torch.zeros(2, 2, 1, dtype=torch.bool)}}, [2, 2]))
        bare.sample(2)


def test_uniform_n_step_sampler_is_unchanged_by_the_shared_chains():
    """NStepSampler and the prioritized one with alpha=0 give the same chains for the same starts."""
    rb, sampler, history = fill("fast", seed=11)
    uniform = NStepSampler(3, GAMMA)
    streams = uniform._streams(rb.storage, 8)
    env, start = torch.tensor([0, 1, 2, 0]), torch.tensor([0, 3, 5, 6])
    index_a, info_a = uniform._chains(streams, env, start)
    index_b, info_b = sampler._nstep._chains(streams, env, start)
    assert all(torch.equal(a, b) for a, b in zip(index_a, index_b))
    for key, value in info_a.items():
        assert torch.equal(value, info_b[key]), key
    assert math.isclose(sampler.gamma, uniform.gamma)
