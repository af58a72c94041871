"""RolloutStorage: HARL's [T + 1, N] insert / after_update convention, sampling, checkpoints."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import TensorStorage

import torchrl_ext
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import ChunkedRecurrentMinibatchSampler, FeedForwardMinibatchSampler
from torchrl_ext.storages import RolloutStorage, StorageLayoutError

T, N, A = 4, 3, 2


def step(t, n_envs=N):
    """Step t of a multi-agent rollout: per-agent obs/actions, shared state, team reward."""
    obs = lambda k: torch.full((n_envs, A, 2), float(k))  # noqa: E731
    return TensorDict(
        {
            "agents": {"observation": obs(t), "action": torch.full((n_envs, A, 1), 10.0 + t)},
            "state": torch.full((n_envs, 5), 100.0 + t),
            "next": {
                "agents": {"observation": obs(t + 1)},
                "state": torch.full((n_envs, 5), 101.0 + t),
                "reward": torch.full((n_envs, 1), 0.5 * t),
                "done": torch.zeros(n_envs, 1, dtype=torch.bool),
            },
        },
        [n_envs],
    )


def harl_reference():
    """HARL's OnPolicyActorBuffer / critic buffer bookkeeping, written as its docs describe."""
    obs = torch.zeros(T + 1, N, A, 2)
    share = torch.zeros(T + 1, N, 5)
    actions = torch.zeros(T, N, A, 1)
    for t in range(T):
        s = step(t)
        obs[t + 1] = s["next", "agents", "observation"]  # insert: obs go to [step + 1]
        share[t + 1] = s["next", "state"]
        actions[t] = s["agents", "action"]  # actions go to [step]
    return obs, share, actions


def filled(t0=0):
    rollout = RolloutStorage(T)
    for t in range(t0, t0 + T):
        rollout.insert(step(t))
    return rollout


def test_slots_follow_harl_after_one_rollout():
    rollout = filled()
    obs, share, actions = harl_reference()
    data = rollout.data
    assert data.batch_size == torch.Size([T + 1, N])
    # HARL leaves slot 0 at its initial value (zeros) before the first after_update;
    # here slot 0 holds the first step's own observation, and slots 1..T equal HARL's.
    assert torch.equal(data["agents", "observation"][1:], obs[1:])
    assert torch.equal(data["state"][1:], share[1:])
    assert torch.equal(data["agents", "action"][:T], actions)
    assert sorted(map(str, rollout.carry_keys)) == ["('agents', 'observation')", "state"]


def test_after_update_moves_the_last_slot_to_the_first():
    rollout = filled()
    rollout.after_update()
    assert rollout.step == 0
    assert torch.equal(rollout.data["agents", "observation"][0], torch.full((N, A, 2), float(T)))
    assert torch.equal(rollout.data["state"][0], torch.full((N, 5), 100.0 + T))
    # The next rollout continues from there.
    for t in range(T, 2 * T):
        rollout.insert(step(t))
    assert rollout.data["state"][:, 0, 0].tolist() == [100.0 + t for t in range(T, 2 * T + 1)]


def test_minibatch_samplers_see_the_t_filled_steps():
    rollout = filled()
    rb = TensorDictReplayBuffer(storage=rollout, sampler=FeedForwardMinibatchSampler(2), batch_size=1)
    batches = list(rb)
    assert sum(b.shape[0] for b in batches) == T * N
    assert bool((torch.cat([b["agents", "action"] for b in batches]) < 10.0 + T).all())
    rb = TensorDictReplayBuffer(storage=rollout,
                                sampler=ChunkedRecurrentMinibatchSampler(3, data_chunk_length=2), batch_size=1)
    for batch in rb:
        assert batch.shape[1] == 2 and batch["agents", "observation"].shape[2:] == (A, 2)


