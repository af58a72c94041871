"""Segment trees against ALF's vectors, a brute-force reference, and bad input."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._vectors import vectors_path
from torchrl_ext.samplers._priority_tree import PrioritySegmentTree
from torchrl_ext.segment_tree import MaxSegmentTree, MinSegmentTree, SumSegmentTree

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# (fanout, top_size): one searched level only, and several walked levels.
LAYOUTS = [(32, 32768), (2, 1), (4, 2), (8, 3)]


def brute_force_bound(leaves: np.ndarray, thresholds: np.ndarray) -> list[int]:
    """Smallest i with thr < prefix_i in float64, capped at the last non-zero leaf."""
    prefix = np.cumsum(leaves.astype(np.float64))
    nonzero = np.flatnonzero(leaves)
    last = int(nonzero[-1]) if len(nonzero) else 0
    return [min(int(np.searchsorted(prefix, t, side="right")), last) for t in thresholds]


def assert_valid_bound(leaves: np.ndarray, thresholds: np.ndarray, got: list[int]) -> None:
    """Each answer's float64 prefix interval holds its threshold, up to float32 rounding."""
    leaves = leaves.astype(np.float64)
    prefix = np.cumsum(leaves)
    total = prefix[-1] if len(prefix) else 0.0
    tol = 1e-6 * max(total, 1e-30)
    nonzero = np.flatnonzero(leaves)
    for thr, i in zip(thresholds, got):
        if total == 0:
            assert i == 0
            continue
        assert leaves[i] > 0, f"threshold {thr} landed on zero leaf {i}"
        below = prefix[i] - leaves[i]
        at_end = thr >= total - tol and i == nonzero[-1]
        assert at_end or below - tol <= thr < prefix[i] + tol, (thr, i, below, prefix[i])


def build(cls, capacity, updates, layout, **kwargs):
    fanout, top_size = layout
    tree = cls(capacity, fanout=fanout, top_size=top_size, **kwargs)
    for update in updates:
        tree[torch.tensor(update["indices"])] = torch.tensor(update["values"])
    return tree


# --------------------------------------------------------------------------- vectors
@pytest.fixture(scope="module")
def alf_trees():
    return json.loads(vectors_path("alf_segment_tree.json").read_text())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_alf_vectors_leaves_sum_max_nnz(alf_trees, layout):
    for case in alf_trees["cases"]:
        total = build(SumSegmentTree, case["capacity"], case["updates"], layout)
        biggest = build(MaxSegmentTree, case["capacity"], case["updates"], layout)
        np.testing.assert_array_equal(total.leaves.numpy(), np.float32(case["leaves"]))
        assert float(total.summary()) == pytest.approx(case["sum"], rel=1e-6)
        assert float(biggest.summary()) == case["max"]
        assert total.nnz == case["nnz"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_alf_vectors_find_sum_bound(alf_trees, layout):
    """Agrees with ALF except at thresholds that sit exactly on a float32 prefix sum."""
    disagreements = 0
    for case in alf_trees["cases"]:
        tree = build(SumSegmentTree, case["capacity"], case["updates"], layout)
        thresholds = np.float32(case["thresholds_f32"])
        got = tree.find_sum_bound(torch.from_numpy(thresholds)).tolist()
        leaves = np.float32(case["leaves"])
        if len(tree._sizes) == 1:  # one float64 prefix: exact
            assert got == brute_force_bound(leaves, thresholds.astype(np.float64))
        assert_valid_bound(leaves, thresholds, got)
        for thr, ours, alf in zip(thresholds, got, case["find_sum_bound"]):
            if ours != alf:
                disagreements += 1
                # A tie: the threshold equals a float32 running sum of the leaves.
                f32_prefix = np.cumsum(leaves, dtype=np.float32)
                assert np.isclose(f32_prefix, thr, rtol=2e-7, atol=0).any(), (thr, ours, alf)
    # The reference documents 16 such ties among its 162 thresholds.
    assert disagreements <= 16


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["edge_zeros_between", "edge_all_zero", "edge_threshold_eq_total"])
def test_alf_vector_edge_cases(alf_trees, layout, name):
    case = alf_trees[name]
    leaves = case["leaves"]
    tree = SumSegmentTree(len(leaves), fanout=layout[0], top_size=layout[1])
    tree[torch.arange(len(leaves))] = torch.tensor(leaves)
    pairs = [(t, e) for t, e in zip(case["thresholds"], case["find_sum_bound"]) if t >= 0]
    got = tree.find_sum_bound(torch.tensor([t for t, _ in pairs])).tolist()
    assert got == [e for _, e in pairs]


