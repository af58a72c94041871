"""PrioritizedTrajectorySampler: leaves track valid starts, frequencies, weights, stale updates."""
from __future__ import annotations

import math
import pickle
import random

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import PrioritizedTrajectorySampler


def make(num_envs=2, max_length=6, seed=0, **kwargs):
    sampler = PrioritizedTrajectorySampler(**kwargs)
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length, sampler=sampler,
                             generator=torch.Generator().manual_seed(seed))
    return rb, sampler


def write(rb, envs, t):
    envs = list(envs)
    rb.extend(TensorDict({"x": torch.tensor([1000.0 * e + t for e in envs])}, [len(envs)]),
              env_ids=envs)


def expected_leaves(rb, sampler, priority_of):
    """Brute force: leaf of slot s of env e is priority_of[(e, p)] if p is a valid start."""
    storage = rb.storage
    length = storage.max_length
    out = torch.zeros(storage.num_envs * length)
    for e in range(storage.num_envs):
        pos, size = int(storage.current_pos[e]), int(storage.current_size[e])
        first = pos - size + sampler.num_earliest_frames_ignored
        for p in range(first, pos - sampler.batch_length + 1):
            out[e * length + p % length] = priority_of.get((e, p), 1.0)
    return out


def test_leaves_follow_writes_dequeues_clears_and_batch_length_changes():
    rng = random.Random(0)
    for trial in range(4):
        rb, sampler = make(num_envs=3, max_length=5, num_earliest_frames_ignored=trial % 2,
                           batch_length=2)
        priority_of = {}
        for step in range(120):
            op = rng.random()
            storage = rb.storage
            if op < 0.55:
                envs = sorted(rng.sample(range(3), rng.randint(1, 3)))
                write(rb, envs, step)
            elif op < 0.65 and len(storage):
                e = rng.randrange(3)
                if int(storage.current_size[e]) >= 1:
                    rb.dequeue(1, env_ids=[e])
            elif op < 0.7:
                rb.clear(env_ids=[rng.randrange(3)])
                priority_of = {k: v for k, v in priority_of.items()
                               if storage.contains(k)}
            elif op < 0.75:
                sampler.batch_length = rng.randint(1, 3)
            else:
                # Random priorities for random (env, position) pairs, stale ones included.
                env = rng.randrange(3)
                pos = int(storage.current_pos[env])
                positions = [rng.randint(max(0, pos - 8), pos + 1) for _ in range(3)]
                values = [round(rng.uniform(0.1, 4.0), 2) for _ in positions]
                if len(storage):
                    sampler._sync(storage)
                    a = pos - int(storage.current_size[env]) + sampler.num_earliest_frames_ignored
                    b = pos - sampler.batch_length
                    for p, v in zip(positions, values):
                        if a <= p <= b:
                            priority_of[(env, p)] = v
                    sampler.update_window_priority([env] * 3, positions, values)
            # A written slot forgets the priority of the step it replaced.
            priority_of = {k: v for k, v in priority_of.items() if rb.storage.contains(k)}
            if len(rb.storage):
                sampler._sync(rb.storage)
                leaves = sampler._tree.leaves[: 15].float()
                expected = expected_leaves(rb, sampler, priority_of)
                # New windows get max(current max, 1.0): compare positivity and set priorities.
                assert torch.equal(leaves > 0, expected > 0), (trial, step)
                for (e, p), v in priority_of.items():
                    if expected[e * 5 + p % 5] > 0:
                        assert leaves[e * 5 + p % 5] == pytest.approx(v), (trial, step, e, p)


def test_sampling_frequencies_follow_priorities():
    rb, sampler = make(num_envs=2, max_length=4, batch_length=1, with_replacement=True)
    for t in range(4):
        write(rb, [0, 1], t)
    priorities = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 1.0, 0.0])
    for e in range(2):
        sampler.update_window_priority([e] * 4, list(range(4)), priorities[4 * e: 4 * e + 4])
    batch = rb.sample(40000)
    leaf = batch["env_ids"][:, 0] * 4 + batch["positions"][:, 0]
    observed = torch.bincount(leaf, minlength=8).double()
    expected = priorities.double() / priorities.sum() * 40000
    assert observed[7] == 0
    chi2 = float(((observed[:7] - expected[:7]) ** 2 / expected[:7]).sum())
    assert chi2 < 22.5  # 99.9% quantile, 6 degrees of freedom


