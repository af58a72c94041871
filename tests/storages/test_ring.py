"""EnvRingStorage: per-env rings, checked writes, reads, checkpoints, TorchRL compatibility."""
from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import RandomSampler, ReplayBuffer, TensorDictReplayBuffer

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
import torchrl_ext
from torchrl_ext.storages import EnvRingStorage
from torchrl_ext.writers import EnvRingWriter

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def steps(env_ids, values, device="cpu") -> TensorDict:
    """One step per env: obs = [v, -v], ("next", "done") = v odd, pixels = v % 256."""
    v = torch.as_tensor(values, dtype=torch.float32)
    n = v.shape[0]
    return TensorDict(
        {
            "obs": torch.stack([v, -v], -1),
            "pixels": (v.long() % 256).to(torch.uint8).view(n, 1, 1).expand(n, 3, 3).clone(),
            "next": {"done": (v.long() % 2 == 1).unsqueeze(-1)},
            "env_id": torch.as_tensor(env_ids),
        },
        [n],
        device=device,
    )


def filled_buffer(device="cpu", num_envs=3, max_length=4) -> EnvRingReplayBuffer:
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length, device=device)
    # env e gets values 100 * e + k, k = 0, 1, ...; env 1 is written less often.
    for k in range(6):
        envs = [0, 2] if k % 2 else [0, 1, 2]
        rb.extend(steps(envs, [100 * e + k for e in envs], device))
    return rb


@pytest.mark.parametrize("device", DEVICES)
def test_rings_hold_the_latest_steps_of_each_env(device):
    rb = filled_buffer(device)
    storage = rb.storage
    assert storage.current_pos.tolist() == [6, 3, 6]
    assert storage.current_size.tolist() == [4, 3, 4]
    assert len(storage) == len(rb) == 11
    # env 0 wrote k = 0..5 into slots k % 4: slots hold 4, 5, 2, 3.
    assert storage._rings.data["obs"][0, :, 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    # env 1 wrote only k = 0, 2, 4 (positions 0, 1, 2).
    assert storage.read(torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2]))["obs"][:, 0].tolist() == [
        100.0, 102.0, 104.0]
    assert storage._rings.data["obs"].device.type == torch.device(device).type
    assert storage.earliest_position().tolist() == [2, 0, 2]


def test_get_returns_the_index_shape_and_every_nested_leaf():
    rb = filled_buffer()
    env = torch.tensor([[0, 0], [2, 2]])
    position = torch.tensor([[2, 3], [4, 5]])
    out = rb.storage.get((env, position))
    assert out.batch_size == torch.Size([2, 2])
    assert out["obs"][..., 0].tolist() == [[2.0, 3.0], [204.0, 205.0]]
    assert out["pixels"].shape == (2, 2, 3, 3)
    assert out["next", "done"].tolist() == [[[False], [True]], [[False], [True]]]
    assert "env_id" not in out.keys()


def test_read_rejects_positions_that_are_not_stored():
    storage = filled_buffer().storage
    with pytest.raises(ValueError, match=r"position 1 of env 0 is not stored; env 0 holds positions \[2, 5\]"):
        storage.read(torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="position 6 of env 2 is not stored"):
        storage.read(torch.tensor([2]), torch.tensor([6]))
    with pytest.raises(ValueError, match=r"env_ids must lie in \[0, 2\]"):
        storage.read(torch.tensor([3]), torch.tensor([0]))


def test_gather_all_on_an_empty_or_cleared_buffer_is_empty():
    # ALF returns max_length stale steps per env here (its bug Q18).
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    data, positions = rb.gather_all()
    assert data.batch_size == torch.Size([2, 0]) and positions.tolist() == [0, 0]
    for k in range(4):
        rb.extend(steps([0, 1], [k, 10 + k]))
    data, positions = rb.gather_all()
    assert data["obs"][..., 0].tolist() == [[1.0, 2.0, 3.0], [11.0, 12.0, 13.0]]
    assert positions.tolist() == [1, 1]
    rb.clear()
    data, positions = rb.gather_all()
    assert data.batch_size == torch.Size([2, 0]) and "obs" in data.keys()