def test_negative_threshold_rejected_where_alf_returns_a_zero_leaf(alf_trees):
    leaves = alf_trees["edge_zeros_between"]["leaves"]
    tree = SumSegmentTree(len(leaves))
    tree[torch.arange(len(leaves))] = torch.tensor(leaves)
    with pytest.raises(ValueError, match="thresholds must lie in"):
        tree.find_sum_bound(torch.tensor([-1.0]))


# --------------------------------------------------------------------------- properties
@st.composite
def tree_scenarios(draw):
    capacity = draw(st.integers(1, 200))
    layout = draw(st.sampled_from([(2, 1), (4, 3), (8, 5), (32, 32768), (2, 7)]))
    updates = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 2 * capacity))
        idx = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
        vals = draw(
            st.lists(
                st.one_of(st.just(0.0), st.floats(0.0009765625, 100.0, width=32)),
                min_size=n,
                max_size=n,
            )
        )
        updates.append((idx, vals))
    return capacity, layout, updates


@settings(max_examples=100, deadline=None)
@given(tree_scenarios(), st.integers(0, 2**31 - 1))
def test_trees_match_brute_force(scenario, seed):
    capacity, (fanout, top_size), updates = scenario
    options = {"fanout": fanout, "top_size": top_size}
    total = SumSegmentTree(capacity, **options)
    lowest = MinSegmentTree(capacity, **options)
    highest = MaxSegmentTree(capacity, **options)
    fused = PrioritySegmentTree(capacity, track_max=True, **options)
    reference = np.zeros(capacity, dtype=np.float32)
    written = np.zeros(capacity, dtype=bool)
    for idx, vals in updates:
        for tree in (total, lowest, highest, fused):
            tree[torch.tensor(idx, dtype=torch.long)] = torch.tensor(vals, dtype=torch.float32)
        for i, v in zip(idx, vals):  # sequential writes: the last one wins
            reference[i] = v
            written[i] = True

    np.testing.assert_array_equal(total.leaves.numpy(), reference)
    assert total.nnz == int(np.count_nonzero(reference))
    assert float(total.summary()) == pytest.approx(float(reference.sum(dtype=np.float64)), rel=1e-6)
    assert float(lowest.summary()) == (reference[written].min() if written.any() else math.inf)
    assert float(highest.summary()) == (reference[written].max() if written.any() else -math.inf)
    positive = reference[reference > 0]
    assert fused.min_nonzero() == (positive.min() if len(positive) else math.inf)
    assert float(fused.max()) == reference.max()

    rng = np.random.default_rng(seed)
    grand_total = float(total.summary())
    thresholds = np.concatenate([rng.random(40) * grand_total, [0.0, grand_total]])
    got = total.find_sum_bound(torch.from_numpy(thresholds)).tolist()
    assert_valid_bound(reference, thresholds, got)
    if len(total._sizes) == 1:
        assert got == brute_force_bound(reference, thresholds)
    prefix = fused._top_prefix()
    exact_total = float(prefix[-1])  # the float64 total the sampler draws below
    if exact_total > 0:
        draws = torch.from_numpy(np.minimum(thresholds, np.nextafter(exact_total, 0)))
        index, value = fused._sample_walk(draws.double(), prefix)
        assert bool((value > 0).all())
        np.testing.assert_array_equal(value.numpy(), reference[index.numpy()])
        assert_valid_bound(reference, draws.numpy(), index.tolist())


