"""EnvRingWriter's every-env fast path: one step of all envs at one position, written as columns.

Every test compares the fast path with the general write (the same buffer with the
fast path switched off) or with hand-built values, and checks which path ran.
"""
from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import PrioritizedTrajectorySampler
from torchrl_ext.storages import EnvRingStorage, EpisodicEnvRingStorage

E, L = 3, 4


def step(value: float, num_envs: int = E, **extra) -> TensorDict:
    """One step of every env: obs [E, 2] f32, a nested int16 entry and a bool flag."""
    base = value + torch.arange(num_envs, dtype=torch.float32)
    td = TensorDict({
        "obs": torch.stack([base, -base], 1),
        "nested": {"count": base.to(torch.int16)},
        "flag": base.remainder(2) == 0,
    }, [num_envs])
    for key, item in extra.items():
        td.set(key, item)
    return td


def general_only(rb: EnvRingReplayBuffer) -> EnvRingReplayBuffer:
    """The same buffer with the fast path switched off (the storage declines every step write)."""
    rb.storage.write_step = lambda *args, **kwargs: None
    return rb


@pytest.fixture
def spy(monkeypatch):
    """Counts calls of the general EnvRingStorage.write_at."""
    calls = []
    original = EnvRingStorage.write_at

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EnvRingStorage, "write_at", counted)
    return calls


def snapshot(rb: EnvRingReplayBuffer) -> tuple:
    storage = rb.storage
    data = None if storage._rings.data is None else storage._rings.data.clone()
    return (data, storage.current_pos.tolist(), storage.current_size.tolist(),
            rb.write_count, storage._mutation_revision)


def same_data(a: TensorDict | None, b: TensorDict | None) -> bool:
    if a is None or b is None:
        return a is b
    return set(a.keys(True, True)) == set(b.keys(True, True)) and bool((a == b).all())


def assert_same(a: EnvRingReplayBuffer, b: EnvRingReplayBuffer) -> None:
    (data_a, *rest_a), (data_b, *rest_b) = snapshot(a), snapshot(b)
    assert same_data(data_a, data_b)
    assert rest_a == rest_b
    cursors = a.storage.last_written_rows, b.storage.last_written_rows
    assert cursors[0] is cursors[1] is None or torch.equal(*cursors)


# Operations: every env in order (three ways of naming them), a permuted or partial
# write, a [N, T] block, and a dequeue that leaves the envs at different positions.
operations = st.lists(
    st.sampled_from(["every", "every_ids", "every_entry", "permuted", "partial", "block", "dequeue"]),
    min_size=1, max_size=25,
)


def ring(kind: str, time_major: bool) -> EnvRingStorage:
    if kind == "episodic":  # its step path runs its own write_at (the episode index)
        return EpisodicEnvRingStorage(E, L, step_type_key="flag", time_major=time_major)
    return EnvRingStorage(E, L, time_major=time_major)


@pytest.mark.parametrize("kind", ["ring", "episodic"])
@pytest.mark.parametrize("time_major", [True, False])
@settings(max_examples=40, deadline=None)
@given(ops=operations)
def test_fast_path_leaves_the_state_the_general_write_leaves(kind, time_major, ops):
    fast = EnvRingReplayBuffer(storage=ring(kind, time_major))
    slow = general_only(EnvRingReplayBuffer(storage=ring(kind, time_major)))
    for i, op in enumerate(ops):
        value = 10.0 * i
        results = []
        for rb in (fast, slow):
            if op == "every":
                results.append(rb.extend(step(value)))
            elif op == "every_ids":
                results.append(rb.extend(step(value), env_ids=torch.arange(E)))
            elif op == "every_entry":
                results.append(rb.extend(step(value, env_id=torch.arange(E))))
            elif op == "permuted":
                results.append(rb.extend(step(value), env_ids=torch.tensor([2, 0, 1])))
            elif op == "partial":
                results.append(rb.extend(step(value, num_envs=2), env_ids=torch.tensor([0, 2])))
            elif op == "block":
                block = torch.stack([step(value), step(value + 1)], 1)
                results.append(rb.extend(block))
            elif len(rb.storage) and int(rb.storage.current_size[1]) > 0:
                results.append(rb.dequeue(1, env_ids=[1])["obs"])
        if results:
            assert torch.equal(results[0], results[1]), op
        assert_same(fast, slow)
        if kind == "episodic":
            episodes = [rb.storage.state_dict()["episodes"] for rb in (fast, slow)]
            assert all(torch.equal(a, b) for a, b in zip(*episodes)), op
    # The fast buffer reads back what was written, through the storage's own reads.
    env, pos = torch.arange(E), fast.storage.current_pos - 1
    if bool((fast.storage.current_size > 0).all()):
        assert (fast.storage.get((env, pos)) == slow.storage.get((env, pos))).all()


