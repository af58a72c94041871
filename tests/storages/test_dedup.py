"""DedupEnvRingStorage: reads equal a plain ring holding the full stream; memory; bad input."""
from __future__ import annotations

import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage, EnvRingStorage, EpisodicEnvRingStorage


class Streams:
    """Per-env episodes of unique frames, stacked the way gymnasium's FrameStackObservation does."""

    def __init__(self, num_envs, num_stack, stack_dim, padding, rng, frame_shape=(2, 2)):
        self.S, self.dim, self.padding, self.rng = num_stack, stack_dim, padding, rng
        self.frame_shape, self.counter = frame_shape, 0
        self.window = [self._reset() for _ in range(num_envs)]

    def _frame(self):
        self.counter += 1
        return torch.full(self.frame_shape, float(self.counter))

    def _reset(self):
        first = self._frame()
        pad = first if self.padding == "reset" else torch.zeros(self.frame_shape)
        return [pad] * (self.S - 1) + [first]

    def _stack(self, frames):
        return torch.stack(frames, self.dim % (len(self.frame_shape) + 1))

    def step(self, e, p_done=0.15):
        obs = self._stack(self.window[e])
        nxt = self.window[e][1:] + [self._frame()]
        done = self.rng.random() < p_done
        step = (obs, self._stack(nxt), done, float(self.counter))
        self.window[e] = self._reset() if done else nxt
        return step

    def restart(self, e):
        self.window[e] = self._reset()


def to_td(env_ids, rows, blocks):
    """rows[i] = list of steps of env_ids[i]; [N] if not blocks else [N, T]."""
    def field(k):
        vals = [[torch.as_tensor(s[k]) for s in row] for row in rows]
        out = torch.stack([torch.stack(v) for v in vals])
        return out if blocks else out[:, 0]
    td = TensorDict({"observation": field(0), "reward": field(3),
                     "next": {"observation": field(1), "done": field(2).unsqueeze(-1)}},
                    batch_size=[len(rows), len(rows[0])] if blocks else [len(rows)])
    return td, torch.tensor(env_ids)


def assert_same_reads(plain, dedup, num_stack):
    storage = dedup.storage
    envs, positions = [], []
    for e in range(storage.num_envs):
        first = int(storage.earliest_position()[e]) + num_stack - 1
        for p in range(first, int(storage.current_pos[e])):
            envs.append(e)
            positions.append(p)
    if not envs:
        return
    index = (torch.tensor(envs), torch.tensor(positions))
    want, got = plain.storage.get(index), storage.get(index)
    assert set(want.keys(True, True)) == set(got.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(want[key], got[key]), (key, envs, positions)


CONFIGS = [(1, 0, "reset"), (4, 0, "reset"), (3, -1, "zero"), (2, 1, "reset")]


@pytest.mark.parametrize("num_stack, stack_dim, padding", CONFIGS)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), num_envs=st.integers(1, 3), max_length=st.integers(4, 9))
def test_reads_equal_the_full_stream(num_stack, stack_dim, padding, seed, num_envs, max_length):
    rng = random.Random(seed)
    streams = Streams(num_envs, num_stack, stack_dim, padding, rng)
    plain = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length)
    dedup = EnvRingReplayBuffer(storage=DedupEnvRingStorage(
        num_envs, max_length, num_stack=num_stack, stack_dim=stack_dim, padding=padding))
    for _ in range(30):
        u = rng.random()
        envs = rng.sample(range(num_envs), rng.randint(1, num_envs))  # any order
        if u < 0.55:
            td, ids = to_td(envs, [[streams.step(e)] for e in envs], blocks=False)
        elif u < 0.8:
            length = rng.randint(2, max_length)
            td, ids = to_td(envs, [[streams.step(e) for _ in range(length)] for e in envs], blocks=True)
        elif u < 0.9:
            e = rng.randrange(num_envs)
            plain.clear(env_ids=[e])
            dedup.clear(env_ids=[e])
            streams.restart(e)  # a cleared env starts a new episode
            continue
        else:
            e = rng.randrange(num_envs)
            n = int(plain.storage.current_size[e])
            if n:
                k = rng.randint(1, n)
                try:
                    got = dedup.dequeue(k, env_ids=[e])
                except ValueError as error:  # stacks of the oldest steps already overwritten
                    assert "overwritten frames" in str(error)
                    assert int(dedup.storage.current_size[e]) == n  # nothing removed
                    continue
                want = plain.dequeue(k, env_ids=[e])
                for key in want.keys(True, True):
                    assert torch.equal(want[key], got[key]), key
            continue
        plain.extend(td, env_ids=ids)
        dedup.extend(td, env_ids=ids)
        assert_same_reads(plain, dedup, num_stack)