def test_duplicate_indices_last_write_wins():
    tree = SumSegmentTree(10, fanout=2, top_size=1)
    tree[torch.tensor([3, 7, 3, 3, 7])] = torch.tensor([1.0, 2.0, 3.0, 0.0, 5.0])
    assert tree[torch.tensor([3, 7])].tolist() == [0.0, 5.0]
    assert tree.nnz == 1
    assert float(tree.summary()) == 5.0


def test_empty_update_is_a_no_op():
    tree = SumSegmentTree(4)
    tree[torch.tensor([1])] = torch.tensor([2.0])
    tree[torch.tensor([], dtype=torch.long)] = torch.tensor([])
    assert tree.leaves.tolist() == [0.0, 2.0, 0.0, 0.0]


def test_scalar_value_broadcasts_and_int_index():
    tree = MaxSegmentTree(5)
    tree[[0, 4]] = 2.5
    assert tree[4].item() == 2.5
    assert float(tree.summary()) == 2.5


def test_threshold_equal_to_total_in_a_deep_tree_gives_last_nonzero():
    tree = SumSegmentTree(100, fanout=2, top_size=1)
    tree[torch.arange(60)] = torch.full((60,), 0.1)
    assert tree.find_sum_bound(tree.summary()).item() == 59


def test_sample_walk_never_returns_a_zero_leaf_next_to_large_values():
    # Rounding-prone layout: tiny values after large ones in float32 rows.
    tree = PrioritySegmentTree(4096, fanout=32, top_size=8)
    values = torch.zeros(4096)
    values[::7] = 1e6
    values[3::97] = 1e-6
    tree[torch.arange(4096)] = values
    prefix = tree._top_prefix()
    total = float(prefix[-1])
    draws = torch.linspace(0, math.nextafter(total, 0), 20001, dtype=torch.float64)
    _, value = tree._sample_walk(draws, prefix)
    assert bool((value > 0).all())


@pytest.mark.parametrize("track_nnz", [True, False])
def test_state_dict_round_trip_restores_everything(track_nnz):
    tree = PrioritySegmentTree(1000, fanout=4, top_size=10, track_max=True, track_nnz=track_nnz)
    tree[torch.arange(0, 1000, 3)] = torch.rand(334) + 0.5
    clone = PrioritySegmentTree(1000, fanout=4, top_size=10, track_max=True, track_nnz=track_nnz)
    clone.load_state_dict(tree.state_dict())
    assert clone.nnz == tree.nnz == 334
    for mine, theirs in zip(clone._levels + clone._min_levels, tree._levels + tree._min_levels):
        assert torch.equal(mine, theirs)
    assert clone.min_nonzero() == tree.min_nonzero()
    thresholds = torch.rand(50, dtype=torch.float64) * float(tree.summary())
    assert torch.equal(clone.find_sum_bound(thresholds), tree.find_sum_bound(thresholds))


def test_load_state_dict_rejects_other_geometry():
    with pytest.raises(ValueError, match="capacity"):
        SumSegmentTree(10).load_state_dict(SumSegmentTree(11).state_dict())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_and_dtype(device, dtype):
    tree = PrioritySegmentTree(3000, device=device, dtype=dtype, fanout=8, top_size=16)
    tree[torch.tensor([5, 2999])] = torch.tensor([1.0, 3.0])
    assert tree.leaves.device.type == device and tree.leaves.dtype == dtype
    assert tree.find_sum_bound(torch.tensor([0.5, 1.0, 3.9])).tolist() == [5, 2999, 2999]
    assert tree.min_nonzero() == 1.0


def test_ten_million_leaves_fit_in_three_float32_arrays():
    capacity = 10_000_000
    tree = PrioritySegmentTree(capacity)
    index = torch.randint(0, capacity, (4096,))
    tree[index] = torch.rand(4096) + 0.1
    tree[torch.tensor([capacity - 1])] = torch.tensor([2.0])
    prefix = tree._top_prefix()
    draws = torch.rand(4096, dtype=torch.float64) * float(prefix[-1])
    found, value = tree._sample_walk(draws, prefix)
    assert bool((value > 0).all()) and int(found.max()) < capacity
    tree[torch.arange(capacity)] = torch.rand(capacity)  # a bulk write leaves no big scratch
    assert tree.nbytes() <= 3 * 4 * capacity


