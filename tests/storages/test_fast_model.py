"""FastTensorStorage (1-D and ``ndim=2``) in torchrl_ext's TensorDictReplayBuffer against a ring model.

A hypothesis state machine writes batches of random sizes (wrapping around
the ring), reads stored rows by index, samples, empties the buffer and
round-trips it through ``state_dict`` and ``dumps``/``loads`` at random
points. The model is the documented round-robin contract: item ``k`` (counted
since the last ``empty()``) lands in row ``k % capacity``, so the storage holds
the last ``capacity`` items in ring order and ``len`` is ``min(k, capacity)``.
With ``ndim=2`` an ``[N, T]`` batch is ``T`` rows of ``N`` envs (time-major).
"""
from __future__ import annotations


import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from tests._hypothesis import FileRoundTrip, machine_settings
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastTensorStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


class RoundRobinModel:
    """Rows of a round-robin ring in plain Python; a row is a list of uids (one per env)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: list[list[int] | None] = [None] * capacity
        self.written = 0  # rows written since the last empty()

    def write(self, rows: list[list[int]]) -> list[int]:
        """Appends ``rows``; returns the ring row each went to."""
        out = []
        for row in rows:
            r = self.written % self.capacity
            self.rows[r] = row
            out.append(r)
            self.written += 1
        return out

    def filled(self) -> int:
        return min(self.written, self.capacity)

    def empty(self) -> None:
        # The storage keeps the old bytes; only the count restarts.
        self.written = 0


def uid_value(uid: int) -> list[float]:
    return [float(uid), -0.25 * uid]


def batch_of(rows: list[list[int]], two_d: bool) -> TensorDict:
    """``[T]`` items (1-D) or an ``[N, T]`` collector batch (``ndim=2``) holding ``rows[t][n]``."""
    x = torch.tensor([[uid_value(u) for u in row] for row in rows], dtype=torch.float32)  # [T, N, 2]
    k = torch.tensor(rows, dtype=torch.int64)  # [T, N]
    if not two_d:
        return TensorDict({"x": x[:, 0], "nested": {"k": k[:, 0]}}, [len(rows)])
    x, k = x.transpose(0, 1), k.transpose(0, 1)
    return TensorDict({"x": x.contiguous(), "nested": {"k": k.contiguous()}}, list(k.shape))


class FastStorageMachine(FileRoundTrip, RuleBasedStateMachine):
    """Random extends / reads / samples / empties / checkpoints of a small FastTensorStorage buffer."""

    @initialize(
        two_d=st.booleans(),
        rows=st.integers(1, 7),
        envs=st.integers(1, 3),
        seed=st.integers(0, 2**16),
        strict=st.booleans(),
    )
    def build(self, two_d: bool, rows: int, envs: int, seed: int, strict: bool = False) -> None:
        self.two_d = two_d
        self.strict = strict
        self.envs = envs if two_d else 1
        self.capacity = rows
        self.seed = seed
        self.rb = self._new_buffer()
        self.model = RoundRobinModel(rows)
        self.next_uid = 1

    def _new_buffer(self) -> TensorDictReplayBuffer:
        if self.two_d:
            storage = FastTensorStorage(self.capacity * self.envs, ndim=2, strict=self.strict)
        else:
            storage = FastTensorStorage(self.capacity, strict=self.strict)
        return TensorDictReplayBuffer(
            storage=storage, batch_size=3, generator=torch.Generator().manual_seed(self.seed)
        )

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def extend(self, data) -> None:
        n = data.draw(st.integers(1, self.capacity), label="rows")
        rows = [list(range(self.next_uid + t * self.envs, self.next_uid + (t + 1) * self.envs))
                for t in range(n)]
        self.next_uid += n * self.envs
        index = self.rb.extend(batch_of(rows, self.two_d))
        expected = self.model.write(rows)
        if self.two_d:
            assert index.tolist() == [[r, e] for r in expected for e in range(self.envs)]
        else:
            assert index.tolist() == expected

    @precondition(lambda self: not self.two_d)
    @rule(extra=st.integers(1, 3))
    def too_large_extend(self, extra: int) -> None:
        """Refused when strict; else written as TorchRL does: the last rows win the ring."""
        n = self.capacity + extra
        rows = [[self.next_uid + i] for i in range(n)]
        before = self.snapshot()
        if self.strict:
            with pytest.raises(ValueError, match="capacity"):
                self.rb.extend(batch_of(rows, False))
            assert self.snapshot() == before
            return
        self.next_uid += n
        index = self.rb.extend(batch_of(rows, False))
        assert index.tolist() == self.model.write(rows)

    @rule()
    def empty(self) -> None:
        self.rb.empty()
        self.model.empty()

    @rule(data=st.data())
    def read_by_index(self, data) -> None:
        filled = self.model.filled()
        if filled == 0:
            return
        rows = data.draw(st.lists(st.integers(0, filled - 1), min_size=1, max_size=6), label="rows")
        storage = self.rb.storage
        if self.two_d:
            envs = data.draw(st.lists(st.integers(0, self.envs - 1), min_size=len(rows),
                                      max_size=len(rows)), label="envs")
            out = storage.get((torch.tensor(rows), torch.tensor(envs)))
            uids = [self.model.rows[r][e] for r, e in zip(rows, envs)]
        else:
            out = storage.get(torch.tensor(rows))
            uids = [self.model.rows[r][0] for r in rows]
        assert out["nested", "k"].tolist() == uids
        assert out["x"].tolist() == [uid_value(u) for u in uids]

    @rule(batch=st.integers(1, 6))
    def sample(self, batch: int) -> None:
        if self.model.filled() == 0:
            with pytest.raises(RuntimeError):
                self.rb.sample(batch)
            return
        out = self.rb.sample(batch)
        index = out["index"]
        if self.two_d:
            uids = [self.model.rows[r][e] for r, e in index.tolist()]
        else:
            uids = [self.model.rows[r][0] for r in index.tolist()]
        assert all(r < self.model.filled() for r in (index[:, 0] if self.two_d else index).tolist())
        assert out["nested", "k"].tolist() == uids
        assert out["x"].tolist() == [uid_value(u) for u in uids]

    # ------------------------------------------------------------------ invariants
    def _check_restored(self, old: TensorDictReplayBuffer) -> None:
        assert self.snapshot() == self.snapshot_of(old)

    def snapshot_of(self, rb: TensorDictReplayBuffer) -> tuple:
        storage = rb.storage
        filled = len(storage) // self.envs
        if not storage.initialized or filled == 0:
            return len(rb), None
        stored = storage._storage[:filled]
        return len(rb), stored["nested", "k"].tolist(), stored["x"].tolist()

    def snapshot(self) -> tuple:
        return self.snapshot_of(self.rb)

    @invariant()
    def stored_rows_match_the_model(self) -> None:
        filled = self.model.filled()
        assert len(self.rb) == len(self.rb.storage) == filled * self.envs
        if filled == 0:
            return
        stored = self.rb.storage._storage
        k = stored["nested", "k"][:filled].reshape(filled, self.envs).tolist()
        assert k == [self.model.rows[r] for r in range(filled)]
        x = stored["x"][:filled].reshape(filled, self.envs, 2).tolist()
        assert x == [[uid_value(u) for u in self.model.rows[r]] for r in range(filled)]

    @invariant()
    def last_capacity_items_in_ring_order(self) -> None:
        """The stored rows, read oldest first from the write cursor, are the newest ``filled`` rows."""
        filled, written = self.model.filled(), self.model.written
        if filled == 0:
            return
        stored = self.rb.storage._storage["nested", "k"].reshape(self.capacity, self.envs)
        start = written % self.capacity if written >= self.capacity else 0
        order = [(start + i) % self.capacity for i in range(filled)]
        uids = [row for r in order for row in [stored[r].tolist()]]
        flat = [u for row in uids for u in row]
        assert flat == sorted(flat)  # uids grow with time
        newest = self.next_uid - 1
        assert flat[-1] == newest


FastStorageMachine.TestCase.settings = machine_settings()
TestFastStorageMachine = FastStorageMachine.TestCase
