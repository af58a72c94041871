"""All-or-nothing public calls: a refused call leaves the buffer exactly as it was.

A hypothesis state machine drives random sequences of valid calls (extend, add, sample,
priority write-backs, empty, dumps/loads) and invalid ones (bad dtypes, shapes, keys,
priorities, indices, settings, damaged checkpoints) on each buffer kind. Before every
invalid call it snapshots everything observable (length, stored rows, writer and sampler
state); the call must raise ``ValueError`` or ``TypeError`` and the snapshot taken after
must equal the one before. Valid calls keep the buffer in use, so refusals are tried on
empty, partly filled, wrapped and reloaded buffers alike.
"""
from __future__ import annotations

import math
import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from tensordict import TensorDict

from tests._hypothesis import machine_settings
from tests.test_errors import assert_refused, assert_same, damaged_checkpoint, freeze
from torchrl_ext.presets import alf_replay_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import FeedForwardMinibatchSampler, TrajectorySampler
from torchrl_ext.storages import EpisodicEnvRingStorage, FastTensorStorage, RolloutStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

CAPACITY, NUM_ENVS, MAX_LENGTH = 8, 3, 4
ROLLOUT_STEPS, ROLLOUT_ENVS = 4, 2
KINDS = ["fast", "prioritized", "ring", "alf_prioritized", "rollout", "episodic"]


def flat_rows(n: int, start: float, dtype: torch.dtype = torch.float32, dim: int = 2) -> TensorDict:
    obs = (torch.arange(n, dtype=torch.float64) + start).unsqueeze(1).expand(n, dim).to(dtype)
    return TensorDict({"obs": obs, "next": {"obs": obs + 1}}, [n])


def env_steps(n: int, start: float, dtype: torch.dtype = torch.float32, width: int = 1) -> TensorDict:
    x = (torch.arange(n, dtype=torch.float64) + start).to(dtype)
    return TensorDict({"x": x if width == 1 else x.unsqueeze(1).expand(n, width).clone()}, [n])


def rollout_step(start: float, dtype: torch.dtype = torch.float32, width: int = 2) -> TensorDict:
    """One step of every env as a collector batch ``[N, T=1]``."""
    obs = torch.full((ROLLOUT_ENVS, 1, width), start, dtype=torch.float64).to(dtype)
    return TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(ROLLOUT_ENVS, 1, 1),
                                            "done": torch.zeros(ROLLOUT_ENVS, 1, 1, dtype=torch.bool)}},
                      [ROLLOUT_ENVS, 1])


def snapshot(rb) -> dict:
    return freeze({"len": len(rb), "storage": rb.storage.state_dict(), "writer": rb.writer.state_dict(),
                   "sampler": rb.sampler.state_dict()})