# --------------------------------------------------------------------------- bad input
BAD_WRITES = [
    (torch.tensor([0]), torch.tensor([-1.0]), ValueError, "finite values >= 0"),
    (torch.tensor([0]), torch.tensor([math.nan]), ValueError, "finite values >= 0"),
    (torch.tensor([0]), torch.tensor([math.inf]), ValueError, "finite values >= 0"),
    (torch.tensor([10]), torch.tensor([1.0]), ValueError, "out of range"),
    (torch.tensor([-1]), torch.tensor([1.0]), ValueError, "out of range"),
    (torch.tensor([0.0]), torch.tensor([1.0]), TypeError, "indices must hold integer leaf indices"),
    ([1.5], 1.0, TypeError, "indices must hold integer leaf indices, got dtype=torch.float32"),
    (np.array([2.7]), 1.0, TypeError, "indices must hold integer leaf indices, got dtype=torch.float64"),
    (np.array([True, False]), [1.0, 2.0], TypeError, "got dtype=torch.bool; .*mask.nonzero"),
    (1.5, 1.0, TypeError, "indices must hold integer leaf indices"),
    (torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]), ValueError, "one value per index"),
    (torch.tensor([0]), torch.tensor([True]), TypeError, "real numbers"),
]


@pytest.mark.parametrize("index,value,error,match", BAD_WRITES)
def test_bad_writes_raise_and_leave_the_tree_unchanged(index, value, error, match):
    tree = SumSegmentTree(10, fanout=2, top_size=1)
    tree[torch.tensor([0, 5])] = torch.tensor([1.0, 2.0])
    before = [level.clone() for level in tree._levels]
    with pytest.raises(error, match=match):
        tree[index] = value
    assert all(torch.equal(a, b) for a, b in zip(before, tree._levels))
    assert tree.nnz == 2


def test_min_tree_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        MinSegmentTree(3)[torch.tensor([0])] = torch.tensor([math.nan])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"capacity": 0}, ValueError, "capacity must be an int >= 1, got capacity=0"),
        ({"capacity": 2.0}, ValueError, "capacity must be an int >= 1, got capacity=2.0"),
        ({"capacity": 4, "fanout": 3}, ValueError, "power of two"),
        ({"capacity": 4, "fanout": 1}, ValueError, "fanout must be an int >= 2, got fanout=1"),
        ({"capacity": 4, "dtype": torch.int32}, TypeError, "floating"),
    ],
)
def test_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        SumSegmentTree(**kwargs)


@pytest.mark.parametrize("bad", ["False", 2, 0, None, torch.tensor(True)])
def test_track_nnz_must_be_a_bool(bad):
    # bool("False") is True: a coerced flag would pay the per-write count the caller turned off.
    with pytest.raises(TypeError, match=rf"track_nnz must be True or False, got track_nnz={re.escape(repr(bad))}\."):
        SumSegmentTree(4, track_nnz=bad)


@pytest.mark.parametrize("threshold", [-0.5, 3.5, math.nan])
def test_thresholds_outside_the_total_are_rejected(threshold):
    tree = SumSegmentTree(3)
    tree[torch.tensor([0, 1])] = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="thresholds must lie in"):
        tree.find_sum_bound(torch.tensor([threshold]))