def test_fill_next_gives_the_bootstrap_values():
    rollout = filled()
    rollout.data.set("state_value", torch.arange(T + 1, dtype=torch.float32).view(T + 1, 1, 1).expand(T + 1, N, 1).clone())
    rollout.fill_next("state_value")
    assert rollout.data["next", "state_value"][:T, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_bad_input():
    rollout = filled()
    with pytest.raises(RuntimeError, match="holds 4 of num_steps=4 steps and cannot take 1 more; call after_update"):
        rollout.insert(step(9))
    rollout.after_update()
    with pytest.raises(ValueError, match=r"step keys differ from the rollout's \(missing: \[\"\('next', 'reward'\)\"\]"):
        rollout.insert(step(0).exclude(("next", "reward")))
    with pytest.raises(ValueError, match=r"step has batch size \[2\] but the rollout holds \[3\]"):
        rollout.insert(step(0, n_envs=2))
    assert rollout.step == 0
    with pytest.raises(ValueError, match="num_steps must be an int >= 1, got num_steps="):
        RolloutStorage(0)
    with pytest.raises(ValueError, match="carry key 'hidden' is missing under 'next'"):
        RolloutStorage(2, carry_keys=["hidden"]).insert(step(0))
    with pytest.raises(RuntimeError, match="written with insert"):
        rollout.set(0, step(0))


def test_non_tensor_entries_count_as_step_keys():
    """TensorDict's default key listing leaves non-tensor entries out; a step adding one once
    failed deep in TensorDict's assignment instead of the key check."""
    rollout = RolloutStorage(T)
    rollout.insert(step(0))
    with pytest.raises(ValueError, match=r"step keys differ from the rollout's \(missing: \[\], extra: \['tag'\]\)"):
        rollout.insert(step(1).set_non_tensor("tag", "a"))
    assert rollout.step == 1
    tagged = RolloutStorage(T)
    tagged.insert(step(0).set_non_tensor("tag", "a"))
    tagged.insert(step(1).set_non_tensor("tag", "b"))
    assert tagged.step == 2 and [tagged._storage[t].get("tag").tolist() for t in (0, 1)] == [["a"] * N, ["b"] * N]
    with pytest.raises(ValueError, match=r"missing: \['tag'\]"):
        tagged.insert(step(2))
    with pytest.raises(ValueError, match=r"data has keys .*'tag'"):
        filled().write_rollout(torch.stack([step(t).set_non_tensor("tag", "c") for t in range(T + 1)]))


def test_checkpoint_round_trip(tmp_path):
    rollout = RolloutStorage(T)
    rollout.insert(step(0))
    rollout.insert(step(1))
    rollout.dumps(tmp_path / "r")
    fresh = RolloutStorage(T)
    fresh.loads(tmp_path / "r")
    assert fresh.step == 2 and fresh.carry_keys == rollout.carry_keys
    for key in rollout.data.keys(True, True):
        assert torch.equal(fresh.data[key], rollout.data[key]), key
    fresh.insert(step(2))
    assert fresh.data["state"][3, 0, 0] == 103.0


# ---------------------------------------------------------------------------
# Blocks of steps: insert_steps and rb.extend through RolloutWriter
def collector_batch(t0, length, n_envs=N):
    """A collector's [N, L] batch (time last) of steps t0 ... t0 + L - 1."""
    return torch.stack([step(t, n_envs) for t in range(t0, t0 + length)], dim=1)


@pytest.mark.parametrize("splits", [(4,), (1, 3), (2, 2), (1, 1, 1, 1)])
def test_insert_steps_equals_step_by_step_inserts(splits):
    reference = filled()
    rollout, t0 = RolloutStorage(T), 0
    for length in splits:
        rollout.insert_steps(collector_batch(t0, length))
        t0 += length
    assert rollout.step == T
    assert (rollout.data == reference.data).all()


def test_insert_steps_keeps_reset_observations_inside_the_block():
    """After a reset at step 2, slot 2 holds the reset observation, not step 1's final one."""
    steps = [step(t) for t in range(T)]
    steps[2]["agents", "observation"] = torch.full((N, A, 2), -7.0)  # the env reset before step 2
    steps[2]["state"] = torch.full((N, 5), -70.0)
    reference = RolloutStorage(T)
    for s in steps:
        reference.insert(s)
    block = RolloutStorage(T)
    block.insert_steps(torch.stack(steps, dim=1))  # the collector's [N, T]
    assert (block.data == reference.data).all()
    assert (block.data["agents", "observation"][2] == -7.0).all()
    assert (block.data["state"][T] == 100.0 + T).all()  # the bootstrap slot: carried from step T - 1


def test_insert_steps_time_dim_and_single_env():
    reference = RolloutStorage(T)
    for t in range(T):
        reference.insert(step(t, 1))
    time_major = RolloutStorage(T)
    time_major.insert_steps(collector_batch(0, T, 1).transpose(0, 1), time_dim=0)  # [L, N]
    one_env = RolloutStorage(T)
    one_env.insert_steps(collector_batch(0, T, 1)[0])  # [L]: stored as N = 1
    for rollout in (time_major, one_env):
        assert rollout.data.shape == torch.Size([T + 1, 1])
        assert (rollout.data == reference.data).all()


def test_insert_steps_overflow_raises_and_keeps_the_data():
    rollout = RolloutStorage(T)
    rollout.insert_steps(collector_batch(0, 3))
    before = rollout.data.clone()
    with pytest.raises(RuntimeError, match="holds 3 of num_steps=4 steps and cannot take 2 more"):
        rollout.insert_steps(collector_batch(3, 2))
    with pytest.raises(ValueError, match="time_dim=2 is out of range"):
        rollout.insert_steps(collector_batch(3, 1), time_dim=2)
    with pytest.raises(TypeError, match="data must be a TensorDict with a time dim"):
        rollout.insert_steps(torch.zeros(3))
    assert rollout.step == 3 and (rollout.data == before).all()


def test_extend_appends_collector_batches_and_iterates_one_epoch():
    rb = TensorDictReplayBuffer(storage=RolloutStorage(T), sampler=FeedForwardMinibatchSampler(mini_batch_size=5))
    for _ in range(2):  # a second rollout after empty() reuses the tensors
        rb.empty()
        index = rb.extend(collector_batch(0, T))
        assert index.shape == torch.Size([T * N, 2])
        assert (rb.storage.data == filled().data).all()
        seen = torch.cat([batch["state"][:, 0] for batch in rb])  # state = 100 + t
        assert sorted(seen.tolist()) == sorted((100.0 + torch.arange(T).repeat(N)).tolist())
    rb.empty()  # the rollout keeps its N = 3 envs: a one-env batch does not fit
    with pytest.raises(ValueError, match=r"step has batch size \[1\] but the rollout holds \[3\] envs"):
        rb.extend(collector_batch(0, 1, 1)[0])
    assert len(rb) == 0


def test_rollout_writer_needs_a_rollout_storage():
    from torchrl_ext.storages import FastTensorStorage
    from torchrl_ext.writers import RolloutWriter

    with pytest.raises(TypeError, match="RolloutWriter writes into a RolloutStorage, got storage=FastTensorStorage"):
        TensorDictReplayBuffer(storage=FastTensorStorage(4), writer=RolloutWriter())


def _uncarried_step(value):
    return TensorDict({"x": torch.full((2,), value), "next": {"reward": torch.ones(2)}}, [2])


def test_state_dict_round_trip_without_carried_keys(tmp_path):
    # Nothing to carry: the loaded rollout must keep carrying nothing (not re-infer, not fail).
    rollout = RolloutStorage(3)
    rollout.insert(_uncarried_step(0.0))
    assert rollout.carry_keys == []
    for load in ("state_dict", "dumps"):
        loaded = RolloutStorage(3)
        if load == "state_dict":
            loaded.load_state_dict(rollout.state_dict())
        else:
            rollout.dumps(tmp_path / "ckpt")
            loaded.loads(tmp_path / "ckpt")
        assert loaded.carry_keys == []
        loaded.insert(_uncarried_step(1.0))
        loaded.insert(_uncarried_step(2.0))
        loaded.after_update()
        assert loaded.data["x"][:3, 0].tolist() == [0.0, 1.0, 2.0] and loaded.step == 0
    empty = RolloutStorage(3)  # carry keys not chosen yet: still inferred after a load
    fresh = RolloutStorage(3)
    fresh.load_state_dict(empty.state_dict())
    fresh.insert(TensorDict({"x": torch.zeros(2), "next": {"x": torch.ones(2)}}, [2]))
    assert fresh.carry_keys == ["x"]


def test_rollouts_loaded_from_one_state_share_nothing():
    rollout = RolloutStorage(2)
    rollout.insert(_uncarried_step(1.0))
    state = rollout.state_dict()
    first, second = RolloutStorage(2), RolloutStorage(2)
    first.load_state_dict(state)
    second.load_state_dict(state)
    first.insert(_uncarried_step(5.0))  # writes slot 1
    first.data["x"].fill_(-1.0)
    assert second.data["x"][:2, 0].tolist() == [1.0, 0.0]
    assert state["data"]["leaves"][0][:2, 0].tolist() == [1.0, 0.0]  # the caller's state, unchanged


def test_get_coordinates_are_bounds_checked():
    rollout = RolloutStorage(3)
    for t in range(2):
        rollout.insert(TensorDict({"obs": torch.tensor([10.0 * t, 10.0 * t + 1])}, [2]))
    T = torch.tensor
    with pytest.raises(IndexError, match=r"index\[1\] holds 3, out of range for dim 1 of the rollout's \[3, 2\]"):
        rollout.get((T([0]), T([3])))  # env 3 of 2
    with pytest.raises(IndexError, match=r"index\[0\] holds 3, out of range .* use values in \[-3, 2\]"):
        rollout.get((T([3]), T([0])))  # slot T: the bootstrap slot
    with pytest.raises(IndexError, match=r"index\[1\] holds -3"):
        rollout.get((T([0]), T([-3])))
    # Negative coordinates count from the end, as in TorchRL's ndim=2 storage.
    reference = TensorStorage(rollout.data[:3].clone(), ndim=2)
    for index in [(T([0, 1]), T([-1, -2])), (T([-3, -2]), T([1, 0]))]:
        assert rollout.get(index)["obs"].tolist() == reference.get(index)["obs"].tolist()
    assert rollout.get((T([1, -2]), T([-1, 1])))["obs"].tolist() == [11.0, 11.0]


@pytest.mark.parametrize("fast", [True, False])
def test_first_insert_inside_inference_mode(fast):
    step = lambda v: TensorDict({"x": torch.full((2,), v), "next": {"x": torch.full((2,), v + 1)}}, [2])
    rollout = RolloutStorage(2)
    with torchrl_ext.fastpath(fast):
        with torch.inference_mode():
            rollout.insert(step(0.0))
        rollout.insert(step(1.0))
        rollout.after_update()
        rollout.insert(step(5.0))
    assert rollout.data["x"][:, 0].tolist() == [5.0, 6.0, 2.0]  # slots 1, 2: carried next x
    assert not rollout.data["x"].is_inference()


@pytest.mark.parametrize("entry, value", [
    ("action", torch.tensor([0.7, 2.9])),  # float into the int64 slot: would truncate to 0, 2
    ("done", torch.tensor([0.0, 1.0])),  # float into the bool slot
    ("done", torch.tensor([0, 2])),  # int into the bool slot
])
def test_insert_refuses_lossy_dtype_casts_before_any_write(entry, value):
    rollout = RolloutStorage(2)
    first = TensorDict({"action": torch.tensor([1, 2]), "done": torch.tensor([False, True]),
                        "obs": torch.zeros(2)}, [2])
    rollout.insert(first)
    before = rollout.data.clone()
    bad = first.clone().set(entry, value)
    for write in (lambda: rollout.insert(bad), lambda: rollout.insert_steps(bad.unsqueeze(1)),
                  lambda: rollout.write_rollout(torch.stack([bad, bad]))):
        with pytest.raises(StorageLayoutError, match=rf"key '{entry}': the rollout stores dtype .* without loss"):
            write()
        assert (rollout.data == before).all() and rollout.step == 1
    # Widening casts are exact and pass: float64 observations into the float32 slot.
    rollout.insert(first.clone().set("obs", torch.tensor([0.5, 1.5], dtype=torch.float64)))
    assert rollout.data["obs"][1].tolist() == [0.5, 1.5] and rollout.data["obs"].dtype is torch.float32


@pytest.mark.parametrize("first", [True, False])
def test_a_block_of_no_steps_writes_nothing(first):
    """As every write of no rows: nothing stored, nothing moved (TorchRL's collectors can hand
    over empty batches)."""
    rollout = RolloutStorage(T) if first else filled()
    before = None if first else rollout.data.clone()
    rollout.insert_steps(collector_batch(0, 2)[:, :0])
    assert rollout.step == (0 if first else T)
    if first:
        with pytest.raises(RuntimeError, match="the rollout is empty: insert a step first"):
            rollout.data  # noqa: B018 - nothing was allocated
    else:
        assert (rollout.data == before).all()


def test_carry_keys_must_be_a_list_of_keys():
    with pytest.raises(TypeError, match=r"carry_keys must be a list of keys, got carry_keys='hidden'; pass \['hidden'\]"):
        RolloutStorage(2, carry_keys="hidden")
    with pytest.raises(TypeError, match=r"carry_keys\[0\] must be a key"):
        RolloutStorage(2, carry_keys=[3])
    assert RolloutStorage(2, carry_keys=[["agents", "hidden"], ["obs"]]).carry_keys == [("agents", "hidden"), "obs"]


def test_a_first_step_whose_carried_entry_differs_is_refused_before_allocation():
    """A carried key whose "next" entry has another shape would be allocated with the step's
    shape and then fail when copied; refused first, the storage takes a good step after it."""
    rollout = RolloutStorage(T)
    bad = step(0)
    bad["next", "state"] = torch.zeros(N, 6)
    with pytest.raises(ValueError, match=r"carry key 'state' has shape \[3, 5\] but its 'next' entry \[3, 6\]"):
        rollout.insert(bad)
    assert rollout.step == 0 and rollout.carry_keys == []
    with pytest.raises(RuntimeError, match="the rollout is empty"):
        rollout.data  # noqa: B018 - nothing was allocated
    rollout.insert(step(0))
    assert rollout.step == 1


def test_set_derived_takes_one_value_per_slot_or_per_step():
    rollout = filled()
    # [T, N, ...]: an estimator's output on data[:T]; the bootstrap slot of a new key is 0
    per_step = torch.arange(T * N, dtype=torch.float32).reshape(T, N, 1)
    rollout.set_derived("advantage", per_step)
    assert torch.equal(rollout.data["advantage"][:T], per_step)
    assert torch.equal(rollout.data["advantage"][T], torch.zeros(N, 1))
    # [T + 1, N, ...] replaces every slot; a later [T, N, ...] keeps slot T as it is
    rollout.set_derived("advantage", torch.full((T + 1, N, 1), 7.0))
    rollout.set_derived("advantage", -per_step)
    assert torch.equal(rollout.data["advantage"][:T], -per_step)
    assert torch.equal(rollout.data["advantage"][T], torch.full((N, 1), 7.0))
    before = rollout.data["advantage"].clone()
    with pytest.raises(ValueError, match=r"'advantage' must be shaped \[T \+ 1, N, \.\.\.\] = \[5, 3\] or "
                                         r"\[T, N, \.\.\.\] = \[4, 3\] plus item dims, got \[3, 3, 1\]"):
        rollout.set_derived("advantage", torch.zeros(T - 1, N, 1))
    assert torch.equal(rollout.data["advantage"], before)