@pytest.mark.fastpath
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("how", ["implicit", "env_ids", "entry"])
def test_every_env_in_order_at_one_position_takes_the_fast_path(spy, how, time_major):
    rb = EnvRingReplayBuffer(storage=EnvRingStorage(E, L, time_major=time_major))
    rb.extend(step(0.0))  # the first write allocates through the general path
    assert spy == [1]
    for t in range(1, 6):  # wraps around the rings
        data = step(float(t), env_id=torch.arange(E)) if how == "entry" else step(float(t))
        ids = torch.arange(E) if how == "env_ids" else None
        index = rb.extend(data, env_ids=ids)
        assert index.tolist() == [[e, t] for e in range(E)]
    assert spy == [1]  # no general write since the first
    assert rb.storage.current_pos.tolist() == [6] * E and rb.storage.current_size.tolist() == [L] * E
    got = rb.storage.get((torch.arange(E).unsqueeze(1).expand(E, L), torch.arange(2, 6).expand(E, L)))
    expected = torch.stack([step(float(t)) for t in range(2, 6)], 1)
    assert (got == expected).all()
    if how == "entry":
        assert "env_id" in data.keys()  # the caller's batch keeps its entry


@pytest.mark.parametrize(
    "case",
    ["permuted", "int32_ids", "list_ids", "unsynced", "block", "bfloat16", "requires_grad", "episodic"],
)
def test_other_writes_take_the_general_path_with_the_same_result(spy, case):
    storage = EpisodicEnvRingStorage(E, L, step_type_key="flag") if case == "episodic" \
        else EnvRingStorage(E, L)
    rb = EnvRingReplayBuffer(storage=storage)
    first = step(0.0)
    if case == "bfloat16":
        first.set("low", torch.ones(E, dtype=torch.bfloat16))
    rb.extend(first)
    data, ids = step(1.0), None
    if case == "bfloat16":
        data.set("low", torch.full((E,), 2.0, dtype=torch.bfloat16))
    elif case == "permuted":
        ids = torch.tensor([1, 0, 2])
    elif case == "int32_ids":
        ids = torch.arange(E, dtype=torch.int32)
    elif case == "list_ids":
        ids = list(range(E))
    elif case == "unsynced":
        rb.extend(step(0.5, num_envs=1), env_ids=torch.tensor([1]))
    elif case == "block":
        data = torch.stack([data, step(2.0)], 1)
    elif case == "requires_grad":
        data.set("obs", data.get("obs").requires_grad_())
    calls = len(spy)
    rb.extend(data, env_ids=ids)
    assert len(spy) == calls + 1
    order = [1, 0, 2] if case == "permuted" else list(range(E))
    written = data if data.batch_dims == 1 else data[:, -1]
    newest = rb.storage.get((torch.tensor(order), rb.storage.current_pos[order] - 1))
    assert (newest == written.detach()).all()


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda td: td.set("obs", td.get("obs").double()), r"key 'obs': stored dtype is torch.float32"),
        (lambda td: td.set("obs", torch.zeros(E, 3)), r"key 'obs': stored items have shape \[2\], got \[3\]"),
        (lambda td: td.set("extra", torch.zeros(E)), r"extra: \['extra'\]"),
        (lambda td: td.exclude("flag"), r"missing: \['flag'\]"),
        (lambda td: td.set(("nested", "count"), torch.zeros(E, dtype=torch.int32)), "stored dtype is torch.int16"),
    ],
)
def test_bad_step_of_every_env_raises_the_general_error_and_writes_nothing(bad, message):
    rb = EnvRingReplayBuffer(num_envs=E, max_length=L)
    rb.extend(step(0.0))
    before = snapshot(rb)
    data = bad(step(1.0))
    with pytest.raises(ValueError, match=message):
        rb.extend(data)
    after = snapshot(rb)
    assert same_data(after[0], before[0]) and after[1:] == before[1:]


