"""TrajectorySampler, PrioritizedTrajectorySampler and NStepSampler over per-env rings, model-based.

One hypothesis state machine feeds the same stream of transitions (env
subsets, ``[N]`` steps and ``[N, T]`` blocks, random dones) to three
``EnvRingReplayBuffer`` s, one per sampler, and dequeues, clears and
checkpoints them together. The ring bookkeeping is the plain-Python
``RingModel`` of ``tests/storages/test_ring_model.py``; on top of it the model
keeps each step's reward and done flag. Checked at every sample:

* trajectory windows (plain and prioritized) are ``batch_length`` consecutive
  stored steps of one env (never an overwritten or dequeued step), with the
  data written there;
* a prioritized window whose start was given priority 0 (while it was a valid
  start) is never drawn, updates of stale starts are skipped without error,
  and sampling raises when every valid start has priority 0;
* an n-step sample's reward is ``sum_k gamma**k r_{s+k}`` from its start,
  stopping at the first done step, at the env's newest step or after
  ``n_step`` steps; ``steps_to_next_obs`` and the chain end agree with it.
"""
from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from tests._hypothesis import machine_settings
from tests.storages import test_ring_model as ring
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedTrajectorySampler, TrajectorySampler

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

GAMMA = 0.8


def reward_of(uid: int) -> float:
    return ((uid * 37) % 11 - 5) / 4  # deterministic, varied, exact in float32


def transitions(uids: list[list[int]], dones: list[list[bool]], two_d: bool) -> TensorDict:
    """Rows of steps: ``observation = uid``, ``("next", "observation") = uid + 0.5``."""
    obs = torch.tensor(uids, dtype=torch.float32).unsqueeze(-1)
    reward = torch.tensor([[reward_of(u) for u in row] for row in uids], dtype=torch.float32).unsqueeze(-1)
    done = torch.tensor(dones).unsqueeze(-1)
    td = TensorDict({"observation": obs, "next": {"observation": obs + 0.5, "reward": reward,
                                                   "done": done, "terminated": done.clone()}},
                    list(obs.shape[:2]))
    return td if two_d else td[:, 0]


class StreamModel(ring.RingModel):
    """The ring model plus each step's done flag (rewards follow from the uid)."""

    def __init__(self, num_envs: int, max_length: int) -> None:
        super().__init__(num_envs, max_length)
        self.done: dict[int, bool] = {}

    def valid_starts(self, e: int, length: int) -> list[int]:
        return list(range(self.earliest(e), self.pos[e] - length + 1))

    def nstep(self, e: int, start: int, n: int) -> tuple[float, int]:
        """Discounted reward and step count of the chain from ``start``."""
        total, k = 0.0, 0
        while True:
            uid = self.data[e][start + k]
            total += GAMMA ** k * reward_of(uid)
            if self.done[uid] or start + k == self.pos[e] - 1 or k == n - 1:
                return total, k + 1
            k += 1