def test_sampled_windows_equal_the_plain_storage_and_skip_overwritten_frames():
    rng = random.Random(0)
    streams = Streams(2, 4, 0, "reset", rng)
    dedup = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 12, num_stack=4),
                                sampler=TrajectorySampler(2))
    plain = EnvRingReplayBuffer(num_envs=2, max_length=12)
    for _ in range(40):
        td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
        dedup.extend(td, env_ids=ids)
        plain.extend(td, env_ids=ids)
    batch = dedup.sample(64)
    earliest = dedup.storage.earliest_position()[batch["env_ids"][:, 0]]
    assert bool((batch["positions"][:, 0] >= earliest + 3).all())  # stacks fully stored
    env, pos = batch["index"][..., 0], batch["index"][..., 1]
    want = plain.storage.get((env, pos))
    for key in want.keys(True, True):
        assert torch.equal(batch[key], want[key]), key


def test_a_step_whose_stack_was_overwritten_cannot_be_read():
    rng = random.Random(1)
    streams = Streams(1, 4, 0, "reset", rng)
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 5, num_stack=4))
    for _ in range(9):
        td, ids = to_td([0], [[streams.step(0, p_done=0.0)]], blocks=False)
        rb.extend(td, env_ids=ids)
    # Positions 4..8 stored; the episode began at 0, so the stack of 5 needs frame 2 (gone).
    with pytest.raises(ValueError, match="reaches back to overwritten frames cannot be read"):
        rb.storage.get((torch.tensor([0]), torch.tensor([5])))
    assert rb.storage.get((torch.tensor([0]), torch.tensor([7])))["observation"].shape == (1, 4, 2, 2)


def test_bytes_per_transition_for_4_stacked_84x84_frames():
    rng = random.Random(2)
    num_envs, max_length = 2, 2000
    streams = Streams(num_envs, 4, 0, "reset", rng, frame_shape=(84, 84))
    storage = DedupEnvRingStorage(num_envs, max_length, num_stack=4)
    rb = EnvRingReplayBuffer(storage=storage)
    for _ in range(max_length + 500):  # wraps; episodes of about 100 steps
        rows = [[streams.step(e, p_done=0.01)] for e in range(num_envs)]
        td, ids = to_td(list(range(num_envs)), rows, blocks=False)
        td["observation"] = td["observation"].to(torch.uint8)
        td["next", "observation"] = td["next", "observation"].to(torch.uint8)
        rb.extend(td, env_ids=ids)
    tensors = [leaf for _, leaf in storage.flat_leaves] + [
        storage._is_first, storage._indexed, storage._headless, storage._disc0, storage._returns,
        storage._terminal_row, storage._last_done, storage._pending_next, storage._terminal,
        storage.positions, storage.sizes, storage.resets,
    ]
    per_transition = sum(t.numel() * t.element_size() for t in tensors) / (num_envs * max_length)
    assert per_transition <= 1.1 * 84 * 84, per_transition
    # A plain ring stores obs and next obs in full: 8 frames per transition.
    assert 8 * 84 * 84 / per_transition > 7


def test_next_observation_that_breaks_the_stream_is_refused():
    rng = random.Random(3)
    streams = Streams(1, 2, 0, "reset", rng)
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 6, num_stack=2))
    td, ids = to_td([0], [[streams.step(0, p_done=0.0)]], blocks=False)
    rb.extend(td, env_ids=ids)
    td, ids = to_td([0], [[streams.step(0, p_done=0.0)]], blocks=False)
    td["observation"][0, -1] += 1000  # not the previous step's next frame
    before = rb.storage.state_dict()
    with pytest.raises(ValueError, match=r"\('next', 'observation'\) of a step differs from 'observation'"):
        rb.extend(td, env_ids=ids)
    after = rb.storage.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(before["data"]["leaves"], after["data"]["leaves"]))
    assert rb.storage.current_pos.tolist() == [1]


def test_bad_arguments_and_shapes():
    with pytest.raises(ValueError, match="num_stack must be an int >= 1"):
        DedupEnvRingStorage(1, 4, num_stack=0)
    with pytest.raises(ValueError, match="padding must be 'reset' or 'zero'"):
        DedupEnvRingStorage(1, 4, padding="edge")
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 4, num_stack=4))
    td = TensorDict({"observation": torch.zeros(1, 3, 2, 2),
                     "next": {"observation": torch.zeros(1, 3, 2, 2), "done": torch.zeros(1, 1, dtype=torch.bool)}}, [1])
    with pytest.raises(ValueError, match="has 3 frames along stack_dim=0, expected num_stack=4"):
        rb.extend(td)
    good_shape = TensorDict({"observation": torch.zeros(1, 4, 2, 2),
                             "next": {"observation": torch.zeros(1, 4, 2, 2)}}, [1])
    with pytest.raises(ValueError, match=r"needs \('next', 'done'\) in every written batch"):
        rb.extend(good_shape)
    assert len(rb) == 0