def test_importance_weights_in_both_conventions():
    for weights, expected in (("alf", lambda p: p * 3 / 6.0), ("per", lambda p: (p / 1.0) ** -0.5)):
        rb, sampler = make(num_envs=1, max_length=3, batch_length=1, weights=weights, beta=0.5)
        for t in range(3):
            write(rb, [0], t)
        sampler.update_window_priority([0, 0, 0], [0, 1, 2], [1.0, 2.0, 3.0])
        batch = rb.sample(30)
        prio = batch["positions"][:, 0].double() + 1
        assert torch.allclose(batch["priority_weight"][:, 0].double(), expected(prio)), weights


def test_alpha_and_eps_transform_priorities():
    rb, sampler = make(num_envs=1, max_length=2, batch_length=1, alpha=0.5, eps=0.25)
    write(rb, [0], 0)
    write(rb, [0], 1)
    sampler.update_window_priority([0], [1], [2.0])
    assert sampler._tree.leaves[1] == pytest.approx(1.5)  # (2 + 0.25) ** 0.5


def test_new_windows_get_the_current_maximum():
    rb, sampler = make(num_envs=1, max_length=4, batch_length=1, initial_priority=1.0)
    write(rb, [0], 0)
    rb.sample(1)
    sampler.update_window_priority([0], [0], [7.0])
    write(rb, [0], 1)
    rb.sample(1)
    assert sampler._tree.leaves[:2].tolist() == [7.0, 7.0]


@pytest.mark.parametrize("writes", ["two steps, a sample between", "two steps", "one [1, 2] block"])
def test_new_windows_get_the_maximum_stored_when_the_sampler_next_follows_the_storage(writes):
    # The documented rule: the writes between two samples count as one, so start 3 (complete
    # while start 1 held 100) gets 100 only if a sample came before start 1 was overwritten.
    rb, sampler = make(num_envs=1, max_length=3, batch_length=1)
    for t in range(3):
        write(rb, [0], t)
    rb.sample(1)
    sampler.update_window_priority([0], [1], [100.0])
    if writes == "one [1, 2] block":
        rb.extend(TensorDict({"x": torch.tensor([[3.0, 4.0]])}, [1, 2]), env_ids=[0])
    else:
        write(rb, [0], 3)
        if writes == "two steps, a sample between":
            rb.sample(1)
        write(rb, [0], 4)  # overwrites start 1
    rb.sample(1)
    expected = [1.0, 100.0, 100.0] if writes == "two steps, a sample between" else [1.0, 1.0, 1.0]
    assert [sampler._tree.leaves[p % 3].item() for p in (2, 3, 4)] == expected


@pytest.mark.parametrize("before_sync", ["clear another env", "new batch_length", "nothing"])
def test_a_new_step_never_takes_the_priority_of_the_step_it_overwrote(before_sync):
    # Was: when an env was cleared or the geometry changed before the next sync, the
    # steps written since the last sync kept the priority stored for their ring slot.
    rb, sampler = make(num_envs=2, max_length=3, batch_length=1)
    write(rb, [0, 1], 0)
    sampler.update_window_priority([0], [0], [0.001])  # syncs
    for t in range(1, 5):
        write(rb, [0], t)  # env 0 holds 2, 3, 4; position 3 reuses the slot of position 0
    if before_sync == "clear another env":
        rb.clear(env_ids=[1])
    elif before_sync == "new batch_length":
        sampler.batch_length = 2  # valid starts 2 and 3
    batch = rb.sample(600)
    # None of env 0's starts was given a priority: each gets the new-window priority 1.
    assert batch["priority_weight"].unique().tolist() == [1.0]
    slots = [sampler._tree.leaves[p % 3].item() for p in (2, 3, 4)]  # env 0's leaves
    assert slots == ([1.0, 1.0, 1.0] if sampler.batch_length == 1 else [1.0, 1.0, 0.0])


