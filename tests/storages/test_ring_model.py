"""EnvRingReplayBuffer against a pure-Python model of ALF's per-env ring (spec B.1, B.6).

A hypothesis state machine drives a small buffer (geometry drawn per run)
through extends of env subsets (``[N]`` and ``[N, T]``), ``dequeue``,
``remove_up_to``, ``clear``, trajectory sampling and ``state_dict`` round
trips, and checks every counter, every stored step and every raw slot
against a model made of plain lists and dicts (no torch in its logic).
Deliberate differences from ALF are modelled as the project fixed them:
Q10 (``remove_up_to`` on an env subset works), Q18 (``gather_all`` on an
empty buffer gives 0 steps), and envs without a valid window are skipped.
A focused property test checks the recent-data split on full rings, where
the state machine rarely reaches it, and plain tests replay ALF's own
vectors (``tests/data/vectors/alf_ring_buffer.json``).
"""
from __future__ import annotations

import json
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from tensordict import TensorDict

from tests._hypothesis import machine_settings
from tests._vectors import vectors_path
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


# --------------------------------------------------------------------------- reference model
class RingModel:
    """ALF's RingBuffer bookkeeping in plain Python: one ring per env.

    A written step is identified by an int ``uid``. ``ring[e][slot]`` is the
    uid last written to that slot (``None`` if never written: the storage
    holds zeros there); ``data[e][position]`` maps stored positions to uids.
    """

    def __init__(self, num_envs: int, max_length: int) -> None:
        self.E, self.L = num_envs, max_length
        self.pos = [0] * num_envs
        self.size = [0] * num_envs
        self.ring = [[None] * max_length for _ in range(num_envs)]
        self.data = [{} for _ in range(num_envs)]

    def earliest(self, e: int) -> int:
        return self.pos[e] - self.size[e]

    def stored_positions(self, e: int) -> list[int]:
        return list(range(self.earliest(e), self.pos[e]))

    def write(self, env_ids: list[int], uids: list[list[int]]) -> list[tuple[int, int]]:
        """Env ``env_ids[i]`` receives the steps ``uids[i]`` in order; returns (env, position) per step."""
        coords = []
        for e, steps in zip(env_ids, uids):
            for uid in steps:
                slot = self.pos[e] % self.L
                self.ring[e][slot] = uid
                self.data[e][self.pos[e]] = uid
                coords.append((e, self.pos[e]))
                self.pos[e] += 1
                self.size[e] = min(self.size[e] + 1, self.L)
        return coords

    def dequeue(self, n: int, env_ids: list[int]) -> list[list[int]] | None:
        """The ``n`` oldest uids of each env, then forgotten; ``None`` if not possible."""
        if n < 1 or any(self.size[e] < n for e in env_ids):
            return None
        out = [[self.data[e][self.earliest(e) + i] for i in range(n)] for e in env_ids]
        for e in env_ids:
            self.size[e] -= n
        return out

    def remove_up_to(self, n: int, env_ids: list[int]) -> None:
        for e in env_ids:
            self.size[e] -= min(n, self.size[e])

    def clear(self, env_ids: list[int]) -> None:
        for e in env_ids:
            self.pos[e] = 0
            self.size[e] = 0
            self.data[e] = {}

    def gather_all(self, ignored: int) -> tuple[list[list[int]], list[int]] | None:
        if len(set(self.pos)) != 1 or len(set(self.size)) != 1:
            return None
        n = max(self.size[0] - ignored, 0)
        start = self.pos[0] - n
        return [[self.data[e][p] for p in range(start, start + n)] for e in range(self.E)], [
            start
        ] * self.E

    # sampling law (B.6, with skipped envs) --------------------------------
    def window_count(self, e: int, length: int, ignored: int) -> int:
        return max(self.size[e] - (length - 1 + ignored), 0)

    def recent_batch(self, batch: int, length: int, ignored: int, steps: int, ratio: float) -> int:
        if ratio <= 0:
            return 0
        average = sum(self.size) / self.E - (length - 1 + ignored)
        return math.ceil(batch * ratio) if average * ratio > steps else 0


def uid_x(uid: int) -> list[float]:
    return [float(uid), uid + 0.5]


def uid_k(uid: int) -> int:
    return -3 * uid