def test_gather_all_needs_envs_in_step():
    rb = filled_buffer()
    with pytest.raises(ValueError, match=r"same position with the same size, got current_pos=\[6, 3, 6\]"):
        rb.gather_all()
    with pytest.raises(ValueError, match="num_earliest_ignored must be an int >= 0"):
        rb.storage.gather_all(-1)


def test_writes_with_other_keys_shapes_or_dtypes_raise_and_leave_the_data_untouched():
    rb = filled_buffer()
    before = rb.storage.state_dict()
    bad_key = steps([0], [7]).exclude("pixels")
    bad_shape = steps([0], [7]).set("obs", torch.zeros(1, 3))
    bad_dtype = steps([0], [7]).set("obs", torch.zeros(1, 2, dtype=torch.float64))
    for data, message in (
        (bad_key, r"data keys differ from the stored keys \(missing: \['pixels'\]"),
        (bad_shape, r"key 'obs': stored items have shape \[2\], got \[3\]"),
        (bad_dtype, "key 'obs': stored dtype is torch.float32, got torch.float64"),
    ):
        with pytest.raises(ValueError, match=message):
            rb.extend(data)
    after = rb.storage.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(before["data"]["leaves"], after["data"]["leaves"]))
    assert all(torch.equal(a, b) for a, b in zip(before["counters"], after["counters"]))


def test_set_checks_coordinates_and_data():
    storage = EnvRingStorage(2, 3)
    data = TensorDict({"x": torch.zeros(2)}, [2])
    with pytest.raises(ValueError, match=r"env_ids must lie in \[0, 1\], got values in \[0, 2\]"):
        storage.set((torch.tensor([0, 2]), torch.tensor([0, 0])), data)
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        storage.set((torch.tensor([0, 1]), torch.tensor([0, -1])), data)
    with pytest.raises(TypeError, match=r"addressed by \(env, position\) pairs"):
        storage.set(torch.tensor([0, 1]), data)
    with pytest.raises(TypeError, match="data must be a TensorDict"):
        storage.set((torch.tensor([0, 1]), torch.tensor([0, 0])), torch.zeros(2))
    with pytest.raises(ValueError, match=r"data has batch size \[2\] but the cursor addresses \[1\]"):
        storage.set((torch.tensor([0]), torch.tensor([0])), data)
    with pytest.raises(RuntimeError, match="is empty: write data before reading"):
        storage.get((torch.tensor([0]), torch.tensor([0])))
    assert not storage.initialized and len(storage) == 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_geometry_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got num_envs="):
        EnvRingStorage(bad, 3)
    with pytest.raises(ValueError, match="max_length must be an int >= 1, got max_length="):
        EnvRingStorage(2, bad)


def test_contains_follows_the_stored_positions():
    storage = filled_buffer().storage
    # env 1 holds positions 0..2; env 0 holds 2..5 (0 and 1 were overwritten).
    assert [storage.contains((1, p)) for p in range(4)] == [True, True, True, False]
    assert [storage.contains((0, p)) for p in range(7)] == [False, False] + [True] * 4 + [False]


def test_state_dict_round_trip_restores_data_and_counters():
    rb = filled_buffer()
    fresh = EnvRingReplayBuffer(num_envs=3, max_length=4)
    fresh.load_state_dict(rb.state_dict())
    assert fresh.storage.current_pos.tolist() == [6, 3, 6]
    assert fresh.storage.current_size.tolist() == [4, 3, 4]
    for key, value in rb.storage._rings.data.items(include_nested=True, leaves_only=True):
        assert torch.equal(fresh.storage._rings.data[key], value)
    # Writing continues at the same slots.
    fresh.extend(steps([1], [999]))
    assert fresh.storage.read(torch.tensor([1]), torch.tensor([3]))["obs"][0, 0] == 999.0