def test_stale_or_invalid_updates_are_skipped_without_error():
    # ALF raises when every position is stale (Q14) and re-enables ignored ones (Q15).
    rb, sampler = make(num_envs=1, max_length=3, batch_length=2, num_earliest_frames_ignored=1)
    for t in range(5):
        write(rb, [0], t)
    # Stored positions 2, 3, 4; position 2 is ignored; valid starts: {3}.
    before = sampler._tree.leaves.clone() if sampler._tree is not None else None
    sampler.update_window_priority([0, 0, 0, 0], [0, 2, 4, 9], [5.0, 5.0, 5.0, 5.0])
    rb.sample(1)
    leaves = sampler._tree.leaves
    assert float(leaves.sum()) == pytest.approx(1.0) and before is None
    sampler.update_window_priority([0, 0], [3, 0], [2.5, 9.0])
    assert float(sampler._tree.leaves.sum()) == pytest.approx(2.5)


def test_short_envs_are_never_drawn():
    # ALF draws negative positions from envs shorter than batch_length (Q16).
    rb, sampler = make(num_envs=2, max_length=6, batch_length=3)
    for t in range(5):
        write(rb, [0] if t < 2 else [0, 1], t)  # env 1 holds 3 steps, env 0 holds 5
    write(rb, [0], 5)
    rb.clear(env_ids=[1])
    write(rb, [1], 6)
    write(rb, [1], 7)  # env 1: 2 steps, too short
    batch = rb.sample(200)
    assert set(batch["env_ids"][:, 0].tolist()) == {0}
    assert bool((batch["positions"] >= 0).all())


def test_recent_data_and_priorities_together():
    rb, sampler = make(num_envs=1, max_length=40, batch_length=1, recent_data_steps=2,
                       recent_data_ratio=0.25)
    for t in range(40):
        write(rb, [0], t)
    sampler.update_window_priority([0] * 40, list(range(40)), torch.linspace(1, 2, 40))
    batch = rb.sample(8)
    assert bool((batch["positions"][:2, 0] >= 38).all())
    assert batch["priority_weight"][:2, 0].tolist() == [1.0, 1.0]
    assert bool((batch["priority_weight"][2:, 0] != 1.0).any())


def test_zero_priorities_everywhere_raise():
    rb, sampler = make(num_envs=1, max_length=3, batch_length=1)
    for t in range(3):
        write(rb, [0], t)
    sampler.update_window_priority([0, 0, 0], [0, 1, 2], 0.0)
    with pytest.raises(ValueError, match="every valid window has priority 0"):
        rb.sample(2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_priorities_raise_and_change_nothing(bad):
    rb, sampler = make(num_envs=1, max_length=3, batch_length=1)
    for t in range(3):
        write(rb, [0], t)
    rb.sample(1)
    before = sampler._tree.leaves.clone()
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        sampler.update_window_priority([0, 0], [0, 1], [1.0, bad])
    assert torch.equal(sampler._tree.leaves, before)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="weights must be 'alf' or 'per'"):
        PrioritizedTrajectorySampler(weights="max")
    with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\], got beta=2.0"):
        PrioritizedTrajectorySampler(beta=2.0)
    with pytest.raises(ValueError, match="alpha must be >= 0.0, got alpha=-1.0"):
        PrioritizedTrajectorySampler(alpha=-1.0)
    # Infinite settings were accepted and turned every importance weight into NaN.
    for name in ("alpha", "eps", "initial_priority"):
        with pytest.raises(ValueError, match=f"{name} must be a finite number, got {name}=inf"):
            PrioritizedTrajectorySampler(**{name: math.inf})
    with pytest.raises(RuntimeError, match="not attached to a buffer yet"):
        PrioritizedTrajectorySampler().update_window_priority([0], [0], [1.0])


