"""NStepSampler's chain table: kept in step with the writes, rebuilt when it cannot be.

The sampled values themselves are checked against brute-force walks in
``test_nstep_layouts.py`` / ``test_nstep.py``; here the table that produces them
is checked against a rebuild from scratch after every write, on every layout.
"""
from __future__ import annotations

import pickle
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tests.samplers.test_nstep_layouts import GAMMA, LAYOUTS, fill
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedNStepSampler
from torchrl_ext.samplers._chain_table import ChainTable
from torchrl_ext.samplers._streams import streams_of
from torchrl_ext.storages import FastTensorStorage


def assert_table_matches_a_rebuild(sampler: NStepSampler, storage) -> None:
    streams = streams_of(sampler, storage)
    table = sampler._chain_table
    assert table.current(streams, sampler._chain_settings())
    fresh = ChainTable(streams, (sampler.n_step, sampler.gamma), sampler._chain_values, sampler._counts)
    env, start = streams.all_starts()
    flat = streams.flat(env, start)
    got, want = table.lookup(flat), fresh.lookup(flat)
    assert torch.equal(got[0], want[0]), "chain stops differ from a rebuild"
    assert torch.equal(got[1], want[1]), "n-step rewards differ from a rebuild"
    assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n_step=st.integers(1, 4), num_envs=st.integers(1, 3),
       rows=st.integers(2, 9), steps=st.integers(2, 30))
def test_the_table_follows_every_write(layout, seed, n_step, num_envs, rows, steps):
    """Sampled now and then while filling: the table built at the first sample is updated in
    place by each write (never rebuilt) and always equals a table built from scratch."""
    rng = random.Random(seed)
    sampler = NStepSampler(n_step, GAMMA)
    first_table = []

    def after_write(rb) -> None:
        if rng.random() < 0.5 and not first_table:
            return
        rb.sample(1)
        if not first_table:
            first_table.append(sampler._chain_table)
        assert sampler._chain_table is first_table[0], "the table was rebuilt, not updated"
        assert_table_matches_a_rebuild(sampler, rb.storage)

    rb, _ = fill(layout, rng, num_envs, 1, rows, steps, env_level=True, sampler=sampler,
                 after_write=after_write)
    rb.sample(1)
    assert_table_matches_a_rebuild(sampler, rb.storage)


def ones_ring(length: int = 4, steps: int = 4) -> EnvRingReplayBuffer:
    """One env, reward 1 per step, no episode end; ``obs`` = the step's position."""
    rb = EnvRingReplayBuffer(num_envs=1, max_length=length, sampler=NStepSampler(2, gamma=0.5),
                             generator=torch.Generator().manual_seed(0))
    for t in range(steps):
        rb.extend(step_td(t, reward=1.0))
    return rb


def step_td(t: int, reward: float) -> TensorDict:
    return TensorDict({"obs": torch.tensor([[float(t)]]), "next": {
        "obs": torch.tensor([[t + 1.0]]), "reward": torch.tensor([[reward]]),
        "done": torch.zeros(1, 1, dtype=torch.bool)}}, [1])


def rewards_by_start(rb) -> dict[int, float]:
    """Sampled n-step reward of each start position (draws until every stored start came up)."""
    found: dict[int, float] = {}
    for _ in range(50):
        data = rb.sample(len(rb))
        found.update((int(s), float(r)) for s, r in zip(data["index"][:, 1], data["next", "reward"][:, 0]))
        if len(found) == len(rb):
            return found
    raise AssertionError(f"only starts {sorted(found)} were drawn")


def test_a_write_the_sampler_was_not_told_about_rebuilds_the_table():
    rb = ones_ring()
    assert rewards_by_start(rb)[0] == 1.5  # 1 + 0.5 * 1
    table = rb.sampler._chain_table
    # Straight into the storage: no buffer, so no extend / mark_update report.
    rb.storage.set((torch.tensor([0]), torch.tensor([1])), step_td(1, reward=5.0))
    assert rewards_by_start(rb)[0] == 3.5  # 1 + 0.5 * 5
    assert rb.sampler._chain_table is not table