@pytest.mark.parametrize("time_major", [True, False])
def test_storages_loaded_from_one_state_share_nothing(time_major):
    rb = filled_buffer()
    state = rb.state_dict()
    first, second = (EnvRingReplayBuffer(storage=EnvRingStorage(3, 4, time_major=time_major)) for _ in range(2))
    first.load_state_dict(state)
    second.load_state_dict(state)
    env, oldest = torch.tensor([0]), torch.tensor([2])  # env 0 holds positions 2..5 of a 4-slot ring
    before = second.storage.read(env, oldest)["obs"].clone()
    first.extend(steps([0, 1, 2], [7, 8, 9]))  # env 0's position 6 takes position 2's slot
    assert torch.equal(second.storage.read(env, oldest)["obs"], before)
    assert torch.equal(rb.storage.read(env, oldest)["obs"], before)


def test_dumps_loads_round_trip(tmp_path):
    rb = filled_buffer()
    rb.dumps(tmp_path / "rb")
    assert (tmp_path / "rb" / "storage" / "ring_storage.safetensors").exists()
    fresh = EnvRingReplayBuffer(num_envs=3, max_length=4)
    fresh.loads(tmp_path / "rb")
    assert torch.equal(fresh.storage.current_pos, rb.storage.current_pos)
    assert torch.equal(fresh.storage._rings.data["next", "done"], rb.storage._rings.data["next", "done"])
    assert fresh.write_count == rb.write_count == 15


def test_loading_into_other_geometry_raises():
    rb = filled_buffer()
    with pytest.raises(ValueError, match="checkpoint has max_length=4 but this storage has max_length=5"):
        EnvRingStorage(3, 5).load_state_dict(rb.storage.state_dict())


def test_torchrl_random_sampler_draws_stored_steps_uniformly():
    """A plain TorchRL ReplayBuffer with RandomSampler works on the ring (dim_extend=0)."""
    rb = ReplayBuffer(
        storage=EnvRingStorage(2, 50), writer=EnvRingWriter(), sampler=RandomSampler(),
        batch_size=4000, dim_extend=0, collate_fn=lambda x: x,
        generator=torch.Generator().manual_seed(0),
    )
    # env 0: 60 steps (holds positions 10..59); env 1: 20 steps (positions 0..19).
    for k in range(60):
        envs = [0, 1] if k < 20 else [0]
        rb.extend(steps(envs, [1000 * e + k for e in envs]))
    values = rb.sample()["obs"][:, 0].long()
    env, pos = values // 1000, values % 1000
    assert pos[env == 0].min() >= 10 and pos[env == 1].max() < 20
    # 70 stored steps drawn uniformly: env 0 holds 50 of them.
    assert abs(float((env == 0).float().mean()) - 50 / 70) < 0.03
    assert len(set(values.tolist())) == 70  # every stored step is reachable


def test_torchrl_buffers_that_cannot_drive_the_ring_are_refused():
    with pytest.raises(ValueError, match="needs dim_extend=0"):
        ReplayBuffer(storage=EnvRingStorage(2, 4), writer=EnvRingWriter(), collate_fn=lambda x: x)
    with pytest.raises(ValueError, match="use torchrl_ext.replay_buffers.EnvRingReplayBuffer"):
        TensorDictReplayBuffer(storage=EnvRingStorage(2, 4), writer=EnvRingWriter(),
                               collate_fn=lambda x: x, dim_extend=0)


def test_writes_after_unpickling_reach_the_checkpointed_data():
    # The flat views the writes go through must view the unpickled leaves, not copies
    # of them: state_dict (and so every checkpoint) reads the leaves.
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    rb.extend(TensorDict({"x": torch.tensor([1.0, 2.0])}, [2]), env_ids=torch.tensor([1, 0]))
    copy = pickle.loads(pickle.dumps(rb))
    copy.extend(TensorDict({"x": torch.tensor([5.0, 6.0])}, [2]), env_ids=torch.tensor([1, 0]))
    restored = EnvRingStorage(2, 3)
    restored.load_state_dict(copy.storage.state_dict())
    assert restored._rings.data["x"].tolist() == [[2.0, 6.0, 0.0], [1.0, 5.0, 0.0]]
    assert copy.storage._rings.data["x"].tolist() == [[2.0, 6.0, 0.0], [1.0, 5.0, 0.0]]
    assert rb.storage._rings.data["x"].tolist() == [[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]]


