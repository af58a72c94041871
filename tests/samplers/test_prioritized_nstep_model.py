"""PrioritizedNStepSampler over FastTensorStorage(n, ndim=2), model-based.

A hypothesis state machine extends a small ``[rows, num_envs]`` storage with
``[num_envs, T]`` collector batches that wrap around the ring (random dones),
writes priorities back with ``update_priority`` and round-trips the buffer
through ``state_dict``. The model is the documented contract:

* storage: the round-robin ring of ``tests/storages/test_fast_model.py``,
  time row ``k`` (counted since the start) lands in row ``k % rows``;
* priorities: a new cell gets the largest priority seen (``initial_priority`` = 1 before one),
  ``update_priority`` sets the raw priority of the cells ``(row, env)``; the
  sum-tree leaf of cell ``(row, env)`` (flat ``row * num_envs + env``) is
  ``(p + eps) ** alpha`` and 0 for never-written cells;
* samples: every start is a stored cell; its transition is the chain of at
  most ``n_step`` steps of the same env from the start, stopping at the first
  done step and at the newest stored step: ``("next", reward)`` is
  ``sum_k gamma**k r_k`` over the chain, ``steps_to_next_obs`` its length,
  root entries come from the start and ``"next"`` entries from the chain end.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from tensordict import TensorDict

from tests._hypothesis import StateDictRoundTrip, machine_settings
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import PrioritizedNStepSampler
from torchrl_ext.storages import FastTensorStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

GAMMA = 0.8


def reward_of(uid: int) -> float:
    return ((uid * 37) % 11 - 5) / 4  # deterministic, varied, exact in float32


class PrioritizedChainModel:
    """Ring of time rows (one uid per env), done flags and raw priorities per cell."""

    def __init__(self, rows: int, num_envs: int) -> None:
        self.R, self.N = rows, num_envs
        self.written = 0  # time rows written so far
        self.uid: dict[tuple[int, int], int] = {}  # (time, env) -> uid
        self.done: dict[int, bool] = {}
        self.priority: dict[tuple[int, int], float] = {}  # (ring row, env) -> raw priority
        self.max_seen = 1.0  # initial_priority

    def filled(self) -> int:
        return min(self.written, self.R)

    def time_of_row(self, row: int) -> int:
        """The stored time row held by ring row ``row``."""
        oldest = self.written - self.filled()
        return oldest + (row - oldest) % self.R

    def write(self, uids: list[list[int]], dones: list[list[bool]]) -> None:
        """``uids[e][t]``: ``T`` new time rows of every env."""
        for t in range(len(uids[0])):
            k = self.written
            for e in range(self.N):
                self.uid[(k, e)] = uids[e][t]
                self.done[uids[e][t]] = dones[e][t]
                self.priority[(k % self.R, e)] = self.max_seen
            self.written += 1

    def update(self, cells: list[tuple[int, int]], priorities: list[float]) -> None:
        for cell, p in zip(cells, priorities):  # last write wins
            self.priority[cell] = p
        self.max_seen = max([self.max_seen, *priorities])

    def chain(self, row: int, env: int, n: int) -> tuple[list[int], float]:
        """uids of the chain from the start cell and its discounted reward."""
        k = self.time_of_row(row)
        uids, total = [], 0.0
        while True:
            uid = self.uid[(k, env)]
            total += GAMMA ** len(uids) * reward_of(uid)
            uids.append(uid)
            if self.done[uid] or k == self.written - 1 or len(uids) == n:
                return uids, total
            k += 1


def batch_of(uids: list[list[int]], dones: list[list[bool]]) -> TensorDict:
    obs = torch.tensor(uids, dtype=torch.float32).unsqueeze(-1)  # [N, T, 1]
    reward = torch.tensor([[reward_of(u) for u in row] for row in uids]).unsqueeze(-1)
    done = torch.tensor(dones).unsqueeze(-1)
    return TensorDict({"obs": obs, "next": {"obs": obs + 0.5, "reward": reward, "done": done}},
                      list(obs.shape[:2]))


class PrioritizedNStepMachine(StateDictRoundTrip, RuleBasedStateMachine):
    @initialize(rows=st.integers(1, 5), num_envs=st.integers(1, 3), n_step=st.integers(1, 4),
                alpha=st.sampled_from([0.0, 0.5, 1.0]), eps=st.sampled_from([1e-8, 0.1]),
                seed=st.integers(0, 2**16))
    def build(self, rows, num_envs, n_step, alpha, eps, seed) -> None:
        self.R, self.N, self.n, self.alpha, self.eps, self.seed = rows, num_envs, n_step, alpha, eps, seed
        self.rb = self._new_buffer()
        self.model = PrioritizedChainModel(rows, num_envs)
        self.next_uid = 1

    def _new_buffer(self) -> TensorDictReplayBuffer:
        sampler = PrioritizedNStepSampler(self.R * self.N, alpha=self.alpha, beta=0.5, eps=self.eps,
                                          n_step=self.n, gamma=GAMMA)
        return TensorDictReplayBuffer(storage=FastTensorStorage(self.R * self.N, ndim=2),
                                      sampler=sampler, generator=torch.Generator().manual_seed(self.seed))

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def extend(self, data) -> None:
        steps = data.draw(st.integers(1, self.R), label="T")
        uids = [list(range(self.next_uid + e * steps, self.next_uid + (e + 1) * steps))
                for e in range(self.N)]
        self.next_uid += self.N * steps
        dones = [[data.draw(st.booleans() if data.draw(st.booleans(), label="rare") else st.just(False),
                            label="done") for _ in row] for row in uids]
        self.rb.extend(batch_of(uids, dones))
        self.model.write(uids, dones)

    @rule(data=st.data())
    def update_priority(self, data) -> None:
        filled = self.model.filled()
        if filled == 0:
            return
        cells = data.draw(st.lists(st.tuples(st.integers(0, filled - 1), st.integers(0, self.N - 1)),
                                   min_size=1, max_size=5), label="cells")
        priorities = data.draw(st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0]), min_size=len(cells),
                                        max_size=len(cells)), label="priorities")
        self.rb.update_priority(torch.tensor(cells), torch.tensor(priorities))
        self.model.update(cells, priorities)

    @rule(batch=st.integers(1, 6))
    def sample(self, batch: int) -> None:
        m = self.model
        if m.filled() == 0:
            with pytest.raises(RuntimeError):
                self.rb.sample(batch)
            return
        out = self.rb.sample(batch)
        for b, (row, env) in enumerate(out["index"].tolist()):
            assert 0 <= row < m.filled() and 0 <= env < self.N
            uids, reward = m.chain(row, env, self.n)
            assert int(out["steps_to_next_obs"][b].reshape(-1)[0]) == len(uids)
            assert float(out["next", "reward"][b].reshape(-1)[0]) == pytest.approx(reward, abs=1e-5)
            assert float(out["obs"][b].reshape(-1)[0]) == uids[0]
            assert float(out["next", "obs"][b].reshape(-1)[0]) == uids[-1] + 0.5
            assert bool(out["next", "done"][b].reshape(-1)[0]) == m.done[uids[-1]]

    # ------------------------------------------------------------------ invariants
    @invariant()
    def leaves_are_transformed_priorities(self) -> None:
        if not hasattr(self, "rb"):
            return
        m = self.model
        leaves = self.rb.sampler.tree.leaves[: self.R * self.N].tolist()
        expected = [0.0] * (self.R * self.N)
        for (row, env), p in m.priority.items():
            expected[row * self.N + env] = (p + self.eps) ** self.alpha
        assert leaves == pytest.approx(expected, rel=1e-5, abs=1e-12)
        assert len(self.rb) == m.filled() * self.N


PrioritizedNStepMachine.TestCase.settings = machine_settings(max_examples=20)
TestPrioritizedNStepMachine = PrioritizedNStepMachine.TestCase
