"""RolloutStorage + RolloutWriter + FeedForwardMinibatchSampler against a plain-Python rollout model.

A hypothesis state machine fills a ``[T + 1, N]`` rollout with ``insert``,
``insert_steps`` and ``rb.extend`` (through :class:`RolloutWriter`), calls
``after_update``, ``empty`` and checkpoint round trips, and runs minibatch
epochs (sometimes checkpointing buffer and sampler mid-epoch). The model keeps
the documented slot contract: step ``t`` goes to slot ``t``, its carried
``("next", "observation")`` to slot ``t + 1``, and ``after_update`` copies the carried
entries of the slot after the last step (``T`` when full) to slot 0 and restarts at step 0. Invariants: every
slot equals the model's, ``len == step * N``, and one epoch yields every
filled ``(t, n)`` exactly once with the data stored there.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from tests._hypothesis import StateDictRoundTrip, machine_settings
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import FeedForwardMinibatchSampler
from torchrl_ext.storages import RolloutStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


class RolloutModel:
    """Per-slot ``obs`` (carried), ``action`` and ``reward`` of each env (0 = never written)."""

    def __init__(self, num_steps: int, num_envs: int) -> None:
        self.T, self.N = num_steps, num_envs
        self.obs = [[0] * num_envs for _ in range(num_steps + 1)]
        self.action = [[0] * num_envs for _ in range(num_steps + 1)]
        self.reward = [[0] * num_envs for _ in range(num_steps + 1)]
        self.step = 0

    def fits(self, length: int) -> bool:
        return self.step + length <= self.T

    def write(self, steps: list[tuple[list[int], list[int], list[int]]]) -> None:
        """Each step is ``(obs, action, next_obs)`` per env; reward is ``-action``."""
        for obs, action, next_obs in steps:
            t = self.step
            self.obs[t], self.action[t], self.reward[t] = list(obs), list(action), [-a for a in action]
            self.obs[t + 1] = list(next_obs)
            self.step += 1

    def after_update(self) -> None:
        self.obs[0] = list(self.obs[self.step])  # slot T after a full rollout
        self.step = 0

    def filled(self) -> list[tuple[int, int]]:
        return [(t, n) for t in range(self.step) for n in range(self.N)]


def steps_td(steps: list[tuple[list[int], list[int], list[int]]]) -> TensorDict:
    """``[L, N]`` time-major steps with ``observation``, ``action`` and ``next`` entries."""
    obs = torch.tensor([s[0] for s in steps], dtype=torch.float32).unsqueeze(-1)
    action = torch.tensor([s[1] for s in steps], dtype=torch.int64)
    next_obs = torch.tensor([s[2] for s in steps], dtype=torch.float32).unsqueeze(-1)
    return TensorDict(
        {"observation": obs, "action": action,
         "next": {"observation": next_obs, "reward": (-action).float().unsqueeze(-1)}},
        list(action.shape),
    )


class RolloutMachine(StateDictRoundTrip, RuleBasedStateMachine):
    @initialize(
        num_steps=st.integers(1, 6),
        num_envs=st.integers(1, 3),
        split=st.one_of(st.integers(1, 4).map(lambda k: ("num", k)),
                        st.integers(1, 7).map(lambda k: ("size", k))),
        seed=st.integers(0, 2**16),
    )
    def build(self, num_steps: int, num_envs: int, split: tuple[str, int], seed: int) -> None:
        self.T, self.N, self.split, self.seed = num_steps, num_envs, split, seed
        self.rb = self._new_buffer()
        self.model = RolloutModel(num_steps, num_envs)
        self.uid = 1

    def _new_buffer(self) -> TensorDictReplayBuffer:
        kind, k = self.split
        sampler = (FeedForwardMinibatchSampler(k) if kind == "num"
                   else FeedForwardMinibatchSampler(mini_batch_size=k))
        sampler._rng = torch.Generator().manual_seed(self.seed)
        return TensorDictReplayBuffer(storage=RolloutStorage(self.T), sampler=sampler)

    @property
    def storage(self) -> RolloutStorage:
        return self.rb.storage

    def _steps(self, length: int) -> list[tuple[list[int], list[int], list[int]]]:
        """``length`` new steps; each starts from the observation carried into its slot."""
        steps = []
        for _ in range(length):
            obs = list(self.model.obs[self.model.step]) if not steps else list(steps[-1][2])
            action = list(range(self.uid, self.uid + self.N))
            next_obs = [1000 + a for a in action]
            self.uid += self.N
            steps.append((obs, action, next_obs))
        return steps

    # ------------------------------------------------------------------ writes
    @rule(data=st.data())
    def write(self, data) -> None:
        mode = data.draw(st.sampled_from(["insert", "insert_steps", "extend"]), label="mode")
        length = 1 if mode == "insert" else data.draw(st.integers(1, self.T), label="L")
        if not self.model.fits(length):
            before = self.snapshot()
            with pytest.raises(RuntimeError, match="after_update"):
                td = steps_td(self._steps(length))
                if mode == "insert":
                    self.storage.insert(td[0])
                elif mode == "insert_steps":
                    self.storage.insert_steps(td.transpose(0, 1))
                else:
                    self.rb.extend(td.transpose(0, 1))
            assert self.snapshot() == before
            return
        steps = self._steps(length)
        td = steps_td(steps)
        first = self.model.step
        if mode == "insert":
            self.storage.insert(td[0])
        elif mode == "insert_steps":
            self.storage.insert_steps(td.transpose(0, 1))  # a collector's [N, L]
        else:
            index = self.rb.extend(td.transpose(0, 1))
            assert index.tolist() == [[first + t, n] for t in range(length) for n in range(self.N)]
        self.model.write(steps)

    @rule()
    def after_update(self) -> None:
        self.storage.after_update()
        self.model.after_update()

    @rule()
    def empty(self) -> None:
        self.rb.empty()
        self.model.step = 0  # data is kept; only the step count restarts

    # ------------------------------------------------------------------ epochs
    @precondition(lambda self: self.model.step > 0)
    @rule(checkpoint_after=st.one_of(st.none(), st.integers(0, 4)))
    def epoch(self, checkpoint_after: int | None) -> None:
        """One epoch: every filled step exactly once, with its stored data."""
        m = self.model
        kind, k = self.split
        units = m.step * m.N
        if kind == "num" and k > units:
            with pytest.raises(ValueError, match="num_mini_batch"):
                self.rb.sample()
            self.rb.sampler._empty()
            return
        seen: list[tuple[int, int]] = []
        sizes = []
        sampler = self.rb.sampler
        sampler._empty()  # start a fresh epoch (an interrupted one is not checked)
        batches = 0
        while True:
            if checkpoint_after is not None and batches == checkpoint_after:
                fresh = self._new_buffer()
                fresh.load_state_dict(self.rb.state_dict())
                self.rb = fresh
                sampler = self.rb.sampler
            out, info = self.rb.sample(return_info=True)
            batches += 1
            t, n = info["index"]
            coords = list(zip(t.tolist(), n.tolist()))
            seen += coords
            sizes.append(len(coords))
            assert out["action"].tolist() == [m.action[a][b] for a, b in coords]
            assert out["observation"].squeeze(-1).tolist() == [float(m.obs[a][b]) for a, b in coords]
            assert out["next", "observation"].squeeze(-1).tolist() == [
                float(m.obs[a + 1][b]) for a, b in coords]
            if sampler.ran_out:
                break
            assert batches <= units
        sampler.ran_out = False
        assert sorted(seen) == m.filled()
        if kind == "num":  # no drop_last: k minibatches whose sizes differ by at most one
            assert len(sizes) == k and max(sizes) - min(sizes) <= 1
        else:  # full minibatches of k, then the remainder
            assert sizes == [k] * (units // k) + ([units % k] if units % k else [])

    # ------------------------------------------------------------------ invariants
    def _check_restored(self, old: TensorDictReplayBuffer) -> None:
        assert self.snapshot() == self.snapshot_of(old)

    def snapshot_of(self, rb: TensorDictReplayBuffer) -> tuple:
        storage = rb.storage
        if storage._storage is None:
            return storage.step, len(rb), None
        data = storage.data
        return (storage.step, len(rb), data["observation"].tolist(), data["action"].tolist(),
                data["next", "reward"].tolist())

    def snapshot(self) -> tuple:
        return self.snapshot_of(self.rb)

    @invariant()
    def slots_match_the_model(self) -> None:
        m, storage = self.model, self.storage
        assert storage.step == m.step
        if storage._storage is None:
            assert len(self.rb) == 0 and m.step == 0
            return
        assert len(self.rb) == len(storage) == m.step * m.N
        data = storage.data
        assert tuple(data.batch_size) == (m.T + 1, m.N)
        assert data["observation"].squeeze(-1).tolist() == [[float(o) for o in row] for row in m.obs]
        assert data["action"].tolist() == m.action
        assert data["next", "reward"].squeeze(-1).tolist() == [[float(r) for r in row] for row in m.reward]
        for t in range(m.T):
            assert storage.contains((t, 0)) == (t < m.step)


RolloutMachine.TestCase.settings = machine_settings()
TestRolloutMachine = RolloutMachine.TestCase