def test_buffer_update_priority_from_a_sample():
    rb, sampler = make(num_envs=2, max_length=5, batch_length=2)
    for t in range(5):
        write(rb, [0, 1], t)
    batch = rb.sample(4)
    rb.update_priority(batch["index"], torch.full((4, 2), 3.0))
    for e, p in zip(batch["env_ids"][:, 0].tolist(), batch["positions"][:, 0].tolist()):
        assert sampler._tree.leaves[e * 5 + p % 5] == 3.0


def test_checkpoint_reproduces_the_next_samples(tmp_path):
    rb, sampler = make(num_envs=2, max_length=5, batch_length=2, seed=1)
    for t in range(7):
        write(rb, [0, 1] if t % 3 else [1], t)
    sampler.update_window_priority([0, 1, 1], [4, 3, 5], [4.0, 0.5, 2.0])
    rb.sample(3)
    rb.dumps(tmp_path / "rb")
    fresh, _ = make(num_envs=2, max_length=5, batch_length=2)
    fresh.loads(tmp_path / "rb")
    write(rb, [0], 99)
    write(fresh, [0], 99)
    rb.set_rng(torch.Generator().manual_seed(5))
    fresh.set_rng(torch.Generator().manual_seed(5))
    assert torch.equal(rb.sample(16)["x"], fresh.sample(16)["x"])
    assert torch.equal(rb._sampler._tree.leaves, fresh._sampler._tree.leaves)


def test_sampler_takes_window_priorities_as_soon_as_its_buffer_exists():
    import torch
    from tensordict import TensorDict

    from torchrl_ext.replay_buffers import EnvRingReplayBuffer
    from torchrl_ext.samplers import PrioritizedTrajectorySampler

    sampler = PrioritizedTrajectorySampler(1)
    rb = EnvRingReplayBuffer(num_envs=1, max_length=4, sampler=sampler)
    # Nothing stored yet: an update for a start that is not valid is skipped, not an error.
    sampler.update_window_priority(torch.tensor([0]), torch.tensor([0]), torch.tensor([5.0]))
    for t in range(2):
        rb.extend(TensorDict({"x": torch.tensor([float(t)])}, [1]))
    sampler.update_window_priority(torch.tensor([0]), torch.tensor([0]), torch.tensor([0.0]))
    # Start 0 now has priority 0: every window drawn starts at 1.
    assert (rb.sample(16)["x"][:, 0] == 1.0).all()


def test_a_storage_loaded_back_to_an_earlier_state_is_synced_afresh():
    # Was: the sampler assumed ring counters only move forward unless an env is cleared;
    # after storage.load_state_dict(earlier) it drew windows past the stored steps.
    torch.manual_seed(0)
    sampler = PrioritizedTrajectorySampler(batch_length=2)
    rb = EnvRingReplayBuffer(num_envs=2, max_length=8, sampler=sampler, batch_size=64)
    for t in range(3):
        rb.extend(TensorDict({"t": torch.full((2,), float(t))}, [2]))
    early = rb.storage.state_dict()
    for t in range(3, 8):
        rb.extend(TensorDict({"t": torch.full((2,), float(t))}, [2]))
    rb.sample()
    rb.storage.load_state_dict(early)
    batch = rb.sample()
    assert set(batch["positions"][:, 0].tolist()) <= {0, 1}
    assert set(batch["t"].flatten().tolist()) <= {0.0, 1.0, 2.0}


