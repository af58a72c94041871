"""EnvRingWriter against the per-env ring model of ``tests/storages/test_ring_model.py``.

The storage machine there already drives env subsets, dequeues, clears and
``state_dict`` round trips. This one subclasses it (same model, same
invariants) and adds what the writer owns: refused writes (repeated or
out-of-range env ids, an env id that changes along time, more steps than
``max_length``) change nothing, single-step ``add``, ``has_room``,
``write_count`` (steps written since creation or ``empty()``), ``empty()``,
and checkpoints to files (``dumps``/``loads``) in the middle of a run.
"""
from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from tests._hypothesis import machine_settings
from tests.storages import test_ring_model as ring
from torchrl_ext.replay_buffers import EnvRingReplayBuffer

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


class EnvRingWriterMachine(ring.EnvRingMachine):
    """The storage machine plus the writer's own rules and a write counter in the model."""

    @initialize(num_envs=st.integers(1, 4), max_length=st.integers(1, 6))
    def build(self, num_envs: int, max_length: int) -> None:
        super().build(num_envs, max_length)
        self.written = 0

    @property
    def writer(self):
        return self.rb._writer

    def extend(self, data) -> None:  # counted override of the inherited rule
        before = sum(self.model.pos)
        super().extend(data)
        self.written += sum(self.model.pos) - before

    extend = rule(data=st.data())(extend)

    @rule(env=st.data())
    def add_one_step(self, env) -> None:
        e = env.draw(st.integers(0, self.E - 1), label="env")
        td = ring.steps_td([[self.next_uid]], False)[0]
        td["env_id"] = torch.tensor(e)
        index = self.rb.add(td)
        coords = self.model.write([e], [[self.next_uid]])
        self.next_uid += 1
        self.written += 1
        assert torch.as_tensor(index).reshape(-1, 2).tolist() == [list(c) for c in coords]

    @rule(data=st.data())
    def refused_write(self, data) -> None:
        kind = data.draw(st.sampled_from(["repeat", "range", "time", "long"]), label="kind")
        before = self.snapshot()
        if kind == "repeat":
            e = data.draw(st.integers(0, self.E - 1), label="env")
            td = ring.steps_td([[10**6], [10**6 + 1]], False)
            td["env_id"] = torch.tensor([e, e])
            match = "distinct"
        elif kind == "range":
            bad = data.draw(st.sampled_from([-1, self.E, self.E + 3]), label="bad")
            td = ring.steps_td([[10**6]], False)
            td["env_id"] = torch.tensor([bad])
            match = "out of range"
        elif kind == "time":
            if self.E < 2:
                return
            td = ring.steps_td([[10**6, 10**6 + 1]], True)
            td["env_id"] = torch.tensor([[0, 1]])
            match = "changes along time"
        else:
            td = ring.steps_td([list(range(10**6, 10**6 + self.L + 1))], True)
            td["env_id"] = torch.tensor([[0] * (self.L + 1)])
            match = "max_length"
        with pytest.raises(ValueError, match=match):
            self.rb.extend(td)
        assert self.snapshot() == before

    @rule()
    def empty(self) -> None:
        self.rb.empty()
        self.model.clear(list(range(self.E)))
        self.written = 0

    @precondition(lambda self: self.rb.storage.initialized)
    @rule()
    def round_trip_files(self) -> None:
        with tempfile.TemporaryDirectory() as path:
            self.rb.dumps(path)
            fresh = EnvRingReplayBuffer(num_envs=self.E, max_length=self.L)
            fresh.loads(path)
        old, self.rb = self.rb, fresh
        assert self.snapshot() == self.snapshot_of(old)

    @invariant()
    def write_count_and_room(self) -> None:
        assert self.writer._write_count == self.written
        for e in range(self.E):
            free = self.L - self.model.size[e]
            for steps in (1, self.L):
                assert self.writer.has_room(torch.tensor([e]), steps) == (free >= steps)


EnvRingWriterMachine.TestCase.settings = machine_settings()
TestEnvRingWriterMachine = EnvRingWriterMachine.TestCase
