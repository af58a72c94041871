"""PrioritizedSampler in a prioritized buffer against a plain-Python priority model.

A hypothesis state machine extends a small ``FastTensorStorage`` buffer
(wrapping around), updates priorities (by index, with repeats, and through
``update_tensordict_priority`` on a sample), samples, empties and round-trips
``state_dict``. The model keeps the raw priority of every stored row and the
documented rules: new items get the largest raw priority seen (or the largest one
still stored, with ``max_priority_within_buffer``), ``initial_priority`` before one, a
leaf is ``(priority + eps) ** alpha``, the last write of a repeated index
wins, sampling draws non-zero leaves of stored rows, and the PER weight is
``(N P_i) ** -beta / max_j (N P_j) ** -beta`` (ALF: ``q_i * nnz / sum q``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from tests._hypothesis import StateDictRoundTrip, machine_settings
from torchrl_ext.replay_buffers import PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import PrioritizedSampler
from torchrl_ext.storages import FastTensorStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

PRIORITIES = st.one_of(st.just(0.0), st.sampled_from([0.5, 1.0, 2.0, 7.5]),
                       st.floats(0.0, 20.0, allow_nan=False, width=32))


class PriorityModel:
    """Raw priority per ring row (``None`` = never written) and the max ever seen."""

    def __init__(self, capacity: int, alpha: float, eps: float, initial: float, within: bool) -> None:
        self.capacity, self.alpha, self.eps, self.initial, self.within = capacity, alpha, eps, initial, within
        self.priority: list[float | None] = [None] * capacity
        self.written = 0
        self.max_seen = -math.inf

    def filled(self) -> int:
        return min(self.written, self.capacity)

    def leaf(self, row: int) -> float:
        """``(p + eps) ** alpha`` as the float32 tree holds it: a value below float32's
        range (a tiny priority raised to alpha > 1) is stored as 0, never sampled."""
        p = self.priority[row]
        return 0.0 if p is None else float(np.float32((p + self.eps) ** self.alpha))

    def default(self) -> float:
        """Raw priority for new items, computed before they are written.

        With ``max_priority_within_buffer`` the items a write is about to
        overwrite still count (what the sampler does today; see the issue-12
        report: "still in the buffer" could be read either way).
        """
        if self.within and self.alpha > 0:
            stored = [p for p in self.priority[: self.filled()] if p is not None]
            top = max(stored) if stored and max(self.leaf(r) for r in range(self.filled())) > 0 else -math.inf
            return self.initial if top == -math.inf else top
        return self.initial if self.max_seen == -math.inf else self.max_seen

    def set(self, rows: list[int], priorities: list[float]) -> None:
        for r, p in zip(rows, priorities):
            self.priority[r] = p
        if priorities:
            self.max_seen = max(self.max_seen, max(priorities))

    def extend(self, n: int) -> list[int]:
        rows = [(self.written + i) % self.capacity for i in range(n)]
        default = self.default()  # computed before the new items are written
        self.written += n
        self.set(rows, [default] * n)
        return rows

    def empty(self) -> None:
        self.priority = [None] * self.capacity
        self.written = 0
        self.max_seen = -math.inf


class PrioritizedMachine(StateDictRoundTrip, RuleBasedStateMachine):
    @initialize(
        capacity=st.integers(1, 40),
        alpha=st.sampled_from([0.0, 0.6, 1.0, 1.5]),
        beta=st.sampled_from([0.0, 0.4, 1.0]),
        eps=st.sampled_from([0.0, 1e-3, 0.5]),
        initial=st.sampled_from([0.0, 1.0, 3.0]),
        within=st.booleans(),
        weights=st.sampled_from(["per", "alf"]),
        build=st.sampled_from(["buffer", "buffer_stratified", "fanout2", "fanout4"]),
        seed=st.integers(0, 2**16),
    )
    def build(self, capacity, alpha, beta, eps, initial, within, weights, build, seed) -> None:
        self.args = dict(capacity=capacity, alpha=alpha, beta=beta, eps=eps, initial=initial,
                         within=within, weights=weights, build=build, seed=seed)
        self.rb = self._new_buffer()
        self.model = PriorityModel(capacity, alpha, eps, initial, within)
        self.uid = 1

    def _new_buffer(self):
        a = self.args
        common = dict(eps=a["eps"], initial_priority=a["initial"],
                      max_priority_within_buffer=a["within"], weights=a["weights"])
        generator = torch.Generator().manual_seed(a["seed"])
        if a["build"].startswith("buffer"):
            rb = PrioritizedReplayBuffer(alpha=a["alpha"], beta=a["beta"],
                                         storage=FastTensorStorage(a["capacity"]), batch_size=4,
                                         replacement=a["build"] == "buffer", generator=generator, **common)
        else:
            fanout = int(a["build"][-1])
            sampler = PrioritizedSampler(a["capacity"], a["alpha"], a["beta"], fanout=fanout, **common)
            rb = TensorDictReplayBuffer(storage=FastTensorStorage(a["capacity"]), sampler=sampler,
                                        batch_size=4, priority_key="td_error", generator=generator)
        return rb

    @property
    def sampler(self) -> PrioritizedSampler:
        return self.rb.sampler

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def extend(self, data) -> None:
        n = data.draw(st.integers(1, self.model.capacity), label="n")
        td = TensorDict({"uid": torch.arange(self.uid, self.uid + n)}, [n])
        self.uid += n
        index = self.rb.extend(td)
        assert index.tolist() == self.model.extend(n)

    @precondition(lambda self: self.model.filled() > 0)
    @rule(data=st.data())
    def update_priority(self, data) -> None:
        k = data.draw(st.integers(1, 6), label="k")
        rows = data.draw(st.lists(st.integers(0, self.model.filled() - 1), min_size=k, max_size=k),
                         label="rows")
        priorities = data.draw(st.lists(PRIORITIES, min_size=k, max_size=k), label="priorities")
        self.rb.update_priority(torch.tensor(rows), torch.tensor(priorities))
        self.model.set(rows, [float(torch.tensor(p, dtype=torch.float32)) for p in priorities])

    @rule(data=st.data())
    def sample(self, data) -> None:
        m = self.model
        leaves = [m.leaf(r) for r in range(m.filled())]
        batch = data.draw(st.integers(1, 8), label="batch")
        if m.filled() == 0:
            with pytest.raises(RuntimeError, match="empty"):
                self.rb.sample(batch)
            return
        if sum(leaves) == 0:
            with pytest.raises(RuntimeError, match="zero"):
                self.rb.sample(batch)
            return
        out = self.rb.sample(batch)
        rows = out["index"].tolist()
        assert out["uid"].tolist() == [self._uid_at(r) for r in rows]
        for r in rows:
            assert r < m.filled() and leaves[r] > 0
        expected = [self._weight(r, leaves) for r in rows]
        torch.testing.assert_close(out["priority_weight"].double(),
                                   torch.tensor(expected, dtype=torch.float64), rtol=2e-4, atol=1e-6)
        if data.draw(st.booleans(), label="write_back"):
            td_error = data.draw(st.lists(PRIORITIES, min_size=batch, max_size=batch), label="td_error")
            out["td_error"] = torch.tensor(td_error, dtype=torch.float32)
            self.rb.update_tensordict_priority(out)
            self.model.set(rows, [float(torch.tensor(p, dtype=torch.float32)) for p in td_error])

    def _weight(self, row: int, leaves: list[float]) -> float:
        """The importance weight of ``row`` from the model alone."""
        if self.args["weights"] == "alf":
            nnz = sum(1 for q in leaves if q > 0)
            return leaves[row] * nnz / sum(leaves)
        total = sum(leaves)
        n = len(leaves)
        weight = [(n * q / total) ** -self.args["beta"] for q in leaves if q > 0]
        return (n * leaves[row] / total) ** -self.args["beta"] / max(weight)

    def _uid_at(self, row: int) -> int:
        m = self.model
        # uid of the newest item written to ``row``: items are numbered from 1 since creation
        newest = self.uid - 1
        last_row = (m.written - 1) % m.capacity
        return newest - ((last_row - row) % m.capacity)

    @rule()
    def empty(self) -> None:
        self.rb.empty()
        self.model.empty()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def tree_matches_the_model(self) -> None:
        m, tree = self.model, self.sampler.tree
        assert len(self.rb) == m.filled()
        expected = torch.tensor([m.leaf(r) for r in range(m.capacity)], dtype=torch.float64)
        torch.testing.assert_close(tree.leaves[: m.capacity].double(), expected, rtol=1e-5, atol=1e-7)
        total = float(tree.summary())  # the root sum the sampler draws against
        assert total == pytest.approx(float(expected.sum()), rel=1e-4, abs=1e-6)
        stored_nonzero = [q for q in expected.tolist() if q > 0]
        if stored_nonzero:
            assert tree.min_nonzero() == pytest.approx(min(stored_nonzero), rel=1e-5)

    @invariant()
    def default_priority_matches(self) -> None:
        assert self.sampler.default_priority == pytest.approx(self.model.default(), rel=1e-4, abs=1e-5)


PrioritizedMachine.TestCase.settings = machine_settings()
TestPrioritizedMachine = PrioritizedMachine.TestCase