def steps_td(uids: list[list[int]], two_d: bool) -> TensorDict:
    """One row per env: ``[N]`` (one uid each) or ``[N, T]``."""
    x = torch.tensor([[uid_x(u) for u in row] for row in uids], dtype=torch.float32)
    k = torch.tensor([[uid_k(u) for u in row] for row in uids], dtype=torch.int64)
    n = len(uids)
    if two_d:
        return TensorDict({"x": x, "nested": {"k": k}}, [n, x.shape[1]])
    return TensorDict({"x": x[:, 0], "nested": {"k": k[:, 0]}}, [n])


def assert_holds(td: TensorDict, uids: list[list[int]]) -> None:
    """``td`` is ``[R, C]`` and holds exactly the steps ``uids[r][c]``."""
    rows, cols = len(uids), (len(uids[0]) if uids else 0)
    assert tuple(td.batch_size) == (rows, cols)
    expected_x = torch.tensor([[uid_x(u) for u in row] for row in uids], dtype=torch.float32)
    expected_k = torch.tensor([[uid_k(u) for u in row] for row in uids], dtype=torch.int64)
    assert torch.equal(td["x"].reshape(rows, cols, 2), expected_x.reshape(rows, cols, 2))
    assert torch.equal(td["nested", "k"].reshape(rows, cols), expected_k.reshape(rows, cols))


def subsets(num_envs: int, min_size: int = 0):
    return st.lists(st.integers(0, num_envs - 1), min_size=min_size, max_size=num_envs, unique=True)


def check_sample(rb, m, length, ignored, replacement, recent_steps, ratio, batch, seed) -> None:
    """``rb.sample(batch)`` with these TrajectorySampler settings obeys the law of spec B.6.

    Every window is ``length`` consecutive stored steps of one env starting at a
    valid start; the recent part (first ``ceil(B * ratio)`` windows, when
    triggered) starts among the last ``min(count, recent_steps)`` valid starts;
    each part is env-balanced (eligible envs tiled, then distinct extras);
    without replacement the j-th window of an env lies in stratum j of its
    valid starts, rotated by one offset per env when it has enough of them.
    """
    sampler = rb.sampler
    assert isinstance(sampler, TrajectorySampler)
    sampler.batch_length = length
    sampler.num_earliest_frames_ignored = ignored
    sampler.with_replacement = replacement
    sampler.recent_data_steps = recent_steps
    sampler.recent_data_ratio = ratio
    sampler._rng = torch.Generator().manual_seed(seed)

    counts = [m.window_count(e, length, ignored) for e in range(m.E)]
    eligible = [e for e in range(m.E) if counts[e] > 0]
    if sum(m.size) == 0:
        with pytest.raises(RuntimeError, match="empty"):
            rb.sample(batch, return_info=True)
        return
    if not eligible:
        with pytest.raises(ValueError, match="no env holds a window"):
            rb.sample(batch, return_info=True)
        return
    out, info = rb.sample(batch, return_info=True)
    envs, starts = info["env_ids"].tolist(), info["positions"].tolist()
    assert len(envs) == len(starts) == batch
    assert tuple(out.batch_size) == (batch, length)

    # every window: consecutive stored positions of one env, a valid start, the right data
    for e, s in zip(envs, starts):
        assert e in eligible
        assert m.earliest(e) + ignored <= s <= m.pos[e] - length
    assert_holds(out, [[m.data[e][s + t] for t in range(length)] for e, s in zip(envs, starts)])
    env_index, position_index = info["index"]
    assert env_index.tolist() == [[e] * length for e in envs]
    assert position_index.tolist() == [[s + t for t in range(length)] for s in starts]

    recent = m.recent_batch(batch, length, ignored, recent_steps, ratio)
    for lo, hi, cap in ((0, recent, recent_steps), (recent, batch, None)):
        part_envs, part_starts = envs[lo:hi], starts[lo:hi]
        n, k = hi - lo, len(eligible)
        rounds, extra = divmod(n, k)
        # balance: tiled eligible envs, then `extra` distinct envs one more time
        assert part_envs[: rounds * k] == eligible * rounds
        assert len(set(part_envs[rounds * k:])) == extra
        for e in eligible:
            own = [s for env, s in zip(part_envs, part_starts) if env == e]
            assert len(own) in (rounds, rounds + 1)
            valid = counts[e] if cap is None else min(counts[e], cap)
            first = m.pos[e] - length - valid + 1  # earliest allowed start in this part
            assert all(first <= s for s in own)
            if replacement:
                continue
            # without replacement, with at least as many valid starts as windows: the j-th
            # window lies in integer stratum j of the valid starts rotated by one offset per
            # env, so the windows are distinct; with fewer, in ALF's real-valued stratum j.
            windows = len(own)
            if valid >= windows:
                assert len(set(own)) == windows, own
                assert any(all(j * valid // windows <= (s - first - turn) % valid < (j + 1) * valid // windows
                               for j, s in enumerate(own)) for turn in range(valid)), own
                continue
            for j, s in enumerate(own):
                assert j * valid // windows <= s - first < -(-(j + 1) * valid // windows)