@pytest.mark.parametrize("check_next", [True, False])
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda nxt: nxt.to(torch.float64), r"has shape \[2, 2, 2, 2\] and dtype torch.float64, but 'observation' has shape \[2, 2, 2, 2\] and dtype torch.float32"),
        (lambda nxt: nxt[..., :1], r"has shape \[2, 2, 2, 1\] and dtype torch.float32, but 'observation' has shape \[2, 2, 2, 2\]"),
    ],
    ids=["dtype", "shape"],
)
def test_a_next_observation_unlike_the_observation_is_refused_before_any_write(check_next, change, match):
    """The next frame is kept in place of the following observation, so it must look the same."""
    rng = random.Random(5)
    streams = Streams(2, 2, 0, "reset", rng)
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 6, num_stack=2, check_next=check_next))
    for _ in range(3):
        td, ids = to_td([0, 1], [[streams.step(0, p_done=0.0)], [streams.step(1, p_done=0.0)]], blocks=False)
        rb.extend(td, env_ids=ids)
    td, ids = to_td([0, 1], [[streams.step(0, p_done=0.0)], [streams.step(1, p_done=0.0)]], blocks=False)
    td["next", "observation"] = change(td["next", "observation"])
    before = rb.storage.state_dict()
    with pytest.raises(ValueError, match=r"\('next', 'observation'\) " + match):
        rb.extend(td, env_ids=ids)
    after = rb.storage.state_dict()
    assert len(before["data"]["leaves"]) == len(after["data"]["leaves"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(before["data"]["leaves"], after["data"]["leaves"]))
    assert all(torch.equal(a, b) for a, b in zip(before["episodes"], after["episodes"]))
    assert all(torch.equal(a, b) for a, b in zip(before["dedup"]["bookkeeping"], after["dedup"]["bookkeeping"]))
    assert all(torch.equal(a, b) for a, b in zip(before["dedup"]["tables"], after["dedup"]["tables"]))
    assert rb.storage.current_pos.tolist() == [3, 3]


def test_checkpoint_round_trip(tmp_path):
    rng = random.Random(4)
    streams = Streams(2, 3, 0, "reset", rng)
    storage = DedupEnvRingStorage(2, 6, num_stack=3)
    rb = EnvRingReplayBuffer(storage=storage)
    for _ in range(15):
        td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
        rb.extend(td, env_ids=ids)
    rb.dumps(tmp_path / "rb")
    fresh = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 6, num_stack=3))
    fresh.loads(tmp_path / "rb")
    index = (torch.tensor([0, 0, 1, 1]), torch.tensor([11, 14, 12, 14]))
    want, got = storage.get(index), fresh.storage.get(index)
    for key in want.keys(True, True):
        assert torch.equal(want[key], got[key]), key
    # Writing continues identically.
    td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
    rb.extend(td, env_ids=ids)
    fresh.extend(td, env_ids=ids)
    index = (torch.tensor([0, 1]), torch.tensor([15, 15]))
    assert torch.equal(storage.get(index)["next", "observation"], fresh.storage.get(index)["next", "observation"])


def test_terminal_frames_are_checkpointed_by_env_major_slot():
    """The terminal-frame table is indexed env * L + slot, as checkpoints have always stored
    it, whatever order the rings keep in memory."""
    storage = DedupEnvRingStorage(2, 6)
    rb = EnvRingReplayBuffer(storage=storage)
    for p in range(4):
        obs = torch.tensor([[float(p)], [10.0 + p]])
        nxt = obs + 1
        done = torch.tensor([[False], [p == 2]])
        if p == 2:
            nxt[1] = 99.0  # env 1's episode ends at position 2 (slot 2)
        rb.extend(TensorDict({"observation": obs, "next": {"observation": nxt, "done": done}}, [2]))
    table = storage.state_dict()["dedup"]["bookkeeping"][0]
    assert (table >= 0).nonzero().flatten().tolist() == [1 * 6 + 2]
    got = storage.get((torch.tensor([1, 1, 0]), torch.tensor([2, 3, 2])))["next", "observation"]
    assert got.flatten().tolist() == [99.0, 14.0, 3.0]