def test_common_position_and_fullness_follow_every_env_counter():
    """The byte comparisons behind the every-env write path: one differing env is enough."""
    storage = EnvRingStorage(num_envs=3, max_length=2)
    assert storage._rings.common_position() == 0 and not storage._is_full
    storage.advance(None, 1)
    assert storage._rings.common_position() == 1 and not storage._is_full
    storage.advance(torch.tensor([2]), 1)  # env 2 alone: positions 1, 1, 2
    assert storage._rings.common_position() is None and not storage._is_full
    storage.advance(torch.tensor([0, 1]), 1)  # back in step at 2: every ring full
    assert storage._rings.common_position() == 2 and storage._is_full
    storage.shrink(torch.tensor([1]), 1)
    assert storage._rings.common_position() == 2 and not storage._is_full
    assert storage.current_size.tolist() == [2, 1, 2]
    single = EnvRingStorage(num_envs=1, max_length=4)
    single.advance(None, 3)
    assert single._rings.common_position() == 3 and not single._is_full


@pytest.mark.parametrize("key", ["tag", ("sub", "tag")])
@pytest.mark.parametrize("first", [True, False])
def test_non_tensor_entries_are_refused_not_dropped(key, first):
    """TensorDict's own leaf listing omits non-tensor entries: they were once dropped without a word."""
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    step = TensorDict({"obs": torch.tensor([1.0, 2.0]), "sub": {"x": torch.zeros(2)}}, [2])
    if not first:
        rb.extend(step)
    with pytest.raises(TypeError, match=r"non-tensor entries \[.*'tag'.*\]; EnvRingStorage stores tensors only"):
        rb.extend(step.clone().set_non_tensor(key, "a"))
    assert rb.storage.current_pos.tolist() == ([0, 0] if first else [1, 1])
    rb.extend(step * 3)
    assert rb.storage.get((torch.tensor([0, 1]), rb.storage.current_pos - 1))["obs"].tolist() == [3.0, 6.0]


def filled_with(time_major: bool) -> EnvRingReplayBuffer:
    """filled_buffer's steps (E = 3, L = 4) in a storage of the given memory layout."""
    rb = EnvRingReplayBuffer(storage=EnvRingStorage(3, 4, time_major=time_major))
    for k in range(6):
        envs = [0, 2] if k % 2 else [0, 1, 2]
        rb.extend(steps(envs, [100 * e + k for e in envs]))
    return rb