def test_max_requires_track_max():
    with pytest.raises(RuntimeError, match="track_max=True"):
        PrioritySegmentTree(4).max()


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_priority_tree_numpy_writes_equal_the_torch_writes(layout, data):
    """CPU writes go through numpy views; the torch path (other devices) must give the same tree."""
    fanout, top_size = layout
    capacity = data.draw(st.integers(1, 300))
    trees = [PrioritySegmentTree(capacity, track_max=True, fanout=fanout, top_size=top_size) for _ in range(2)]
    trees[1]._numpy_levels = lambda: None  # the torch path, as off the CPU
    values = st.floats(0.0, 1e3, width=32) | st.just(0.0)
    for _ in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.integers(1, 2 * capacity))
        index = torch.tensor(data.draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n)))
        value = torch.tensor(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=torch.float32)
        for tree in trees:
            tree[index] = value
    assert trees[0]._numpy_cache._columns is not None  # the numpy path ran
    numpy_tree, torch_tree = trees
    assert torch.equal(numpy_tree.leaves, torch_tree.leaves)
    assert numpy_tree.nnz == torch_tree.nnz == int(torch.count_nonzero(torch_tree.leaves))
    for mine, theirs in zip(numpy_tree._levels, torch_tree._levels):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=0.0)
    for mine, theirs in zip(numpy_tree._min_levels + numpy_tree._max_levels,
                            torch_tree._min_levels + torch_tree._max_levels):
        assert torch.equal(mine, theirs)
    assert numpy_tree.min_nonzero() == torch_tree.min_nonzero()


def test_priority_tree_numpy_views_follow_to_load_and_pickling():
    import pickle

    tree = PrioritySegmentTree(100, fanout=4, top_size=8, track_max=True)
    tree[torch.arange(100)] = torch.arange(1.0, 101.0)
    copy = pickle.loads(pickle.dumps(tree))
    copy[torch.tensor([5, 5])] = torch.tensor([0.0, 500.0])  # last write wins
    assert float(copy.summary()) == 5050.0 - 6.0 + 500.0 and float(tree.summary()) == 5050.0
    assert float(copy.max()) == 500.0 and copy.leaves[5] == 500.0 and tree.leaves[5] == 6.0
    fresh = PrioritySegmentTree(100, fanout=4, top_size=8, track_max=True)
    fresh[torch.tensor([0])] = torch.tensor([1.0])  # builds the views
    fresh.load_state_dict(copy.state_dict())
    fresh[torch.tensor([7])] = torch.tensor([0.5])
    assert float(fresh.summary()) == 5050.0 - 6.0 + 500.0 - 8.0 + 0.5
    assert fresh.min_nonzero() == 0.5 and fresh.nnz == 100
    moved = fresh.to("cpu")  # replaces the tensors: the views must be rebuilt
    moved[torch.tensor([7])] = torch.tensor([0.25])
    assert moved.min_nonzero() == 0.25 and float(moved.leaves[7]) == 0.25


def test_priority_tree_numpy_writes_keep_the_last_of_repeats_without_per_leaf_scratch():
    """Small CPU updates resolve repeated indices by sorting the update, not with a
    capacity-sized ticket array: after them the tree holds no per-leaf scratch."""
    tree = PrioritySegmentTree(1000, fanout=4, top_size=8)
    tree[torch.tensor([3, 7, 3, 9, 7, 3])] = torch.tensor([1.0, 2.0, 0.0, 4.0, 5.0, 6.0])
    assert ("tickets", torch.int32) not in tree._scratch_buffers
    assert tree.leaves[[3, 7, 9]].tolist() == [6.0, 5.0, 4.0]
    assert float(tree.summary()) == 15.0 and tree.nnz == 3 and tree.min_nonzero() == 4.0
    tree[torch.tensor([9, 9])] = torch.tensor([0.5, 0.0])  # the last write (a zero) wins
    assert tree.leaves[9] == 0.0 and tree.nnz == 2 and tree.min_nonzero() == 5.0


def test_tree_writes_accept_values_with_autograd_history():
    tree = SumSegmentTree(4)
    tree[torch.tensor([0, 2])] = torch.tensor([1.0, 2.0], requires_grad=True)
    assert float(tree.summary()) == 3.0
    with pytest.raises(ValueError, match="finite"):
        tree[torch.tensor([1])] = torch.tensor([math.nan], requires_grad=True)
    assert float(tree.summary()) == 3.0  # unchanged after the error


@pytest.mark.parametrize("name", ["MinSegmentTree", "MaxSegmentTree"])
def test_min_max_trees_store_plain_values(name):
    tree = {"MinSegmentTree": MinSegmentTree, "MaxSegmentTree": MaxSegmentTree}[name](4)
    tree[torch.tensor([0, 2])] = torch.tensor([1.0, 2.0], requires_grad=True)
    assert not tree.leaves.requires_grad and tree.summary().grad_fn is None