@pytest.mark.parametrize("num_stack", [1, 3])
def test_reads_are_the_same_in_both_memory_layouts(num_stack):
    """Dedup rings are env-major by default (a stack's frames are adjacent rows); a time-major
    one holds and reads the same steps."""
    assert DedupEnvRingStorage(2, 6).time_major is False
    rng = random.Random(7)
    streams = Streams(2, num_stack, 0, "reset", rng)
    storages = [DedupEnvRingStorage(2, 6, num_stack=num_stack, time_major=tm) for tm in (False, True)]
    buffers = [EnvRingReplayBuffer(storage=storage) for storage in storages]
    for _ in range(15):
        td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
        for rb in buffers:
            rb.extend(td, env_ids=ids)
    readable = storages[0].current_pos - storages[0].current_size + num_stack - 1
    env = torch.tensor([0, 1]).repeat_interleave(15 - int(readable.max()))
    pos = torch.cat([torch.arange(int(readable[e]), int(readable[e]) + 15 - int(readable.max())) for e in (0, 1)])
    want, got = storages[0].get((env, pos)), storages[1].get((env, pos))
    for key in want.keys(True, True):
        assert torch.equal(want[key], got[key]), key


def test_plain_ring_is_not_affected():
    assert EnvRingStorage.required_lookback == 0


@pytest.mark.parametrize("obs_key", ["observation", ("agents", "pixels")])
def test_reads_gather_the_stored_frames_of_stacked_observations_only_once(obs_key, monkeypatch):
    """The parent's gather leaves out the one-frame obs leaf, which the stacks read themselves."""
    storage = DedupEnvRingStorage(2, 8, obs_key=obs_key, num_stack=2)
    rb = EnvRingReplayBuffer(storage=storage)
    next_key = ("next", obs_key) if isinstance(obs_key, str) else ("next", *obs_key)
    for t in range(3):
        frame = lambda s: torch.full((2, 3), float(s))  # noqa: E731
        td = TensorDict({"next": {"done": torch.zeros(2, 1, dtype=torch.bool)}}, [2])
        td.set(obs_key, torch.stack([frame(max(t - 1, 0)), frame(t)], 1))
        td.set(next_key, torch.stack([frame(t), frame(t + 1)], 1))
        rb.extend(td)
    parent_keys = []  # what the parent gathered, before the stacks are added
    parent_gather = EpisodicEnvRingStorage.gather

    def recorded(self, *args, **kwargs):
        out = parent_gather(self, *args, **kwargs)
        parent_keys.append(list(out.keys(True, True)))
        return out
    monkeypatch.setattr(EpisodicEnvRingStorage, "gather", recorded)
    got = storage.get((torch.tensor([0, 1]), torch.tensor([1, 2])))
    assert parent_keys == [[("next", "done")]]
    assert got[obs_key][:, :, 0].tolist() == [[0.0, 1.0], [1.0, 2.0]]
    assert got[next_key][:, :, 0].tolist() == [[1.0, 2.0], [2.0, 3.0]]


def _two_steps(padding: str, blocks: bool):
    streams = Streams(1, 3, 0, padding, random.Random(5))
    steps = [streams.step(0, p_done=0.0) for _ in range(2)]
    return to_td([0], [steps], blocks=True) if blocks else [to_td([0], [[s]], blocks=False) for s in steps]


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("damage, match", [
    ("older_frame_of_next", "is not 'observation' shifted by one frame"),
    ("older_frame_of_first", "first 'observation' stack of an episode must be padded"),
    ("older_frame_of_second", "\\('next', 'observation'\\) of a step differs from 'observation'"),
])
def test_stacks_that_reads_would_not_give_back_are_refused(padding, damage, match):
    """Only each stack's newest frame is stored: every other frame must be what reads rebuild."""
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 6, num_stack=3, padding=padding))
    (first, ids), (second, _) = _two_steps(padding, blocks=False)
    if damage == "older_frame_of_next":
        first["next", "observation"][0, 0] += 7  # next must be obs shifted by one frame
    elif damage == "older_frame_of_first":
        first["observation"][0, 0] += 7
        first["next", "observation"][0, :2] = first["observation"][0, 1:]
    if damage == "older_frame_of_second":
        rb.extend(first, env_ids=ids)
        second["observation"][0, 0] += 7
        second["next", "observation"][0, :2] = second["observation"][0, 1:]
        target = second
    else:
        target = first
    before = rb.storage.state_dict()
    with pytest.raises(ValueError, match=match):
        rb.extend(target, env_ids=ids)
    written = damage == "older_frame_of_second"
    assert rb.storage.current_pos.tolist() == ([1] if written else [0])
    if written:
        after = rb.storage.state_dict()
        assert all(torch.equal(a, b) for a, b in zip(before["data"]["leaves"], after["data"]["leaves"]))