@pytest.mark.parametrize("time_major", [True, False])
def test_memory_layout_and_env_major_checkpoints(time_major):
    """Time-major, slot s of every env is one block (rows s * E .. s * E + E - 1): a step of
    every env is a single copy per leaf. Env-major, each env's ring is one block (rows
    e * L .. e * L + L - 1). The [E, L] leaves view that memory, and checkpoints store
    them env-major in both layouts, so either loads the other's files."""
    rb = filled_with(time_major)  # env 0's slots hold k = 4, 5, 2, 3; env 2's 204, 205, 202, 203
    storage = rb.storage
    assert storage.time_major is time_major
    flat, obs = storage.flat_leaf("obs"), storage._rings.data["obs"]
    assert obs.shape == (3, 4, 2) and obs.data_ptr() == flat.data_ptr()
    row = (lambda e, s: s * 3 + e) if time_major else (lambda e, s: e * 4 + s)
    assert flat[[row(0, s) for s in range(4)], 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert flat[[row(2, s) for s in range(4)], 0].tolist() == [204.0, 205.0, 202.0, 203.0]
    rb.extend(steps([0, 1, 2], [7.0, 8.0, 9.0]))
    # env 1 stood at position 3 and the others at 6: its step went to slot 3, theirs to slot 2.
    assert flat[[row(0, 2), row(1, 3), row(2, 2)], 0].tolist() == [7.0, 8.0, 9.0]

    state = storage.state_dict()
    leaves = dict(zip((tuple(k) if len(k) > 1 else k[0] for k in state["data"]["keys"]), state["data"]["leaves"]))
    assert leaves["obs"].is_contiguous() and leaves["obs"].shape == (3, 4, 2)
    assert torch.equal(leaves["obs"], obs)
    everything = (torch.arange(3).repeat_interleave(4), torch.arange(4).repeat(3))
    for other_layout in (True, False):
        restored = EnvRingStorage(3, 4, time_major=other_layout)
        restored.load_state_dict(state)  # env-major leaves in: the storage's own layout out
        memory = restored._rings.data["obs"].transpose(0, 1) if other_layout else restored._rings.data["obs"]
        assert memory.is_contiguous()
        assert (restored.get(everything) == storage.get(everything)).all()


def test_time_major_must_be_a_bool():
    with pytest.raises(TypeError, match=r"time_major must be a bool .*got time_major=1"):
        EnvRingStorage(2, 3, time_major=1)
    assert EnvRingStorage(2, 3).time_major is True
    assert EnvRingStorage(2, 3, time_major=False).time_major is False


def test_each_write_bumps_the_revision_once_whatever_torchrl_counts_it_with():
    """The rings bump TorchRL's shared revision counter themselves (one lock instead of three);
    a compilable storage's tensor counter goes through TorchRL's own bump."""
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    step = TensorDict({"obs": torch.zeros(2)}, [2])
    storage = rb.storage
    start = storage._mutation_revision
    rb.extend(step)  # the general write (allocates)
    rb.extend(step)  # the every-env write
    rb.extend(step[:1], env_ids=torch.tensor([1]))
    assert storage._mutation_revision == start + 3
    storage._compilable = True
    storage._mutation_revision_value = torch.zeros((), dtype=torch.int64)
    rb.extend(step, env_ids=torch.tensor([1, 0]))
    rb.clear()
    assert storage._mutation_revision == 2


@pytest.mark.parametrize("time_major", [True, False])
def test_every_env_steps_store_the_same_by_the_step_path_the_general_write_or_with_fastpath_off(time_major):
    """A step of every env is copied through numpy views of one slot (the step fast path),
    by the general write (envs given out of order), or with the fast paths off: all three
    store the same, a batch with a non-contiguous leaf included."""
    order = torch.tensor([2, 0, 1])
    results = {}
    for path in ("step", "general", "fastpath off"):
        rb = EnvRingReplayBuffer(storage=EnvRingStorage(3, 4, time_major=time_major))
        with torchrl_ext.fastpath(path != "fastpath off"):
            for k in range(10):  # wraps twice
                data = steps([0, 1, 2], [k, 10 + k, 20 + k]).exclude("env_id")
                if k == 6:
                    data.set("obs", data["obs"].t().contiguous().t())
                if path == "general":
                    rb.extend(data[order], env_ids=order)
                else:
                    rb.extend(data)
        results[path] = rb.storage
    want = results["general"]
    for path in ("step", "fastpath off"):
        got = results[path]
        assert got.current_pos.tolist() == want.current_pos.tolist() == [10, 10, 10]
        for key, leaf in want._rings.data.items(True, True):
            assert torch.equal(got._rings.data[key], leaf), (path, key)
    assert bool(results["step"]._rings.step_columns_cache)
    assert not results["fastpath off"]._rings.step_columns_cache


def test_the_memory_layout_is_fixed_at_construction():
    # Was settable: readers kept their flat views of the old layout and returned rows
    # in the wrong order ([0, 10, 1, 11, ...] instead of [0, 1, 2, 10, ...]).
    storage = EnvRingStorage(2, 3)
    with pytest.raises(AttributeError, match="time_major is fixed when the storage is built"):
        storage.time_major = False
    assert storage.time_major is True


# ---------------------------------------------------------------- the public storage contract
def test_counter_views_are_live_and_the_numpy_ones_read_only():
    storage = EnvRingStorage(3, 4)
    positions, sizes, pos_array, size_array = storage.positions, storage.sizes, storage.position_array, storage.size_array
    step = TensorDict({"x": torch.arange(2.0)}, [2])
    storage.set((torch.tensor([0, 2]), torch.tensor([0, 0])), step)
    storage.advance(torch.tensor([0, 2]), 1)
    assert positions.tolist() == [1, 0, 1] and sizes.tolist() == [1, 0, 1]  # live: no re-read
    assert pos_array.tolist() == [1, 0, 1] and size_array.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="read-only"):
        pos_array[0] = 5
    assert storage.current_pos.tolist() == [1, 0, 1]  # the copies agree
    storage.reset(torch.tensor([2]))
    assert storage.resets.tolist() == [0, 0, 1] and sizes.tolist() == [1, 0, 0]