def test_a_new_storage_under_a_reused_id_is_synced_afresh(monkeypatch):
    # Was: storages were told apart by id(), which CPython reuses once a storage is freed;
    # a sampler moved to a new storage under the old id kept the old one's window priorities.
    import torchrl_ext.samplers.prioritized_trajectory as module

    monkeypatch.setattr(module, "id", lambda obj: 0, raising=False)  # every storage the same id
    sampler = PrioritizedTrajectorySampler(batch_length=2)
    old = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=sampler)
    for t in range(3):
        write(old, [0], t)
    old.sample(4)
    sampler.update_window_priority(torch.tensor([0]), torch.tensor([0]), torch.tensor([0.0]))
    new = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=sampler)
    for t in range(5):  # past the old storage's positions: no counter went back
        write(new, [0], t)
    new.sample(4)
    assert sampler._tree.leaves[:4].tolist() == [1.0, 1.0, 1.0, 1.0]  # start 0 no longer 0


# --------------------------------------------------------------------------- refused priorities and settings
def _filled(**kwargs):
    rb, sampler = make(num_envs=1, max_length=6, batch_length=2, **kwargs)
    for t in range(5):
        write(rb, [0], t)
    rb.sample(2)  # syncs the leaves
    return rb, sampler


def _snapshot(sampler):
    return sampler._tree.leaves.clone(), sampler._stored.clone()


def _unchanged(sampler, before):
    assert torch.equal(sampler._tree.leaves, before[0]) and torch.equal(sampler._stored, before[1])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda s: s.update_window_priority([0], [1], [1e39]), "priorities=1e\\+39 with alpha=1 .* 3.403e\\+38"),
        (lambda s: s.update_window_priority([0, 0], [0, 1], [1.0, 2.0, 3.0]),
         "one length N .*'env_ids': 2, 'positions': 2, 'priorities': 3"),
        (lambda s: s.update_window_priority([0, 0, 0], [0, 1], [1.0]), "'env_ids': 3, 'positions': 2"),
        (lambda s: s.check_priority(torch.tensor([1e39], dtype=torch.float64), 1), "priorities=1e\\+39"),
        (lambda s: s.update_priority(torch.tensor([[0, 1]]), torch.tensor([1e39], dtype=torch.float64)),
         "priorities=1e\\+39"),
    ],
)
def test_overflowing_or_mismatched_priorities_are_refused(call, match):
    rb, sampler = _filled()
    before = _snapshot(sampler)
    with pytest.raises(ValueError, match=match):
        call(sampler)
    _unchanged(sampler, before)
    assert torch.isfinite(rb.sample(4)["priority_weight"]).all()


def test_overflow_after_alpha_is_refused_and_length_one_still_broadcasts():
    rb, sampler = _filled(alpha=2.0)
    before = _snapshot(sampler)
    with pytest.raises(ValueError, match="priorities=1e\\+20 with alpha=2"):
        sampler.update_window_priority([0], [1], 1e20)
    _unchanged(sampler, before)
    sampler.update_window_priority(0, [0, 1, 2], 3.0)  # one env id and one priority for all
    assert sampler._tree.leaves[:4].tolist() == [9.0, 9.0, 9.0, 1.0]  # start 3 kept its priority


@pytest.mark.parametrize("env_ids,positions,name", [([0.9], [1], "env_ids"), ([0], [1.5], "positions"),
                                                    (torch.tensor([True]), [1], "env_ids")])
def test_non_integer_env_ids_or_positions_are_refused(env_ids, positions, name):
    _, sampler = _filled()
    before = _snapshot(sampler)
    with pytest.raises(TypeError, match=f"{name} must hold integer"):
        sampler.update_window_priority(env_ids, positions, [2.0])
    _unchanged(sampler, before)


def test_string_priorities_are_a_type_error_naming_them():
    _, sampler = _filled()
    before = _snapshot(sampler)
    with pytest.raises(TypeError, match="priorities must be a real number .* got priorities='a'"):
        sampler.update_window_priority([0], [1], "a")
    _unchanged(sampler, before)