def test_mark_update_after_an_in_place_edit_updates_the_table():
    rb = ones_ring()
    rewards_by_start(rb)
    table = rb.sampler._chain_table
    revision = rb.storage._mutation_revision
    rb.storage.flat_leaf(("next", "reward"))[2] = 3.0  # position 2, edited in place: no revision bump
    assert rb.storage._mutation_revision == revision
    rb.mark_update(torch.tensor([[0, 2]]))
    got = rewards_by_start(rb)
    assert got[1] == 2.5 and got[2] == 3.5  # 1 + 0.5 * 3, then 3 + 0.5 * 1
    assert rb.sampler._chain_table is table
    # Two separate positions of one env (not one run of new steps): the general path.
    rewards = rb.storage.flat_leaf(("next", "reward"))
    rewards[0], rewards[3] = 4.0, 6.0
    rb.mark_update(torch.tensor([[0, 3], [0, 0]]))
    got = rewards_by_start(rb)
    assert got == {0: 4.5, 1: 2.5, 2: 6.0, 3: 6.0}
    assert rb.sampler._chain_table is table


def test_new_gamma_or_n_step_applies_at_the_next_sample():
    rb = ones_ring()
    assert rewards_by_start(rb)[0] == 1.5
    rb.sampler.gamma = 0.25
    assert rewards_by_start(rb)[0] == 1.25
    rb.sampler.n_step = 3
    assert rewards_by_start(rb)[0] == 1.3125  # 1 + 0.25 + 0.0625


def test_reset_and_load_rebuild_the_table():
    rb = ones_ring()
    rewards_by_start(rb)
    state = rb.state_dict()
    rb.clear()  # every env back to position 0
    for t in range(3):
        rb.extend(step_td(t, reward=2.0))
    assert rewards_by_start(rb)[0] == 3.0  # 2 + 0.5 * 2
    rb.load_state_dict(state)
    assert rewards_by_start(rb)[0] == 1.5


def test_the_table_is_not_pickled():
    rb = ones_ring()
    rewards_by_start(rb)
    assert "_chain_table" in rb.sampler.__dict__
    assert "_chain_table" not in pickle.loads(pickle.dumps(rb.sampler)).__dict__


def test_prioritized_nstep_sampler_keeps_its_table_current():
    sampler = PrioritizedNStepSampler(40, alpha=0.6, beta=0.4, n_step=3, gamma=0.5)
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(40, ndim=2), sampler=sampler)

    def block(t0: int) -> TensorDict:  # [2 envs, 3 steps]
        return TensorDict({"obs": torch.arange(t0, t0 + 6.0).reshape(2, 3, 1), "next": {
            "reward": torch.ones(2, 3, 1), "done": torch.zeros(2, 3, 1, dtype=torch.bool)}}, [2, 3])

    rb.extend(block(0))
    rb.sample(4)
    table = sampler._nstep._chain_table
    rb.extend(block(10))
    assert table.revision == rb.storage._mutation_revision
    assert_table_matches_a_rebuild(sampler._nstep, rb.storage)
    assert sampler._nstep._chain_table is table


def test_writes_never_reported_cost_at_most_one_rebuild_per_buffer_of_walks(monkeypatch):
    """A storage.set before every sample: the chains are walked (values stay right), and the
    table is rebuilt once the walks since the last build add up to the buffer's size."""
    import torchrl_ext.samplers.nstep as nstep_module

    builds = []

    class CountedTable(ChainTable):
        def __init__(self, *args, **kwargs) -> None:
            builds.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(nstep_module, "ChainTable", CountedTable)
    rb = ones_ring(length=64, steps=64)
    sampler, storage = rb.sampler, rb.storage
    sampler.sample(storage, 4)
    assert len(builds) == 1
    for t in range(64):  # 64 samples of 4 rows: 256 walked rows, 4 buffers' worth
        storage.set((torch.tensor([0]), torch.tensor([3])), step_td(3, reward=float(t)))
        (env, start, end), info = sampler.sample(storage, 4)
        for s, r in zip(start.tolist(), info[("next", "reward")][:, 0].tolist()):
            want = {2: 1 + 0.5 * t, 3: t + 0.5}.get(s, 1.5 if s < 63 else 1.0)
            assert r == want
    assert 2 <= len(builds) <= 1 + 256 // 64 + 1
    # Once the direct writes stop, the next rebuild is current again and stays so.
    for _ in range(20):
        sampler.sample(storage, 4)
    assert sampler._chain_table.current(streams_of(sampler, storage), sampler._chain_settings())


def test_shared_rings_are_walked_not_tabulated():
    rb = ones_ring()
    rb.storage.share_memory_()
    assert rewards_by_start(rb)[0] == 1.5
    assert "_chain_table" not in rb.sampler.__dict__