# --------------------------------------------------------------------------- rejection draws
# 99.9% quantile of the chi-square distribution with 29 degrees of freedom.
CHI2_999_29 = 58.301


def skewed_rows(capacity: int = 40) -> torch.Tensor:
    """Leaves 1, ..., 40 with the first of every row of 4 set to zero: 30 non-zero
    leaves from 2 to 40 in rows summing to 9, 21, ..., 117."""
    values = torch.arange(1.0, capacity + 1.0)
    values[torch.arange(0, capacity, 4)] = 0.0  # a zero leaf at the start of every row
    return values


@pytest.mark.parametrize("layout", [(32, 32768), (4, 8)], ids=["leaves proposed", "rows proposed"])
def test_draw_by_rejection_frequencies_follow_the_leaves(layout):
    fanout, top_size = layout
    values = skewed_rows()
    tree = PrioritySegmentTree(40, fanout=fanout, top_size=top_size)
    tree[torch.arange(40)] = values
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(40)
    for _ in range(100):
        drawn = tree.draw_by_rejection(256, generator)
        assert drawn is not None
        index, value = drawn
        assert index.dtype == torch.long and torch.equal(value, tree[index])
        counts += torch.bincount(index, minlength=40)
    assert counts[values == 0].sum() == 0  # zero leaves are never drawn
    expected = values[values > 0] / values.sum() * counts.sum()
    chi_square = float(((counts[values > 0] - expected) ** 2 / expected).sum())
    assert chi_square < CHI2_999_29


def test_draw_by_rejection_declines_where_a_walk_is_cheaper_or_nothing_can_be_drawn():
    generator = torch.Generator().manual_seed(0)
    tree = PrioritySegmentTree(1000, fanout=4, top_size=8)
    assert tree.draw_by_rejection(8, generator) is None  # every leaf zero
    tree[torch.arange(1000)] = torch.full((1000,), 1e-3)
    tree[torch.tensor([500])] = torch.tensor([1e3])  # one row outweighs all: few proposals accepted
    assert tree.draw_by_rejection(256, generator) is None
    tree[torch.tensor([500])] = torch.tensor([1e-3])
    index, _ = tree.draw_by_rejection(256, generator)
    assert index.shape == (256,) and bool(((index >= 0) & (index < 1000)).all())


def test_draw_by_rejection_declines_a_share_that_rounds_up_to_its_rows_sum(monkeypatch):
    """Uniform draws just below 1: every proposal is accepted, but each share, rounded to
    float32, equals its row's sum, so no child exceeds it. Taking the first child then
    would bias the draw; the tree declines and the sampler walks."""
    tree = PrioritySegmentTree(64, fanout=4, top_size=8)
    tree[torch.arange(64)] = torch.ones(64)
    almost_one = 1.0 - 2.0**-30
    monkeypatch.setattr(torch, "rand", lambda n, **kwargs: torch.full((n,), almost_one, dtype=torch.float64))
    assert tree.draw_by_rejection(16) is None


def test_draw_by_rejection_declines_a_batch_of_proposals_that_falls_short(monkeypatch):
    """Uniform draws just below 1 propose only the last row, whose sum is half the
    largest: no proposal is accepted, and the tree declines rather than return fewer."""
    tree = PrioritySegmentTree(64, fanout=4, top_size=8)
    tree[torch.arange(64)] = torch.cat([torch.ones(60), torch.full((4,), 0.5)])
    almost_one = 1.0 - 2.0**-30
    monkeypatch.setattr(torch, "rand", lambda n, **kwargs: torch.full((n,), almost_one, dtype=torch.float64))
    assert tree.draw_by_rejection(16) is None


# ---------------------------------------------------------------------------
# Loading a damaged state: refused before anything changes.


