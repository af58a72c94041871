"""PrioritizedTrajectorySampler's leaves against a model that keys priorities by step, not by slot.

Seeded random runs write env subsets (``[N]`` and ``[N, T]``, wrapping the
rings), remove and clear envs, change ``batch_length`` and
``num_earliest_frames_ignored``, update window priorities (stale starts
included), round-trip the buffer (pickle, ``state_dict``) and sample. The model
follows the documented rules with no notion of ring slots: a priority belongs
to the written step (its uid) that starts the window; a start becoming valid
keeps its step's priority if it has one (so starts valid again after a
geometry change keep theirs), else gets ``max(largest current leaf,
(initial_priority + eps) ** alpha)``. Leaves are brought up to date exactly
when the sampler syncs: at a sample that has an eligible env and at a
priority update. After every sync the tree's leaves equal the model's; every
drawn window is a valid start with a positive leaf and ``priority_weight``
``leaf * nnz / total``. So a new step never inherits the priority of the step
it overwrote, whatever else (a clear of another env, a new ``batch_length``)
happened before the next sync.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from tests._hypothesis import SOAK
from tests.storages import test_ring_model as ring
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import PrioritizedTrajectorySampler

pytestmark = pytest.mark.soak  # `make test-soak` runs TORCHRL_EXT_SOAK seeds

SETTINGS = [(1.0, 0.0, 1.0), (0.5, 0.1, 2.0), (1.0, 0.0, 0.5)]  # (alpha, eps, initial_priority)


def f32(value: float) -> float:
    return float(np.float32(value))


class LeafModel(ring.RingModel):
    """The ring model plus the transformed priority of each step (by uid) and the tree's leaves."""

    def __init__(self, num_envs: int, max_length: int, alpha: float, eps: float, initial: float) -> None:
        super().__init__(num_envs, max_length)
        self.alpha, self.eps, self.initial = alpha, eps, initial
        self.known: dict[int, float] = {}  # uid -> (priority + eps) ** alpha, float32
        self.leaves: dict[tuple[int, int], float] = {}  # (env, start) -> leaf, as of the last sync

    def transformed(self, priority: float) -> float:
        return f32((priority + self.eps) ** self.alpha)

    def valid_starts(self, e: int, length: int, ignored: int) -> range:
        return range(self.earliest(e) + ignored, self.pos[e] - length + 1)

    def sync(self, length: int, ignored: int) -> None:
        valid = [(e, p) for e in range(self.E) for p in self.valid_starts(e, length, ignored)]
        kept = [self.known[self.data[e][p]] for e, p in valid if self.data[e][p] in self.known]
        new = max(kept + [self.transformed(self.initial)])
        for e, p in valid:
            self.known.setdefault(self.data[e][p], new)
        self.leaves = {(e, p): self.known[self.data[e][p]] for e, p in valid}


def check(rb: EnvRingReplayBuffer, m: LeafModel, length: int, ignored: int, batch: int | None) -> None:
    """Brings the model up to date as the sampler would (a sample that has an eligible env, or
    an update: ``batch=None``), then checks the tree's leaves and, for a sample, the draws."""
    sampler = rb.sampler
    if batch is not None:
        if not any(m.valid_starts(e, length, ignored) for e in range(m.E)):
            with pytest.raises((RuntimeError, ValueError)):  # refused before the sampler syncs
                rb.sample(batch)
            return
        m.sync(length, ignored)
        if not any(m.leaves.values()):
            with pytest.raises(ValueError, match="priority 0"):
                rb.sample(batch)
        else:
            out = rb.sample(batch)
            total, nnz = sum(m.leaves.values()), sum(v > 0 for v in m.leaves.values())
            envs, starts = out["env_ids"][:, 0].tolist(), out["positions"][:, 0].tolist()
            for e, s, weight in zip(envs, starts, out["priority_weight"][:, 0].tolist()):
                leaf = m.leaves.get((e, s), 0.0)
                assert leaf > 0, (e, s, m.leaves)
                assert weight == pytest.approx(leaf * nnz / total, rel=1e-5), (e, s, m.leaves)
    expected = [0.0] * (m.E * m.L)  # leaf of slot e * L + p % L: the model's leaf of start (e, p), else 0
    for (e, p), leaf in m.leaves.items():
        expected[e * m.L + p % m.L] = leaf
    assert sampler._tree.leaves[: m.E * m.L].tolist() == expected, m.leaves


@pytest.mark.parametrize("seed", range(SOAK or 60))
def test_leaves_follow_a_model_keyed_by_step(seed):
    rng = random.Random(seed)
    E, L, length, ignored = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 3), rng.choice([0, 0, 1])
    alpha, eps, initial = rng.choice(SETTINGS)
    replacement = rng.random() < 0.5

    def new_buffer() -> EnvRingReplayBuffer:  # with the current geometry
        sampler = PrioritizedTrajectorySampler(length, alpha=alpha, eps=eps, initial_priority=initial,
                                               num_earliest_frames_ignored=ignored, with_replacement=replacement)
        return EnvRingReplayBuffer(num_envs=E, max_length=L, sampler=sampler,
                                   generator=torch.Generator().manual_seed(seed))

    rb, m, uid = new_buffer(), LeafModel(E, L, alpha, eps, initial), 1
    for _ in range(60):
        op = rng.random()
        if op < 0.4:  # [N] or [N, T] steps of an env subset, wrapping the rings
            env_ids = sorted(rng.sample(range(E), rng.randint(1, E)))
            two_d = rng.random() < 0.5
            steps = rng.randint(1, L) if two_d else 1
            uids = [list(range(uid + i * steps, uid + (i + 1) * steps)) for i in range(len(env_ids))]
            uid += steps * len(env_ids)
            rb.extend(ring.steps_td(uids, two_d), env_ids=env_ids)
            m.write(env_ids, uids)
        elif op < 0.46:
            env_ids, n = rng.sample(range(E), rng.randint(1, E)), rng.randint(1, L)
            rb.remove_up_to(n, env_ids=env_ids)
            m.remove_up_to(n, env_ids)
        elif op < 0.52:
            env_ids = rng.sample(range(E), rng.randint(1, E))
            rb.clear(env_ids=env_ids)
            m.clear(env_ids)
        elif op < 0.58:  # a new geometry
            length, ignored = rng.randint(1, 3), rng.randint(0, 2)
            rb.sampler.batch_length, rb.sampler.num_earliest_frames_ignored = length, ignored
        elif op < 0.75:  # priorities for random (env, position) pairs, stale ones included
            pairs = sorted({(rng.randrange(E), rng.randint(0, max(m.pos) + 1)) for _ in range(rng.randint(1, 4))})
            values = [rng.choice([0.0, 0.5, 1.0, 3.0]) for _ in pairs]
            rb.update_window_priority([e for e, _ in pairs], [p for _, p in pairs], values)
            m.sync(length, ignored)
            for (e, p), value in zip(pairs, values):
                if p in m.valid_starts(e, length, ignored):  # stale starts are skipped
                    m.known[m.data[e][p]] = m.leaves[(e, p)] = m.transformed(value)
            check(rb, m, length, ignored, None)
        elif op < 0.79:
            if rng.random() < 0.5:
                rb = pickle.loads(pickle.dumps(rb))
            else:
                fresh = new_buffer()
                fresh.load_state_dict(rb.state_dict())
                rb = fresh
        else:
            check(rb, m, length, ignored, rng.randint(1, 5))