# --------------------------------------------------------------------------- state machine
class EnvRingMachine(RuleBasedStateMachine):
    @initialize(num_envs=st.integers(1, 4), max_length=st.integers(1, 6))
    def build(self, num_envs: int, max_length: int) -> None:
        self.E, self.L = num_envs, max_length
        self.rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length)
        self.model = RingModel(num_envs, max_length)
        self.next_uid = 1

    def storage(self):
        return self.rb.storage

    # ------------------------------------------------------------------ writes
    @rule(data=st.data())
    def extend(self, data) -> None:
        # all envs together half of the time, so that gather_all has equal envs to read
        mode = data.draw(st.sampled_from(["env_ids", "entry", "implicit", "implicit"]), label="mode")
        if mode == "implicit":
            env_ids = list(range(self.E))
        else:
            env_ids = data.draw(subsets(self.E, min_size=1), label="env_ids")
        two_d = data.draw(st.booleans(), label="two_d")
        steps = data.draw(st.integers(1, self.L), label="T") if two_d else 1
        uids = []
        for _ in env_ids:
            uids.append(list(range(self.next_uid, self.next_uid + steps)))
            self.next_uid += steps
        td = steps_td(uids, two_d)
        ids = torch.tensor(env_ids, dtype=torch.long)
        if mode == "env_ids":
            index = self.rb.extend(td, env_ids=ids)
        elif mode == "entry":
            td["env_id"] = ids.unsqueeze(1).expand(td.shape) if two_d else ids
            index = self.rb.extend(td)
        else:
            index = self.rb.extend(td)
        coords = self.model.write(env_ids, uids)
        assert index.tolist() == [list(c) for c in coords]

    @rule(data=st.data())
    def dequeue(self, data) -> None:
        env_ids = data.draw(subsets(self.E), label="env_ids")
        n = data.draw(st.integers(1, 2) | st.integers(0, self.L + 1), label="n")
        expected = self.model.dequeue(n, env_ids)
        if expected is None:
            before = self.snapshot()
            with pytest.raises(ValueError, match="n must be an int >= 1|cannot dequeue"):
                self.rb.dequeue(n, env_ids=env_ids)
            assert self.snapshot() == before  # a refused dequeue removes nothing
            return
        out = self.rb.dequeue(n, env_ids=env_ids)
        if env_ids:
            assert_holds(out, expected)
        else:
            assert tuple(out.batch_size) == (0, n)

    @rule(data=st.data())
    def remove_up_to(self, data) -> None:
        env_ids = data.draw(subsets(self.E), label="env_ids")
        n = data.draw(st.integers(0, self.L + 1), label="n")
        self.rb.remove_up_to(n, env_ids=env_ids)
        self.model.remove_up_to(n, env_ids)

    @rule(data=st.data())
    def clear(self, data) -> None:
        if data.draw(st.booleans(), label="all"):
            self.rb.clear()
            self.model.clear(list(range(self.E)))
        else:
            env_ids = data.draw(subsets(self.E), label="env_ids")
            self.rb.clear(env_ids)
            self.model.clear(env_ids)

    @rule()
    def round_trip_state_dict(self) -> None:
        fresh = EnvRingReplayBuffer(num_envs=self.E, max_length=self.L)
        fresh.load_state_dict(self.rb.state_dict())
        old, self.rb = self.rb, fresh
        assert self.snapshot() == self.snapshot_of(old)
        # The copy is independent: writing the old buffer leaves the new one alone.
        if old.storage.initialized:
            before = self.snapshot()
            old.extend(steps_td([[10**6]] * self.E, False))
            assert self.snapshot() == before

    # ------------------------------------------------------------------ sampling
    @rule(data=st.data())
    def sample(self, data) -> None:
        m = self.model
        # mostly short windows, so that some env usually holds one
        length = data.draw(st.integers(1, 2) | st.integers(1, self.L + 1), label="batch_length")
        ignored = data.draw(st.just(0) | st.integers(0, self.L), label="nefi")
        replacement = data.draw(st.booleans(), label="with_replacement")
        recent_steps = data.draw(st.integers(1, 2) | st.integers(1, self.L), label="recent_data_steps")
        ratio = data.draw(st.sampled_from([0.0, 0.5, 0.8, 1.0]), label="ratio")
        batch = data.draw(st.integers(1, 12), label="B")
        seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
        check_sample(self.rb, m, length, ignored, replacement, recent_steps, ratio, batch, seed)

    @rule(batch=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
    def rand_given_ndim(self, batch: int, seed: int) -> None:
        storage = self.storage()
        storage._rng = torch.Generator().manual_seed(seed)
        if sum(self.model.size) == 0:
            with pytest.raises(RuntimeError, match="empty"):
                storage._rand_given_ndim(batch)
            return
        env, position = storage._rand_given_ndim(batch)
        for e, p in zip(env.tolist(), position.tolist()):
            assert p in self.model.stored_positions(e)

    # ------------------------------------------------------------------ invariants
    def snapshot_of(self, rb) -> tuple:
        storage = rb.storage
        raw = None
        if storage.initialized:
            raw = (storage._rings.data["x"].tolist(), storage._rings.data["nested", "k"].tolist())
        return storage.current_pos.tolist(), storage.current_size.tolist(), raw

    def snapshot(self) -> tuple:
        return self.snapshot_of(self.rb)

    @invariant()
    def counters_match(self) -> None:
        storage = self.storage()
        assert storage.current_pos.tolist() == self.model.pos
        assert storage.current_size.tolist() == self.model.size
        assert storage.current_pos.dtype == storage.current_size.dtype == torch.int64
        assert len(self.rb) == len(storage) == sum(self.model.size)
        earliest = [self.model.earliest(e) for e in range(self.E)]
        assert storage.earliest_position().tolist() == earliest

    @invariant()
    def raw_slots_match(self) -> None:
        storage = self.storage()
        if not storage.initialized:
            assert all(uid is None for ring in self.model.ring for uid in ring)
            return
        x = [[uid_x(u) if u is not None else [0.0, 0.0] for u in ring] for ring in self.model.ring]
        k = [[uid_k(u) if u is not None else 0 for u in ring] for ring in self.model.ring]
        assert storage._rings.data["x"].tolist() == x
        assert storage._rings.data["nested", "k"].tolist() == k

    @invariant()
    def stored_steps_read_back(self) -> None:
        m, rb, storage = self.model, self.rb, self.storage()
        for e in range(self.E):
            positions = m.stored_positions(e)
            if positions:
                out = rb.read(torch.full((len(positions),), e), torch.tensor(positions))
                assert_holds(out.unsqueeze(0), [[m.data[e][p] for p in positions]])
            for p in positions:
                assert storage.contains((e, p))
            for bad in (m.pos[e], m.earliest(e) - 1, m.pos[e] + self.L, m.earliest(e) - self.L):
                assert not storage.contains((e, bad))
                with pytest.raises(ValueError, match="is not stored"):
                    rb.read(torch.tensor([e]), torch.tensor([bad]))

    @invariant()
    def gather_all_matches(self) -> None:
        for ignored in sorted({0, 1, self.L}):
            expected = self.model.gather_all(ignored)
            if expected is None:
                with pytest.raises(ValueError, match="same position"):
                    self.rb.gather_all(ignored)
                continue
            uids, starts = expected
            td, positions = self.rb.gather_all(ignored)
            assert positions.tolist() == starts
            n = len(uids[0])
            assert tuple(td.batch_size) == (self.E, n)
            if n:
                assert_holds(td, uids)


EnvRingMachine.TestCase.settings = machine_settings(max_examples=40)
TestEnvRingMachine = EnvRingMachine.TestCase


# --------------------------------------------------------------------------- recent split
@settings(max_examples=100, deadline=None)
@given(
    num_envs=st.integers(1, 4),
    max_length=st.integers(2, 8),
    extra=st.integers(0, 8),
    trims=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    length=st.integers(1, 3),
    ignored=st.integers(0, 2),
    replacement=st.booleans(),
    recent_steps=st.integers(1, 8),
    ratio=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    batch=st.integers(1, 12),
)
def test_recent_split_on_full_rings(
    num_envs, max_length, extra, trims, length, ignored, replacement, recent_steps, ratio, batch
):
    """Mostly-full rings, where the recent share is triggered (or sits at its threshold) often."""
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length)
    m = RingModel(num_envs, max_length)
    uid = 1
    for _ in range(max_length + extra):
        uids = [[uid + e] for e in range(num_envs)]
        uid += num_envs
        rb.extend(steps_td(uids, False))
        m.write(list(range(num_envs)), uids)
    for e in range(num_envs):
        rb.remove_up_to(trims[e], env_ids=[e])
        m.remove_up_to(trims[e], [e])
    for seed in range(6):
        check_sample(rb, m, length, ignored, replacement, recent_steps, ratio, batch, seed)