@pytest.mark.parametrize(
    "name,value,exc,match",
    [
        ("alpha", -1.0, ValueError, "alpha must be >= 0.0, got alpha=-1.0"),
        ("alpha", math.nan, ValueError, "alpha must be"),
        ("eps", -5.0, ValueError, "eps must be >= 0.0, got eps=-5.0"),
        ("beta", 1.5, ValueError, "beta must be a number in \\[0, 1\\], got beta=1.5"),
        ("initial_priority", -1.0, ValueError, "initial_priority must be >= 0.0"),
        ("initial_priority", 1e39, ValueError, "initial_priority=1e\\+39 with alpha=1"),
        ("alpha", 40.0, ValueError, "initial_priority=10 with alpha=40"),  # (10 + 0) ** 40 overflows
        ("weights", "max", ValueError, "weights must be 'alf' or 'per'"),
        ("alpha", "1", TypeError, "alpha must be a real number"),
    ],
)
def test_settings_are_checked_as_the_constructor_checks_them(name, value, exc, match):
    rb, sampler = _filled(initial_priority=10.0)
    old, before = getattr(sampler, name), _snapshot(sampler)
    with pytest.raises(exc, match=match):
        setattr(sampler, name, value)
    assert getattr(sampler, name) == old
    rb.sample(2)
    _unchanged(sampler, before)
    if name != "weights" and not isinstance(value, str) and not math.isnan(value):
        with pytest.raises(exc, match=match.split(",")[0]):  # the constructor raises the same
            PrioritizedTrajectorySampler(2, **{"initial_priority": 10.0, name: value})


def test_settings_set_to_valid_values_are_used():
    rb, sampler = _filled()
    sampler.alpha, sampler.eps = 2.0, 1.0
    sampler.update_window_priority([0], [1], [2.0])
    assert float(sampler._tree.leaves[1]) == 9.0  # (2 + 1) ** 2
    sampler.initial_priority = 3.0
    write(rb, [0], 5)
    rb.sample(2)
    assert float(sampler._tree.leaves[4]) == 16.0  # new window: (3 + 1) ** 2 > largest leaf 9
    clone = pickle.loads(pickle.dumps(sampler))
    assert (clone.alpha, clone.eps, clone.initial_priority) == (2.0, 1.0, 3.0)


@pytest.mark.parametrize("inside_first", [True, False])
def test_first_sync_inside_inference_mode_then_outside(inside_first):
    rb, sampler = make(num_envs=1, max_length=6, batch_length=2)
    for step, inside in enumerate([inside_first, not inside_first]):
        write(rb, [0], 2 * step)  # the storage is made on its first write: outside, as usual
        write(rb, [0], 2 * step + 1)
        with torch.inference_mode(inside):  # the first sync makes the tree
            rb.sample(2)
            sampler.update_window_priority([0], [2 * step], [5.0])
    assert sampler._tree.leaves.tolist() == [5.0, 5.0, 5.0, 0.0, 0.0, 0.0]  # new windows: the max leaf


def _rings(num_envs=2, max_length=8, seed=0, sample=True):
    rb, sampler = make(num_envs=num_envs, max_length=max_length, seed=seed, batch_length=2)
    for t in range(5):
        write(rb, range(num_envs), t)
    if sample:
        rb.sample(4)
    return rb, sampler


def _sampler_state(sampler):
    state = sampler.state_dict()
    return state["tree"]["levels"][0].clone(), state["stored"][0].clone(), state["seen"][0].clone()


def _damaged(field):
    def change(state):
        state[field] = [state[field][0].clone().fill_(math.nan if field == "stored" else -1)]
        return state
    return change


@pytest.mark.parametrize("change, pattern", [
    (lambda s: {}, r"state_dict lacks \['initialized', 'tree', 'stored', 'seen', 'seen_geometry'\]: it is damaged"),
    (lambda s: None, r"state_dict lacks \['initialized'"),
    (lambda s: {k: v for k, v in s.items() if k != "seen"}, r"state_dict lacks \['seen'\]: it is damaged or of "
                                                            r"another sampler; pass a PrioritizedTrajectorySampler"),
    (_damaged("stored"), r"state_dict is damaged: its 'tree', 'stored', 'seen' and 'seen_geometry' do not fit"),
    (_damaged("seen"), r"state_dict is damaged"),
    (lambda s: s | {"seen_geometry": "2"}, r"state_dict is damaged"),
    (lambda s: s | {"stored": [s["stored"][0][:-1]]}, r"state_dict is damaged"),
])
def test_a_damaged_or_foreign_state_is_refused_before_anything_changes(change, pattern):
    # Was: a bare KeyError, raised after the tree had been replaced by the state's.
    import copy

    _, other = _rings(seed=1)
    other.update_window_priority([0, 1], [1, 2], [50.0, 7.0])
    state = change(copy.deepcopy(other.state_dict()))
    _, sampler = _rings()
    before = _sampler_state(sampler)
    with pytest.raises(ValueError, match=pattern):
        sampler.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(before, _sampler_state(sampler)))