def _damaged_states():
    tree = SumSegmentTree(100, fanout=4, top_size=8)
    tree[torch.arange(100)] = torch.arange(100, dtype=torch.float32)
    good = tree.state_dict()

    def edited(edit):
        state = {**good, "levels": [level.clone() for level in good["levels"]]}
        edit(state["levels"])
        return state

    def set_(k, i, value):
        def edit(levels):
            levels[k][i] = value
        return edit

    return good, {
        "nan leaf": (edited(set_(0, 3, math.nan)), "leaves are not values this tree holds"),
        "negative leaf": (edited(set_(0, 3, -1.0)), "leaves are not values this tree holds"),
        "inconsistent parent": (edited(set_(1, 0, 1e6)), "level 1 does not match the level below it"),
        "nan parent": (edited(set_(2, 0, math.nan)), "level 2 does not match the level below it"),
        "padding": (edited(set_(0, 101, 5.0)), "padding leaves .* must all be 0"),
        # Was: copy_ broadcast a one-element level over the whole level.
        "broadcastable shape": ({**good, "levels": [torch.ones(1)] + good["levels"][1:]},
                                r"level 0 must be a floating tensor of shape \(\d+,\)"),
        "missing level": ({**good, "levels": good["levels"][:-1]}, "must be a list of"),
        "integer level": ({**good, "levels": [good["levels"][0].long()] + good["levels"][1:]},
                          "level 0 must be a floating tensor"),
    }


@pytest.mark.parametrize("case", sorted(_damaged_states()[1]))
def test_a_damaged_state_is_refused_and_the_tree_is_unchanged(case):
    good, cases = _damaged_states()
    state, match = cases[case]
    tree = SumSegmentTree(100, fanout=4, top_size=8)
    tree[torch.tensor([5, 7])] = torch.tensor([2.0, 3.0])
    before = [level.clone() for level in tree._levels]
    with pytest.raises(ValueError, match=match):
        tree.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(before, tree._levels))
    tree.load_state_dict(good)
    assert float(tree.summary()) == sum(range(100))


def test_a_priority_tree_rebuilds_its_minimum_and_maximum_from_the_leaves():
    source = PrioritySegmentTree(50, track_max=True, fanout=4, top_size=4)
    source[torch.arange(50)] = torch.linspace(1.0, 5.0, 50)
    state = source.state_dict()
    state["min_levels"] = [torch.zeros_like(level) for level in state["min_levels"]]  # ignored
    tree = PrioritySegmentTree(50, track_max=True, fanout=4, top_size=4)
    tree.load_state_dict(state)
    assert tree.min_nonzero() == 1.0 and float(tree.max()) == 5.0
    with pytest.raises(ValueError, match="built with track_max=False"):
        PrioritySegmentTree(50, fanout=4, top_size=4).load_state_dict(state)


@pytest.mark.parametrize("cls", [SumSegmentTree, MinSegmentTree, MaxSegmentTree, PrioritySegmentTree])
@pytest.mark.parametrize("inside_first", [True, False])
def test_reused_buffers_work_inside_and_outside_inference_mode(cls, inside_first):
    # _last_write's tickets and the walks' scratch buffers are made on the first call:
    # made inside inference_mode() they must still be writable outside it, and vice versa.
    tree = cls(1000, fanout=4)
    reference = tree.leaves.numpy().copy()  # the neutral element
    for step, inside in enumerate([inside_first, not inside_first]):
        index = torch.arange(step, 1000, 7)
        values = torch.full((index.numel(),), 1.0 + step)
        with torch.inference_mode(inside):
            tree[index] = values
            tree._write(index, values)  # the torch path (PrioritySegmentTree writes small batches with numpy)
            if isinstance(tree, SumSegmentTree):
                found = tree.find_sum_bound(torch.tensor([0.5, 3.5]))
        reference[index.numpy()] = 1.0 + step
        if isinstance(tree, SumSegmentTree):  # first leaf whose inclusive prefix sum exceeds each bound
            expected = [int(np.argmax(np.cumsum(reference) > b)) for b in (0.5, 3.5)]
            assert found.tolist() == expected
    assert tree.leaves.tolist() == reference.tolist()