def test_strata_distinct_when_enough_valid_starts():
    rb = EnvRingReplayBuffer(
        num_envs=1, max_length=4, sampler=TrajectorySampler(batch_length=1)
    )
    rb.extend(steps_td([[1, 2, 3, 4]], True), env_ids=torch.tensor([0]))
    rb.sampler._rng = torch.Generator().manual_seed(0)
    # 4 valid starts, 3 windows: real-valued strata (ALF's) collide with p = 1/4 per draw;
    # integer strata never do.
    for _ in range(50):
        starts = rb.sample(3, return_info=True)[1]["positions"].tolist()
        assert len(set(starts)) == 3, starts


# --------------------------------------------------------------------------- ALF's vectors
def _alf_vectors() -> dict:
    return json.loads(vectors_path("alf_ring_buffer.json").read_text())


def _ids(text: str) -> list[int]:
    return [int(i) for i in re.search(r"env_ids=\[([^\]]*)\]", text).group(1).split(",")]


def test_ring_ops_match_alf_slot_by_slot():
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    for step in _alf_vectors()["ring_ops"]:
        op = step["op"]
        env_ids = _ids(op)
        if op.startswith("enqueue"):
            k = int(re.search(r"x=100\*e\+(\d+)", op).group(1))
            x = torch.tensor([100.0 * e + k for e in env_ids])
            rb.extend(TensorDict({"x": x}, [len(env_ids)]), env_ids=torch.tensor(env_ids))
        elif op.startswith("dequeue"):
            n = int(re.search(r"n=(\d+)", op).group(1))
            out = rb.dequeue(n, env_ids=env_ids)
            assert out["x"].tolist() == step["result_x"], op
        elif op.startswith("clear"):
            rb.clear(env_ids)
        else:
            raise AssertionError(f"unknown op in the vectors: {op}")
        assert rb.storage.current_pos.tolist() == step["current_pos"], op
        assert rb.storage.current_size.tolist() == step["current_size"], op
        assert rb.storage._rings.data["x"].reshape(3, 4).tolist() == step["x"], op