def test_a_trajectory_samplers_state_is_refused():
    from torchrl_ext.samplers import TrajectorySampler

    _, sampler = _rings()
    with pytest.raises(ValueError, match=r"state_dict lacks \['initialized'.*of another sampler"):
        sampler.load_state_dict(TrajectorySampler(2).state_dict())


@pytest.mark.parametrize("attached", [True, False])
def test_a_state_of_rings_of_another_geometry_is_refused(attached):
    # Was: a 3 envs x 16 steps state was taken by a sampler serving 2 envs x 8 steps.
    _, other = _rings(num_envs=3, max_length=16)
    rb, sampler = _rings()
    if not attached:  # a copy has no storage link: its own tree's geometry is checked
        sampler = pickle.loads(pickle.dumps(sampler))
    before = _sampler_state(sampler)
    with pytest.raises(ValueError, match=r"state_dict holds window priorities of 3 envs x 16 steps but this "
                                         r"sampler serves 2 envs x 8 steps; build the buffer as the saved one"):
        sampler.load_state_dict(other.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before, _sampler_state(sampler)))


def test_a_buffer_refuses_a_sampler_state_of_other_rings_before_loading_its_storage():
    # Was: the buffer's trial load (on a copy without the storage link) accepted it, then the
    # real load raised after the storage had been replaced.
    saved, _ = _rings()
    state = saved.state_dict()
    state["_sampler"] = _rings(num_envs=2, max_length=4)[1].state_dict()
    rb, sampler = make(num_envs=2, max_length=8, batch_length=2)
    for t in (100, 101):
        write(rb, [0, 1], t)
    assert sampler.state_dict() == {"initialized": False}  # no tree of its own to compare with
    with pytest.raises(ValueError, match=r"state_dict\['_sampler'\] cannot be loaded.*2 envs x 4 steps but "
                                         r"this sampler serves 2 envs x 8 steps"):
        rb.load_state_dict(state)
    assert len(rb) == 4 and set(rb.sample(8)["x"].flatten().tolist()) <= {100.0, 101.0, 1100.0, 1101.0}


def test_an_own_state_still_loads_exactly():
    _, saved = _rings(seed=3)
    saved.update_window_priority([0, 1], [1, 2], [5.0, 2.0])
    _, sampler = _rings()
    sampler.load_state_dict(saved.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(_sampler_state(saved), _sampler_state(sampler)))
    sampler.load_state_dict({"initialized": False})
    assert sampler.state_dict() == {"initialized": False}


@pytest.mark.parametrize("route", ["update_priority", "update_tensordict_priority"])
def test_a_priority_with_no_value_per_window_is_refused_and_changes_nothing(route):
    # Was: max over an empty dim raised a bare IndexError from amax.
    rb, sampler = make(num_envs=2, max_length=5, batch_length=2)
    for t in range(5):
        write(rb, [0, 1], t)
    batch = rb.sample(4)
    before = sampler._tree.leaves.clone()
    with pytest.raises(ValueError, match=r"holds no value per (window|step)"):
        if route == "update_priority":
            rb.update_priority(batch["index"], torch.zeros(4, 0))
        else:
            batch["td_error"] = torch.zeros(4, 2, 0)
            rb.update_tensordict_priority(batch)
    assert torch.equal(sampler._tree.leaves, before)