def test_stacks_inside_a_block_must_follow_each_other_frame_for_frame():
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 6, num_stack=3))
    block, ids = _two_steps("reset", blocks=True)
    block["observation"][0, 1, 0] += 7
    block["next", "observation"][0, 1, :2] = block["observation"][0, 1, 1:]
    with pytest.raises(ValueError, match=r"\('next', 'observation'\) of a step differs from 'observation'"):
        rb.extend(block, env_ids=ids)
    assert len(rb) == 0


@pytest.mark.parametrize("fast", [True, False])
def test_first_writes_inside_inference_mode_then_outside(fast):
    # The lazily allocated frames (rings, pending stacks, terminal frames) must be normal
    # tensors: the writes after the inference_mode block update them in place.
    buffers = [EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 12, num_stack=4)) for _ in range(2)]
    for inside, rb in zip((True, False), buffers):
        streams = Streams(1, 4, 0, "reset", random.Random(5))
        with torchrl_ext.fastpath(fast):
            for k in range(10):
                td, ids = to_td([0], [[streams.step(0, p_done=0.5)]], blocks=False)
                with torch.inference_mode(inside and k < 3):
                    rb.extend(td, env_ids=ids)
    index = (torch.zeros(10, dtype=torch.long), torch.arange(10))
    inside, outside = (rb.storage.get(index) for rb in buffers)
    assert (inside == outside).all()


def test_reset_refuses_a_boolean_mask_before_any_change():
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 6, num_stack=2))
    streams = Streams(2, 2, 0, "reset", random.Random(0))
    for _ in range(3):
        td, ids = to_td([0, 1], [[streams.step(0, p_done=0.0)], [streams.step(1, p_done=0.0)]], blocks=False)
        rb.extend(td, env_ids=ids)
    before = (rb.storage.current_size.clone(), rb.storage._terminal_row.clone(), rb.storage._last_done.clone())
    with pytest.raises(TypeError, match=r"got dtype=torch\.bool; .*mask\.nonzero\(\)\.squeeze\(1\)"):
        rb.storage.reset(torch.tensor([True, False]))
    after = (rb.storage.current_size, rb.storage._terminal_row, rb.storage._last_done)
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_a_state_without_frame_tables_is_refused_before_anything_changes():
    rng = random.Random(5)
    streams = Streams(2, 3, 0, "reset", rng)
    storage = DedupEnvRingStorage(2, 6, num_stack=3)
    for _ in range(3):
        td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
        EnvRingReplayBuffer(storage=storage).extend(td, env_ids=ids)
    counters = (storage.positions.clone(), storage.sizes.clone())
    index = (torch.tensor([0, 1]), torch.tensor([2, 2]))
    stored = storage.get(index).clone()
    other = EnvRingStorage(2, 6)  # a checkpoint of another storage: no frame tables
    other.set((torch.tensor([0, 1]), torch.tensor([0, 0])), TensorDict({"x": torch.ones(2)}, [2]))
    other.set((torch.tensor([0, 1]), torch.tensor([1, 1])), TensorDict({"x": torch.ones(2)}, [2]))
    with pytest.raises(ValueError, match=r"the checkpoint has no frame tables \('dedup'\)"):
        storage.load_state_dict(other.state_dict())
    assert torch.equal(storage.positions, counters[0]) and torch.equal(storage.sizes, counters[1])
    assert (storage.get(index) == stored).all()


@pytest.mark.parametrize("bad", ["False", 2, 0, None, torch.tensor(True)])
@pytest.mark.parametrize("name", ["check_next", "record_episodic_return"])
def test_flags_must_be_bools(name, bad):
    # bool("False") is True: a coerced flag would turn on what the caller turned off.
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got {name}={re.escape(repr(bad))}\."):
        DedupEnvRingStorage(2, 4, **{name: bad})


def test_done_with_several_values_per_step_is_refused_by_name():
    from torchrl_ext.storages import DedupEnvRingStorage

    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 4))
    step = TensorDict({"observation": torch.zeros(2, 1),
                       "next": {"observation": torch.ones(2, 1), "done": torch.zeros(2, 2, dtype=torch.bool)}}, [2])
    with pytest.raises(ValueError, match=r"\('next', 'done'\) must hold one value per step, of shape \[2\] or \[2, 1\], got \[2, 2\]"):
        rb.extend(step)
    assert len(rb) == 0
    step["next", "done"] = torch.zeros(2, 1, dtype=torch.bool)
    rb.extend(step)
    assert len(rb) == 2