def _filled_for_gather_all() -> EnvRingReplayBuffer:
    rb = EnvRingReplayBuffer(num_envs=2, max_length=5)
    for k in range(7):
        rb.extend(TensorDict({"x": torch.tensor([1000.0 * e + k for e in range(2)])}, [2]))
    return rb


@pytest.mark.parametrize(
    "ignored, x_key, pos_key",
    [(0, "x", "positions"), (2, "x_ignore_earliest", "positions_ignore_earliest")],
)
def test_gather_all_matches_alf(ignored, x_key, pos_key):
    expected = _alf_vectors()["gather_all"]
    td, positions = _filled_for_gather_all().gather_all(ignored)
    assert td["x"].tolist() == expected[x_key]
    assert positions.tolist() == expected[pos_key]


def test_dequeue_no_env_before_any_write():
    """An empty env subset dequeues nothing, before any write as after one."""
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    assert tuple(rb.dequeue(1, env_ids=[]).batch_size) == (0, 1)
    assert rb.storage.current_size.tolist() == [0, 0]


def test_gather_all_after_clear_is_empty_not_stale():
    """ALF returns ``L`` stale steps here (Q18); the port returns none."""
    rb = _filled_for_gather_all()
    rb.clear()
    td, positions = rb.gather_all()
    assert tuple(td.batch_size) == (2, 0) and td["x"].shape == (2, 0)
    assert positions.tolist() == [0, 0]