class StreamMachine(RuleBasedStateMachine):
    @initialize(num_envs=st.integers(1, 3), max_length=st.integers(1, 7),
                length=st.integers(1, 3), n_step=st.integers(1, 4), seed=st.integers(0, 2**16))
    def build(self, num_envs: int, max_length: int, length: int, n_step: int, seed: int) -> None:
        self.E, self.L, self.T, self.n, self.seed = num_envs, max_length, length, n_step, seed
        self.buffers = self._new_buffers()
        self.model = StreamModel(num_envs, max_length)
        self.next_uid = 1
        self.zeroed: set[int] = set()  # uids of start steps whose window got priority 0

    def _new_buffers(self) -> dict[str, EnvRingReplayBuffer]:
        samplers = {
            "trajectory": TrajectorySampler(self.T, with_replacement=True),
            "prioritized": PrioritizedTrajectorySampler(self.T, with_replacement=True),
            "nstep": NStepSampler(self.n, GAMMA),
        }
        return {name: EnvRingReplayBuffer(num_envs=self.E, max_length=self.L, sampler=sampler,
                                          generator=torch.Generator().manual_seed(self.seed))
                for name, sampler in samplers.items()}

    # ------------------------------------------------------------------ writes and removals
    @rule(data=st.data())
    def extend(self, data) -> None:
        env_ids = sorted(data.draw(ring.subsets(self.E, min_size=1), label="env_ids"))
        two_d = data.draw(st.booleans(), label="two_d")
        steps = data.draw(st.integers(1, self.L), label="T") if two_d else 1
        uids = []
        for _ in env_ids:
            uids.append(list(range(self.next_uid, self.next_uid + steps)))
            self.next_uid += steps
        dones = [[data.draw(st.booleans() if data.draw(st.booleans(), label="rare") else st.just(False),
                            label="done") for _ in row] for row in uids]
        td = transitions(uids, dones, two_d)
        for rb in self.buffers.values():
            rb.extend(td.clone(), env_ids=torch.tensor(env_ids))
        self.model.write(env_ids, uids)
        for row, flags in zip(uids, dones):
            self.model.done.update(zip(row, flags))

    @rule(data=st.data())
    def dequeue_or_clear(self, data) -> None:
        env_ids = data.draw(ring.subsets(self.E), label="env_ids")
        if data.draw(st.booleans(), label="clear"):
            for rb in self.buffers.values():
                rb.clear(env_ids)
            self.model.clear(env_ids)
            return
        n = data.draw(st.integers(0, self.L), label="n")
        for rb in self.buffers.values():
            rb.remove_up_to(n, env_ids=env_ids)
        self.model.remove_up_to(n, env_ids)

    @precondition(lambda self: self.buffers["prioritized"].storage.initialized)
    @rule()
    def checkpoint(self) -> None:
        fresh = self._new_buffers()
        with tempfile.TemporaryDirectory() as path:
            for name, rb in self.buffers.items():
                rb.dumps(f"{path}/{name}")
                fresh[name].loads(f"{path}/{name}")
        self.buffers = fresh

    # ------------------------------------------------------------------ priorities
    @rule(data=st.data())
    def update_priorities(self, data) -> None:
        """Priorities for some starts, stale ones included; valid zero ones are remembered."""
        m = self.model
        e = data.draw(st.integers(0, self.E - 1), label="env")
        lo, hi = m.earliest(e) - 2, m.pos[e] + 1
        positions = data.draw(st.lists(st.integers(max(lo, 0), max(hi, 0)), min_size=1, max_size=4,
                                       unique=True), label="positions")
        priorities = data.draw(st.lists(st.sampled_from([0.0, 0.5, 2.0]), min_size=len(positions),
                                        max_size=len(positions)), label="priorities")
        self.buffers["prioritized"].update_window_priority([e] * len(positions), positions, priorities)
        valid = set(m.valid_starts(e, self.T))
        for p, priority in zip(positions, priorities):
            if p in valid:
                uid = m.data[e][p]
                (self.zeroed.add if priority == 0 else self.zeroed.discard)(uid)

    # ------------------------------------------------------------------ samples
    def _check_windows(self, out: TensorDict, info: dict) -> list[tuple[int, int]]:
        m = self.model
        windows = list(zip(info["env_ids"].tolist(), info["positions"].tolist()))
        for b, (e, s) in enumerate(windows):
            assert s in m.valid_starts(e, self.T), (e, s, m.earliest(e), m.pos[e])
            expected = [float(m.data[e][s + t]) for t in range(self.T)]
            assert out["observation"][b].reshape(-1).tolist() == expected
        return windows

    @rule(batch=st.integers(1, 6))
    def sample_trajectories(self, batch: int) -> None:
        m = self.model
        has_window = any(m.valid_starts(e, self.T) for e in range(self.E))
        rb = self.buffers["trajectory"]
        if not has_window:
            with pytest.raises((RuntimeError, ValueError)):
                rb.sample(batch, return_info=True)
        else:
            self._check_windows(*rb.sample(batch, return_info=True))
        rb = self.buffers["prioritized"]
        drawable = [(e, s) for e in range(self.E) for s in m.valid_starts(e, self.T)
                    if m.data[e][s] not in self.zeroed]
        if not drawable:
            with pytest.raises((RuntimeError, ValueError)):
                rb.sample(batch, return_info=True)
            return
        for e, s in self._check_windows(*rb.sample(batch, return_info=True)):
            assert m.data[e][s] not in self.zeroed

    @rule(batch=st.integers(1, 6))
    def sample_nstep(self, batch: int) -> None:
        m, rb = self.model, self.buffers["nstep"]
        if sum(m.size) == 0:
            with pytest.raises(RuntimeError, match="empty"):
                rb.sample(batch)
            return
        if sum(m.size) < batch:  # documented: at least batch_size stored transitions
            with pytest.raises(ValueError, match="at least batch_size"):
                rb.sample(batch)
            return
        out = rb.sample(batch)
        for b, (e, start, end) in enumerate(out["index"].tolist()):
            assert m.earliest(e) <= start <= end < m.pos[e]
            reward, count = m.nstep(e, start, self.n)
            assert end == start + count - 1
            assert int(out["steps_to_next_obs"][b].reshape(-1)[0]) == count
            assert float(out["next", "reward"][b].reshape(-1)[0]) == pytest.approx(reward, abs=1e-5)
            assert float(out["observation"][b].reshape(-1)[0]) == m.data[e][start]
            assert float(out["next", "observation"][b].reshape(-1)[0]) == m.data[e][end] + 0.5
            assert bool(out["next", "done"][b].reshape(-1)[0]) == m.done[m.data[e][end]]

    # ------------------------------------------------------------------ invariant
    @invariant()
    def rings_agree(self) -> None:
        for rb in self.buffers.values():
            assert rb.storage.current_pos.tolist() == self.model.pos
            assert rb.storage.current_size.tolist() == self.model.size


StreamMachine.TestCase.settings = machine_settings()
TestStreamMachine = StreamMachine.TestCase