@pytest.mark.parametrize("time_major", [True, False])
def test_flat_index_addresses_the_flat_leaves(time_major):
    storage = EnvRingStorage(3, 4, time_major=time_major)
    env = torch.tensor([0, 1, 2, 1, 0, 2])
    position = torch.tensor([0, 0, 0, 1, 5, 6])
    values = torch.arange(6.0) + 10
    storage.set((env, position), TensorDict({"x": values}, [6]))
    ((key, rows),) = storage.flat_leaves
    assert key == "x" and rows.shape == (12,)
    assert torch.equal(rows[storage.flat_index(env, position)], values)
    assert torch.equal(storage.get((env, position))["x"], values)


def test_draw_uniform_draws_only_stored_steps():
    storage = EnvRingStorage(3, 4)
    storage.set((torch.tensor([1, 1]), torch.tensor([0, 1])), TensorDict({"x": torch.zeros(2)}, [2]))
    storage.advance(torch.tensor([1]), 2)
    env, position = storage.draw_uniform(200)
    assert set(env.tolist()) == {1} and set(position.tolist()) == {0, 1}


def test_a_subclass_overriding_write_at_never_gets_the_step_write():
    calls = []

    class Counting(EnvRingStorage):
        def write_at(self, env, position, data, *, set_cursor):
            calls.append(env.numel())
            super().write_at(env, position, data, set_cursor=set_cursor)

    rb = EnvRingReplayBuffer(storage=Counting(4, 8))
    with torchrl_ext.fastpath(True):
        for t in range(3):
            rb.extend(TensorDict({"x": torch.full((4,), float(t))}, [4]))
    assert calls == [4, 4, 4]  # every step through the override
    assert rb.storage.positions.tolist() == [3, 3, 3, 3]


def test_gather_all_before_any_write_is_empty_even_with_moved_counters():
    storage = EnvRingStorage(2, 3)
    storage.advance(None, 2)  # counters moved, nothing allocated
    data, positions = storage.gather_all()
    assert data.batch_size == (2, 0) and positions.tolist() == [0, 0]


@pytest.mark.parametrize("fast", [True, False])
def test_first_write_inside_inference_mode(fast):
    rb = EnvRingReplayBuffer(num_envs=2, max_length=4, batch_size=2)
    with torchrl_ext.fastpath(fast):
        with torch.inference_mode():
            rb.extend(steps([0, 1], [1.0, 2.0]))
            rb.sample()
        rb.extend(steps([1, 0], [3.0, 4.0]))
        rb.sample()
    assert rb.read(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]))["obs"][:, 0].tolist() == [1.0, 4.0, 2.0, 3.0]


def test_storage_methods_refuse_non_integer_env_ids_and_positions():
    rb = filled_buffer()
    storage = rb.storage
    before = (storage.current_pos.tolist(), storage.current_size.tolist())
    for call in (lambda: storage.shrink(torch.tensor([0.5]), 1), lambda: storage.reset([1.5]),
                 lambda: storage.reset(torch.tensor([True, False, True])),
                 lambda: storage.advance(torch.tensor([1.0]), 1)):
        with pytest.raises(TypeError, match=r"env_ids must hold integer env ids, got dtype=torch\.(float32|bool)"):
            call()
    with pytest.raises(ValueError, match=r"env_ids must lie in \[0, 2\]"):
        storage.reset(torch.tensor([3]))
    with pytest.raises(TypeError, match=r"index\[1\] must hold integer positions, got dtype=torch\.float32"):
        storage.get((torch.tensor([0]), torch.tensor([1.0])))
    assert (storage.current_pos.tolist(), storage.current_size.tolist()) == before