class RefusedCallsMachine(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0.0

    @initialize(kind=st.sampled_from(KINDS))
    def build(self, kind: str) -> None:
        self.kind = kind
        self.rb = self._new_buffer()

    def _new_buffer(self):
        if self.kind == "fast":
            return TensorDictReplayBuffer(storage=FastTensorStorage(CAPACITY, strict=True), batch_size=4)
        if self.kind == "prioritized":
            return PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(CAPACITY, strict=True),
                                           batch_size=4)
        if self.kind == "ring":
            return EnvRingReplayBuffer(num_envs=NUM_ENVS, max_length=MAX_LENGTH, sampler=TrajectorySampler(1))
        if self.kind == "rollout":
            return TensorDictReplayBuffer(storage=RolloutStorage(ROLLOUT_STEPS),
                                          sampler=FeedForwardMinibatchSampler(2))
        if self.kind == "episodic":
            storage = EpisodicEnvRingStorage(NUM_ENVS, MAX_LENGTH, record_episodic_return=True, gamma=0.9)
            return EnvRingReplayBuffer(storage=storage, sampler=TrajectorySampler(1))
        return alf_replay_buffer(NUM_ENVS, MAX_LENGTH, prioritized_sampling=True, batch_size=4)

    @property
    def ring(self) -> bool:
        return self.kind in ("ring", "alf_prioritized", "episodic")

    def _batch(self, n: int, **kwargs) -> TensorDict:
        self.counter += 100.0
        if self.kind == "rollout":
            width = {"width": kwargs.pop("dim")} if "dim" in kwargs else {}
            return rollout_step(self.counter, **kwargs, **width)
        if self.kind == "episodic":
            steps = env_steps(NUM_ENVS, self.counter, **kwargs)
            step_type = torch.tensor([int(self.counter // 100) % 3] * NUM_ENVS, dtype=torch.int32)
            return steps.update({"step_type": step_type, "discount": (step_type != 2).float(),
                                 "reward": torch.ones(NUM_ENVS)})
        if self.ring:
            return env_steps(NUM_ENVS, self.counter, **kwargs)
        return flat_rows(n, self.counter, **kwargs)

    def refused(self, call, errors=(ValueError, TypeError)) -> None:
        if self.kind == "rollout" and self.rb.storage.step >= ROLLOUT_STEPS:
            errors = (*errors, RuntimeError)  # a full rollout refuses any insert first
        assert_refused(lambda: snapshot(self.rb), call, errors)

    # ------------------------------------------------------------------ valid calls
    @rule(n=st.integers(1, CAPACITY))
    def extend(self, n: int) -> None:
        if self.kind == "rollout" and self.rb.storage.step >= ROLLOUT_STEPS:
            self.refused(lambda: self.rb.extend(self._batch(n)), errors=(RuntimeError,))  # full
            self.rb.storage.after_update()
        self.rb.extend(self._batch(n))

    @rule(bad=st.sampled_from([None, math.nan]))
    def add(self, bad) -> None:
        if self.ring:
            return
        if self.kind == "rollout":  # add() takes one step of every env
            if self.rb.storage.step < ROLLOUT_STEPS and bad is None:
                self.rb.add(self._batch(1)[:, 0])
            return
        item = self._batch(1)[0]
        if bad is None:
            self.rb.add(item)
        elif self.kind == "prioritized":
            self.refused(lambda: self.rb.add(item.set("td_error", torch.tensor(bad))))

    @rule(n=st.integers(1, 6))
    def sample(self, n: int) -> None:
        if len(self.rb):
            batch = self.rb.sample(n)
            if self.kind == "prioritized":
                self.rb.update_priority(batch["index"], torch.rand(n) + 0.1)

    @rule()
    def empty(self) -> None:
        self.rb.empty()

    @rule()
    def round_trip(self) -> None:
        if not len(self.rb):
            return
        restored = self._new_buffer()
        with tempfile.TemporaryDirectory() as folder:
            self.rb.dumps(folder)
            restored.loads(folder)
        assert_same(snapshot(self.rb)["len"], snapshot(restored)["len"])
        self.rb = restored

    # ------------------------------------------------------------------ refused calls
    @rule(dtype=st.sampled_from([torch.float64, torch.int64]))
    def extend_with_another_dtype(self, dtype: torch.dtype) -> None:
        if len(self.rb) and self.kind != "rollout":  # the first write fixes the layout; rollouts cast
            self.refused(lambda: self.rb.extend(self._batch(2, dtype=dtype)))

    @rule()
    def extend_with_another_shape(self) -> None:
        if not len(self.rb):
            return
        batch = self._batch(2, width=3) if self.ring and self.kind != "rollout" else self._batch(2, dim=5)
        self.refused(lambda: self.rb.extend(batch))

    @rule()
    def extend_with_a_missing_key(self) -> None:
        if not len(self.rb):
            return
        batch = self._batch(2)
        batch = batch.rename_key_("x", "y") if self.ring else batch.exclude(("next", "obs"))
        if self.kind == "rollout":
            batch = self._batch(2).exclude("obs")
        self.refused(lambda: self.rb.extend(batch))

    @rule(bad=st.sampled_from([math.nan, math.inf, -1.0]))
    def extend_with_a_bad_priority(self, bad: float) -> None:
        if self.kind not in ("prioritized", "alf_prioritized"):
            return
        batch = self._batch(3).set("td_error", torch.tensor([1.0, bad, 1.0]))  # NUM_ENVS == 3
        self.refused(lambda: self.rb.extend(batch))

    @rule(bad=st.sampled_from([math.nan, -2.0]))
    def update_with_a_bad_priority(self, bad: float) -> None:
        if self.kind == "prioritized" and len(self.rb):
            self.refused(lambda: self.rb.update_priority(torch.tensor([0]), torch.tensor([bad])))

    @rule(index=st.integers(0, CAPACITY + 3))
    def update_an_unstored_item(self, index: int) -> None:
        if self.kind == "prioritized" and index >= len(self.rb):
            self.refused(lambda: self.rb.update_priority(torch.tensor([index]), torch.tensor([1.0])))

    @rule(setting=st.sampled_from([("alpha", -1.0), ("alpha", math.inf), ("beta", -1.0), ("beta", math.nan)]))
    def bad_setting(self, setting: tuple[str, float]) -> None:
        if self.kind == "prioritized":
            self.refused(lambda: setattr(self.rb.sampler, *setting))

    @rule(n=st.sampled_from([-1, 2.5, "4"]))
    def bad_batch_size(self, n) -> None:
        if len(self.rb):
            self.refused(lambda: self.rb.sample(n))

    @rule(ids=st.sampled_from([[0, 0, 1], [0, 1, NUM_ENVS], [-1, 0, 1]]))
    def bad_env_ids(self, ids: list[int]) -> None:
        if self.ring:
            self.refused(lambda: self.rb.extend(self._batch(NUM_ENVS), env_ids=ids))

    @rule(field=st.sampled_from([("step_type", 7), ("step_type", -1), ("discount", math.nan), ("discount", 1.5)]))
    def bad_episode_field(self, field: tuple[str, float]) -> None:
        if self.kind != "episodic":
            return
        batch = self._batch(NUM_ENVS)
        key, value = field
        batch[key] = torch.full_like(batch[key], value)
        self.refused(lambda: self.rb.extend(batch))

    @rule()
    def too_many_steps(self) -> None:
        if self.ring:
            steps = TensorDict({"x": torch.zeros(NUM_ENVS, MAX_LENGTH + 1)}, [NUM_ENVS, MAX_LENGTH + 1])
            self.refused(lambda: self.rb.extend(steps))
            self.refused(lambda: self.rb.extend(steps, blocking=True, timeout=0.01))

    @rule(where=st.sampled_from(["first", "largest"]))
    def load_a_damaged_checkpoint(self, where: str) -> None:
        if not len(self.rb):
            return
        with damaged_checkpoint(self.rb.dumps, where) as folder:
            self.refused(lambda: self.rb.loads(folder))


TestRefusedCalls = RefusedCallsMachine.TestCase
TestRefusedCalls.settings = machine_settings(step_count=25)