def test_writes_land_in_the_leaves_held_after_share_memory_load_and_pickle():
    rb = EnvRingReplayBuffer(num_envs=E, max_length=L)
    rb.extend(step(0.0))
    rb.extend(step(1.0))  # fast path: numpy views of the current leaves are cached
    rb.storage.share_memory_()
    rb.extend(step(2.0))
    position = torch.full((E,), 2)
    assert (rb.storage.get((torch.arange(E), position)) == step(2.0)).all()

    state = rb.storage.state_dict()
    other = EnvRingReplayBuffer(num_envs=E, max_length=L)
    other.extend(step(-1.0))
    other.extend(step(-2.0))
    other.storage.load_state_dict(state)
    other.extend(step(3.0))
    assert (other.storage.get((torch.arange(E), torch.full((E,), 3))) == step(3.0)).all()
    assert (other.storage.get((torch.arange(E), position)) == step(2.0)).all()

    copy = pickle.loads(pickle.dumps(other))
    copy.extend(step(4.0))
    assert (copy.storage.get((torch.arange(E), torch.full((E,), 4))) == step(4.0)).all()
    rows = copy.storage._rings.data["obs"].transpose(0, 1).view(-1, 2)  # time-major memory
    assert rows.data_ptr() == copy.storage.flat_leaf("obs").data_ptr()
    assert (rows == copy.storage.flat_leaf("obs")).all()
    assert int(other.storage.current_pos[0]) == 4  # the original did not see the copy's write


@pytest.mark.parametrize("priority_key", ["td_error", ("td_error",), ("nested", "td_error")])
def test_priorities_given_with_a_step_of_every_env_reach_the_sampler(priority_key):
    sampler = PrioritizedTrajectorySampler(batch_length=1)
    rb = EnvRingReplayBuffer(num_envs=E, max_length=L, sampler=sampler, priority_key=priority_key)
    first, second = step(0.0), step(1.0)
    first.set(priority_key, torch.tensor([1.0, 2.0, 3.0]))
    second.set(priority_key, torch.tensor([4.0, 5.0, 6.0]))
    rb.extend(first)
    rb.extend(second)  # the fast path
    sampler._sync(rb.storage)
    leaves = sampler._tree.leaves[: E * L].reshape(E, L)[:, :2]
    expected = torch.tensor([[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]) ** sampler.alpha
    assert torch.allclose(leaves.double(), expected.double())


def test_steps_after_a_write_with_autograd_history_are_stored():
    # Was: the stored leaf joined the graph after that write, and later every-env steps raised
    # RuntimeError from numpy(). The rings now store steps detached (test_ring_autograd.py).
    rb = EnvRingReplayBuffer(num_envs=2, max_length=4)
    rb.extend(TensorDict({"obs": torch.zeros(2, 1)}, [2]))
    rb.extend(TensorDict({"obs": torch.ones(2, 1).requires_grad_()}, [2]), env_ids=torch.tensor([1, 0]))
    assert not rb.storage._rings.data["obs"].requires_grad
    index = rb.extend(TensorDict({"obs": torch.full((2, 1), 2.0)}, [2]))
    assert index.tolist() == [[0, 2], [1, 2]]
    assert rb.storage._rings.data["obs"][:, :3, 0].tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]


def test_an_episodic_storage_writes_a_step_of_every_env_itself():
    """Its step path runs its write_at (episode index included) without the writer's general path."""
    storage = EpisodicEnvRingStorage(E, L, step_type_key="flag")
    rb = EnvRingReplayBuffer(storage=storage)
    assert storage.write_step(step(0.0)) is None  # nothing stored yet: the general path allocates
    rb.extend(step(0.0))
    assert storage.write_step(step(1.0)) == 1
    assert storage.current_pos.tolist() == [2] * E
    assert (storage.get((torch.arange(E), torch.ones(E, dtype=torch.long))) == step(1.0)).all()
    rb.extend(step(2.0, num_envs=1), env_ids=torch.tensor([0]))
    assert storage.write_step(step(3.0)) is None  # the envs stand apart
    rb.extend(step(4.0, num_envs=2), env_ids=torch.tensor([1, 2]))  # back at one position
    before, episodes = snapshot(rb), storage.state_dict()["episodes"]
    with pytest.raises(ValueError, match=r"key 'obs': stored dtype is torch.float32"):
        storage.write_step(step(5.0).set("obs", torch.zeros(E, 2, dtype=torch.float64)))
    after = snapshot(rb)
    assert same_data(after[0], before[0]) and after[1:] == before[1:] and after[1] == [3] * E
    assert all(torch.equal(a, b) for a, b in zip(episodes, storage.state_dict()["episodes"]))
