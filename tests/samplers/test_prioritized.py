"""PrioritizedSampler: TorchRL integration, sampling law, weights, priorities, checkpoints."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.scheduler import LinearScheduler

from torchrl_ext.samplers import (
    PrioritizedNStepSampler,
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
)
from torchrl_ext.storages import FastTensorStorage

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# 99.9% quantiles of the chi-square distribution, by degrees of freedom.
CHI2_999 = {4: 18.467, 9: 27.877, 10: 29.588}


class FullStorage:
    """Minimal stand-in for a storage holding ``n`` items (1-D)."""

    ndim = 1
    device = torch.device("cpu")

    def __init__(self, n: int) -> None:
        self.n = n
        self.shape = torch.Size([n])

    def __len__(self) -> int:
        return self.n


def filled_sampler(priorities, alpha=1.0, beta=0.5, eps=0.0, cls=PrioritizedSampler, **kwargs):
    sampler = cls(len(priorities), alpha, beta, eps, **kwargs)
    sampler.update_priority(torch.arange(len(priorities)), torch.tensor(priorities))
    return sampler


def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# --------------------------------------------------------------------------- integration
def test_is_a_torchrl_prioritized_sampler_and_works_in_its_buffer():
    sampler = PrioritizedSampler(100, alpha=0.7, beta=0.5)
    assert isinstance(sampler, TorchRLPrioritizedSampler)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), sampler=sampler, batch_size=16, priority_key="td_error"
    )
    rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
    batch = rb.sample()
    assert batch["priority_weight"].shape == (16,)
    assert torch.equal(batch["obs"], batch["index"].float())
    batch["td_error"] = batch["index"].float() * 10
    rb.update_tensordict_priority(batch)  # TorchRL's write-back path, unchanged
    stored = sampler.tree[batch["index"]]
    torch.testing.assert_close(stored, (batch["td_error"] + sampler.eps) ** 0.7)


def test_replacement_false_raises_as_in_torchrl():
    """No silent switch to the stratified sampler: TorchRL's PrioritizedSampler refuses it too."""
    for cls in (PrioritizedSampler, TorchRLPrioritizedSampler):
        with pytest.raises(TypeError, match="PrioritizedSampler has no without-replacement variant"):
            cls(10, alpha=0.5, beta=0.5, replacement=False)
    assert type(PrioritizedSampler(10, 0.5, 0.5, replacement=True)) is PrioritizedSampler
    assert type(PrioritizedSamplerWithoutReplacement(10, 0.5, 0.5)) is PrioritizedSamplerWithoutReplacement


# --------------------------------------------------------------------------- sampling law
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_frequencies_follow_priorities_to_the_alpha(device, alpha):
    priorities = torch.tensor([1.0, 2.0, 3.0, 0.5, 8.0, 1.0, 4.0, 2.5, 0.25, 6.0])
    sampler = filled_sampler(priorities.tolist(), alpha=alpha, eps=1e-8, device=device)
    sampler._rng = torch.Generator(device=device).manual_seed(0)
    counts = torch.zeros(10)
    for _ in range(40):
        index, _ = sampler.sample(FullStorage(10), 500)
        counts += torch.bincount(index.cpu(), minlength=10)
    expected = (priorities + 1e-8) ** alpha
    assert chi_square(counts, expected / expected.sum()) < CHI2_999[9]


@pytest.mark.parametrize("skewed", [False, True], ids=["rows drawn by rejection", "walked"])
def test_frequencies_in_a_two_level_tree_by_rejection_and_by_walk(skewed, monkeypatch):
    """40,000 items (a tree with a level above the leaves) in ten blocks with priorities
    1..10. With ``skewed``, item 123 (its own group 10) is so large that rejection would
    accept too few proposals, and the sampler walks the tree instead."""
    n, blocks = 40_000, 10
    priorities = torch.arange(1.0, blocks + 1).repeat_interleave(n // blocks)
    group = torch.arange(n) // (n // blocks)
    if skewed:
        priorities[123], group[123] = 1e9, blocks
    sampler = filled_sampler(priorities.tolist(), alpha=0.7)
    sampler._rng = torch.Generator().manual_seed(0)
    tree = sampler.tree
    assert len(tree._levels) > 1
    walks = []
    walk = tree._sample_walk
    monkeypatch.setattr(tree, "_sample_walk", lambda *args: walks.append(1) or walk(*args))
    counts = torch.zeros(blocks + 1)
    for _ in range(40):
        index, _ = sampler.sample(FullStorage(n), 256)
        counts += torch.bincount(group[index], minlength=blocks + 1)
    assert len(walks) == (40 if skewed else 0)
    mass = torch.zeros(blocks + 1, dtype=torch.float64).index_add_(0, group, priorities.double() ** 0.7)
    seen = mass > 0
    assert counts[~seen].sum() == 0
    assert chi_square(counts[seen], (mass[seen] / mass.sum()).float()) < CHI2_999[int(seen.sum()) - 1]


def test_stratified_sampling_covers_uniform_items_once_each():
    sampler = filled_sampler([1.0] * 64, cls=PrioritizedSamplerWithoutReplacement)
    index, _ = sampler.sample(FullStorage(64), 64)
    assert sorted(index.tolist()) == list(range(64))


def test_stratified_sampling_follows_priorities():
    priorities = torch.tensor([1.0, 4.0, 2.0, 8.0, 1.0])
    sampler = filled_sampler(priorities.tolist(), cls=PrioritizedSamplerWithoutReplacement)
    sampler._rng = torch.Generator().manual_seed(1)
    counts = torch.zeros(5)
    for _ in range(200):
        counts += torch.bincount(sampler.sample(FullStorage(5), 32)[0], minlength=5)
    assert chi_square(counts, priorities / priorities.sum()) < CHI2_999[4]


def test_zero_priority_items_are_never_sampled():
    sampler = filled_sampler([0.0, 1.0, 0.0, 2.0])
    index, info = sampler.sample(FullStorage(4), 2000)
    assert set(index.tolist()) == {1, 3}
    assert bool(torch.isfinite(info["priority_weight"]).all())


# --------------------------------------------------------------------------- weights
def test_per_weights_by_hand():
    # stored (p + 0) ** 1 = p; p_min = 1; w = (p / p_min) ** -beta.
    sampler = filled_sampler([1.0, 2.0, 4.0], alpha=1.0, beta=0.5)
    index, info = sampler.sample(FullStorage(3), 300)
    expected = {0: 1.0, 1: 2.0**-0.5, 2: 0.5}
    for i, w in zip(index.tolist(), info["priority_weight"].tolist()):
        assert w == pytest.approx(expected[i])


def test_per_weights_equal_the_normalised_textbook_formula():
    priorities = torch.tensor([0.3, 1.7, 2.2, 5.0])
    alpha, beta = 0.6, 0.4
    sampler = filled_sampler(priorities.tolist(), alpha=alpha, beta=beta)
    index, info = sampler.sample(FullStorage(4), 100)
    probs = priorities**alpha / (priorities**alpha).sum()
    textbook = (4 * probs) ** -beta
    textbook = textbook / textbook.max()
    torch.testing.assert_close(info["priority_weight"], textbook[index])


def test_alf_weights_by_hand():
    # ALF: stored priority * nnz / total = p * 3 / 7 (one leaf is zero).
    sampler = filled_sampler([1.0, 0.0, 2.0, 4.0], weights="alf")
    index, info = sampler.sample(FullStorage(4), 200)
    for i, w in zip(index.tolist(), info["priority_weight"].tolist()):
        assert w == pytest.approx([1.0, 0.0, 2.0, 4.0][i] * 3 / 7)


# --------------------------------------------------------------------------- priorities
def test_new_data_gets_the_max_priority_and_at_least_initial_priority():
    sampler = PrioritizedSampler(10, alpha=1.0, beta=0.4, eps=0.0, initial_priority=2.0)
    assert sampler.default_priority == 2.0
    sampler.update_priority(torch.tensor([0]), torch.tensor([5.0]))
    assert sampler.default_priority == 5.0
    sampler.mark_update(torch.tensor([1, 2]))
    assert sampler.tree[torch.tensor([1, 2])].tolist() == [5.0, 5.0]
    sampler.update_priority(torch.tensor([0]), torch.tensor([0.5]))
    assert sampler.default_priority == 5.0  # the max ever seen


def test_max_priority_within_buffer_drops_when_the_max_is_overwritten():
    sampler = PrioritizedSampler(
        10, alpha=0.5, beta=0.4, eps=0.0, max_priority_within_buffer=True, initial_priority=0.1
    )
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([9.0, 3.0]))
    assert sampler.default_priority == pytest.approx(9.0)
    sampler.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    assert sampler.default_priority == pytest.approx(3.0)


@pytest.mark.parametrize("reduction,expected", [("max", 4.0), ("mean", 2.5), ("sum", 10.0), ("min", 1.0)])
def test_per_agent_priorities_are_reduced(reduction, expected):
    sampler = PrioritizedSampler(5, alpha=1.0, beta=0.4, eps=0.0, reduction=reduction)
    sampler.update_priority(torch.tensor([2]), torch.tensor([[1.0, 4.0, 2.0, 3.0]]))
    assert sampler.tree[torch.tensor([2])].item() == pytest.approx(expected)


def test_per_agent_priorities_through_the_buffer_extend_path():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8),
        sampler=PrioritizedSampler(8, alpha=1.0, beta=0.4, eps=0.0),
        priority_key="td_error",
    )
    data = TensorDict({"obs": torch.zeros(3, 2), "td_error": torch.tensor([[1.0, 5.0]] * 3)}, [3])
    rb.extend(data)  # TorchRL passes the raw [3, 2] priority; the sampler reduces it
    assert rb.sampler.tree[torch.arange(3)].tolist() == [5.0, 5.0, 5.0]


def test_minus_one_indices_are_skipped():
    sampler = PrioritizedSampler(4, alpha=1.0, beta=0.4, eps=0.0)
    sampler.update_priority(torch.tensor([-1, 2, -1]), torch.tensor([7.0, 3.0, 9.0]))
    assert sampler.tree.leaves.tolist() == [0.0, 0.0, 3.0, 0.0]


def test_multi_dimensional_storage_coordinates():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(12, ndim=2),
        sampler=PrioritizedSampler(12, alpha=1.0, beta=0.4, eps=0.0),
        batch_size=6,
    )
    rb.extend(TensorDict({"obs": torch.arange(12.0).reshape(3, 4)}, [3, 4]))
    batch = rb.sample()
    assert batch["index"].shape == (6, 2)
    rb.update_priority(torch.tensor([[1, 2]]), torch.tensor([10.0]))
    rows, columns = rb.storage.shape  # TorchRL extends 2-d storages along dim 1
    assert (rows, columns) == (4, 3)
    assert rb.sampler.tree[torch.tensor([1 * columns + 2])].item() == 10.0


# --------------------------------------------------------------------------- schedules
def test_beta_is_schedulable_with_torchrl_schedulers():
    sampler = PrioritizedSampler(10, alpha=0.6, beta=0.4)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    scheduler = LinearScheduler(rb, "beta", final_value=1.0, num_steps=3)
    for _ in range(3):
        scheduler.step()
    assert sampler.beta == pytest.approx(1.0)


def test_changing_alpha_retransforms_stored_priorities():
    sampler = filled_sampler([1.0, 4.0, 9.0], alpha=1.0, eps=0.0)
    sampler.alpha = 0.5
    assert sampler.tree.leaves.tolist() == pytest.approx([1.0, 2.0, 3.0])
    assert sampler.tree.min_nonzero() == pytest.approx(1.0)


# --------------------------------------------------------------------------- checkpoints
def _stream(sampler, n=5, batch=8):
    sampler._rng = torch.Generator().manual_seed(123)
    out = []
    for step in range(n):
        index, info = sampler.sample(FullStorage(sampler.max_size), batch)
        sampler.update_priority(index, torch.arange(batch, dtype=torch.float32) + step)
        out.append((index, info["priority_weight"]))
    return out


@pytest.mark.parametrize("weights", ["per", "alf"])
@pytest.mark.parametrize("within", [False, True])
def test_state_dict_round_trip_reproduces_the_stream(weights, within):
    kwargs = {"weights": weights, "max_priority_within_buffer": within}
    original = filled_sampler(torch.rand(50).add(0.1).tolist(), alpha=0.7, beta=0.3, **kwargs)
    restored = PrioritizedSampler(50, 0.1, 0.9, **kwargs)
    restored.load_state_dict(original.state_dict())
    assert restored.default_priority == original.default_priority
    for (i1, w1), (i2, w2) in zip(_stream(original), _stream(restored)):
        assert torch.equal(i1, i2) and torch.equal(w1, w2)


def test_dumps_loads_round_trip(tmp_path):
    original = filled_sampler(torch.rand(3000).tolist(), alpha=0.6, beta=0.4, weights="alf")
    original.dumps(tmp_path / "sampler")
    assert {p.name for p in (tmp_path / "sampler").iterdir()} == {
        "trees.safetensors",
        "sampler_metadata.json",
    }
    restored = PrioritizedSampler(3000, 0.6, 0.4, weights="alf")
    restored.loads(tmp_path / "sampler")
    assert restored.tree.nnz == original.tree.nnz
    for (i1, w1), (i2, w2) in zip(_stream(original), _stream(restored)):
        assert torch.equal(i1, i2) and torch.equal(w1, w2)


def test_load_state_dict_rejects_mismatched_samplers():
    state = PrioritizedSampler(10, 0.5, 0.5, weights="alf").state_dict()
    with pytest.raises(ValueError, match="weights='alf'"):
        PrioritizedSampler(10, 0.5, 0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="max_capacity=11"):
        PrioritizedSampler(11, 0.5, 0.5, weights="alf").load_state_dict(state)


def test_empty_resets_the_trees():
    sampler = filled_sampler([1.0, 2.0])
    sampler._empty()
    assert float(sampler.tree.summary()) == 0.0
    assert sampler.default_priority == 1.0


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "priority,match",
    [
        (torch.tensor([-1.0, 1.0]), "finite and >= 0"),
        (torch.tensor([math.nan, 1.0]), "finite and >= 0"),
        (torch.tensor([math.inf, 1.0]), "finite and >= 0"),
        (torch.tensor([1.0, 2.0, 3.0]), "does not match 2 indices"),
    ],
)
def test_bad_priorities_raise_and_leave_the_trees_unchanged(priority, match):
    sampler = filled_sampler([1.0, 2.0, 3.0])
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=match):
        sampler.update_priority(torch.tensor([0, 1]), priority)
    after = sampler.state_dict()
    for old, new in zip(before["_sum_tree"]["levels"], after["_sum_tree"]["levels"]):
        assert torch.equal(old, new)
    assert sampler.default_priority == before["_max_seen"]


@pytest.mark.parametrize("index", [torch.tensor([3]), torch.tensor([-2])])
def test_index_out_of_range(index):
    with pytest.raises(ValueError, match="out of range"):
        filled_sampler([1.0, 2.0, 3.0]).update_priority(index, torch.tensor([1.0]))


def test_float_index_is_a_type_error():
    with pytest.raises(TypeError, match="index must hold integers"):
        filled_sampler([1.0]).update_priority(torch.tensor([0.0]), torch.tensor([1.0]))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"alpha": -0.1}, ValueError, "alpha must be >= 0"),
        ({"beta": -0.1}, ValueError, r"beta must be >= 0\.0, got beta=-0\.1"),
        ({"beta": math.nan}, ValueError, r"beta must be >= 0\.0, got beta=nan"),
        ({"eps": -1.0}, ValueError, "eps must be >= 0"),
        ({"weights": "nope"}, ValueError, "weights must be one of"),
        ({"reduction": "prod"}, ValueError, "reduction must be one of"),
        ({"max_capacity": 0}, ValueError, "max_capacity must be an int >= 1, got max_capacity=0"),
        ({"dtype": torch.float16}, TypeError, "float32 or torch.float64"),
        # Was bool(...): the string "False" turned the option on.
        ({"max_priority_within_buffer": "False"}, TypeError,
         "max_priority_within_buffer must be True or False, got max_priority_within_buffer='False'"),
        ({"max_priority_within_buffer": 1}, TypeError, "max_priority_within_buffer must be True or False"),
    ],
)
def test_bad_construction(kwargs, error, match):
    arguments = {"max_capacity": 10, "alpha": 0.5, "beta": 0.5} | kwargs
    with pytest.raises(error, match=match):
        PrioritizedSampler(**arguments)


def test_bad_schedule_values_raise():
    sampler = PrioritizedSampler(10, 0.5, 0.5)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        sampler.beta = -2.0
    with pytest.raises(ValueError, match="alpha must be"):
        sampler.alpha = -1.0
    assert (sampler.alpha, sampler.beta) == (0.5, 0.5)


def test_sampling_an_empty_storage_raises():
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        PrioritizedSampler(10, 0.5, 0.5).sample(FullStorage(0), 4)


def test_sampling_when_every_priority_is_zero_raises():
    with pytest.raises(RuntimeError, match="every stored priority is zero"):
        filled_sampler([0.0, 0.0]).sample(FullStorage(2), 4)


@pytest.mark.parametrize("batch_size", [0, -3, 2.5])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match=f"batch_size must be an int >= 1, got batch_size={batch_size}"):
        filled_sampler([1.0]).sample(FullStorage(1), batch_size)


# ---------------------------------------------------------------------------
# Bounded sampling: no draw of an item that is not stored now.


def _buffer(storage, capacity=100, **kwargs):
    return TensorDictReplayBuffer(
        storage=storage, sampler=PrioritizedSampler(capacity, 0.6, 0.4, **kwargs), batch_size=64
    )


def _rows(values):
    values = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"obs": values}, [len(values)])


STORAGES_1D = [LazyTensorStorage, FastTensorStorage]


@pytest.mark.parametrize("storage_cls", STORAGES_1D)
def test_write_back_for_an_item_not_stored_is_refused_and_writes_nothing(storage_cls):
    # Was accepted: index 50 of a 10-item buffer got the largest priority, and later
    # draws returned never-written memory.
    rb = _buffer(storage_cls(100))
    rb.extend(_rows(range(10)))
    leaves = rb.sampler.tree.leaves.clone()
    with pytest.raises(ValueError, match=r"index 50 is not stored: the storage holds 10 items"):
        rb.update_priority(torch.tensor([3, 50]), torch.tensor([1.0, 1e6]))
    assert torch.equal(rb.sampler.tree.leaves, leaves)
    assert int(rb.sample()["index"].max()) < 10


@pytest.mark.parametrize("storage_cls", STORAGES_1D)
def test_write_back_of_a_batch_sampled_before_empty_is_refused(storage_cls):
    rb = _buffer(storage_cls(100))
    rb.extend(_rows(range(40)))
    old = rb.sample()
    rb.empty()
    rb.extend(_rows([-1.0, -2.0, -3.0]))
    old["td_error"] = torch.full((64,), 1e6)
    if int(old["index"].max()) >= 3:
        with pytest.raises(ValueError, match="is not stored: the storage holds 3 items"):
            rb.update_tensordict_priority(old)
    batch = rb.sample()
    assert int(batch["index"].max()) < 3
    assert set(batch["obs"].tolist()) <= {-1.0, -2.0, -3.0}  # never a row from before empty()


@settings(max_examples=40, deadline=None)
@given(
    stored=st.integers(1, 30),
    writes=st.lists(st.tuples(st.integers(0, 31), st.floats(0.0, 1e6)), min_size=1, max_size=20),
    stratified=st.booleans(),
)
def test_standalone_priorities_of_unstored_items_are_never_drawn(stored, writes, stratified):
    # Without storage= the sampler cannot refuse the write; its sample() zeroes those
    # priorities instead, whatever the order of writes and draws.
    cls = PrioritizedSamplerWithoutReplacement if stratified else PrioritizedSampler
    sampler = cls(32, alpha=1.0, beta=0.5)
    sampler.update_priority(torch.arange(stored), torch.ones(stored))
    for index, priority in writes:
        sampler.update_priority(torch.tensor([index]), torch.tensor([priority]))
        index, _ = sampler.sample(FullStorage(stored), 16)
        assert int(index.max()) < stored


def test_a_loaded_state_with_priorities_past_the_stored_items_is_bounded_too():
    source = filled_sampler([1.0] * 20)
    sampler = PrioritizedSampler(20, 1.0, 0.5, 0.0)
    sampler.load_state_dict(source.state_dict())
    index, _ = sampler.sample(FullStorage(5), 256)
    assert int(index.max()) < 5


def test_prioritized_nstep_on_a_time_env_grid_draws_stored_cells_only():
    # Was: a priority written for an unfilled cell made every draw come back as cell (0, 0).
    sampler = PrioritizedNStepSampler(40, alpha=1.0, beta=0.5, n_step=2, gamma=0.5)
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(40, ndim=2), sampler=sampler, batch_size=64)
    envs, steps = 4, 3
    rb.extend(TensorDict({
        "obs": torch.arange(envs * steps, dtype=torch.float32).reshape(envs, steps),
        "next": {"obs": torch.zeros(envs, steps), "reward": torch.ones(envs, steps, 1),
                 "done": torch.zeros(envs, steps, 1, dtype=torch.bool)},
    }, [envs, steps]))
    with pytest.raises(ValueError, match="index 30 is not stored: the storage holds 12 items"):
        rb.update_priority(torch.tensor([30]), torch.tensor([1e6]))
    sampler.update_priority(torch.tensor([30]), torch.tensor([1e6]))  # standalone: kept until sample()
    batch = rb.sample()
    row, env = batch["index"].unbind(-1)
    assert int(row.max()) < steps
    assert torch.equal(batch["obs"], env * steps + row)  # [envs, T] batches: obs[e, t] = e * T + t
    assert len(set(zip(row.tolist(), env.tolist()))) > 1


@pytest.mark.parametrize("name", ["alpha", "eps", "initial_priority"])
def test_infinite_settings_are_refused(name):
    # alpha=inf or eps=inf failed later with "cannot convert float NaN to integer".
    kwargs = {"alpha": 0.6, "beta": 0.4} | {name: math.inf}
    with pytest.raises(ValueError, match=f"{name} must be a finite number, got {name}=inf"):
        PrioritizedSampler(10, **kwargs)
    sampler = PrioritizedSampler(10, 0.6, 0.4)
    if name == "alpha":
        with pytest.raises(ValueError, match="alpha must be a finite number"):
            sampler.alpha = math.inf
        assert sampler.alpha == 0.6


@pytest.mark.parametrize("reduction", ["max", "min", "mean", "median", "sum"])
@pytest.mark.parametrize("shape", [(4, 0), (4, 2, 0), (4, 0, 3)])
@pytest.mark.parametrize("how", ["update_priority", "check_priority", "buffer"])
def test_a_per_item_priority_with_no_element_is_refused_and_writes_nothing(reduction, shape, how):
    """``[N, 0]`` priorities (per-agent TD errors of a group with no agent) leave nothing to
    reduce. Was: a bare IndexError from ``amax`` (``max``, ``min``), a priority of 0 (``sum``)
    or NaN (``mean``)."""
    from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer

    sampler = filled_sampler([1.0, 2.0, 3.0, 4.0, 5.0], reduction=reduction)
    leaves, default = sampler.tree.leaves.clone(), sampler.default_priority
    match = rf"priority of shape \({shape[0]}, {', '.join(map(str, shape[1:]))}\) holds no value per item.*" \
            r"pass at least one priority per item, e.g. shape \[4\]"
    with pytest.raises(ValueError, match=match):
        if how == "update_priority":
            sampler.update_priority(torch.arange(4), torch.rand(shape))
        elif how == "check_priority":
            sampler.check_priority(torch.rand(shape), 4)
        else:
            rb = ExtTensorDictReplayBuffer(storage=FastTensorStorage(5), sampler=sampler, batch_size=2)
            rb.extend(TensorDict({"x": torch.zeros(5, 1)}, [5]))
            leaves = sampler.tree.leaves.clone()
            rb.update_priority(torch.arange(4), torch.rand(shape))
    assert torch.equal(sampler.tree.leaves, leaves)
    assert sampler.default_priority == default


def test_no_items_with_per_item_priorities_write_nothing():
    sampler = filled_sampler([1.0, 2.0])
    leaves = sampler.tree.leaves.clone()
    sampler.update_priority(torch.arange(0), torch.rand(0, 3))  # was: a RuntimeError from reshape
    assert torch.equal(sampler.tree.leaves, leaves)


def test_check_priority_raises_what_update_priority_would_and_writes_nothing():
    sampler = filled_sampler([1.0, 2.0, 3.0])
    leaves = sampler.tree.leaves.clone()
    with pytest.raises(ValueError, match=r"priority of shape \(3,\) does not match 4 indices"):
        sampler.check_priority(torch.ones(3), 4)
    with pytest.raises(ValueError, match="priority must be finite and >= 0"):
        sampler.check_priority(torch.tensor([1.0, -2.0]), 2)
    with pytest.raises(TypeError, match="priority must hold real numbers"):
        sampler.check_priority(torch.ones(2, dtype=torch.complex64), 2)
    sampler.check_priority(torch.ones(4, 2), 4)  # per-agent priorities, reduced
    assert torch.equal(sampler.tree.leaves, leaves)


# ---------------------------------------------------------------------------
# Differential: the same calls on TorchRL's PrioritizedSampler.

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 12)),
        st.tuples(st.just("update"), st.lists(st.tuples(st.integers(0, 23), st.floats(0.0, 50.0)),
                                              min_size=1, max_size=6)),
        st.tuples(st.just("alpha"), st.sampled_from([0.3, 0.6, 1.0])),
        st.tuples(st.just("beta"), st.sampled_from([0.0, 0.4, 1.0, 1.5, 3.0])),  # TorchRL takes beta > 1
        st.tuples(st.just("empty"), st.none()),
        st.tuples(st.just("sample"), st.integers(1, 16)),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, seed=st.integers(0, 1000))
def test_same_priorities_and_weights_as_torchrls_sampler(ops, seed):
    capacity = 24
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=4,
                                  sampler=PrioritizedSampler(capacity, 0.6, 0.4))
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=4,
                                    sampler=TorchRLPrioritizedSampler(capacity, 0.6, 0.4))
    torch.manual_seed(seed)
    written = 0
    for op, arg in ops:
        if op == "extend":
            data = TensorDict({"obs": torch.arange(written, written + arg, dtype=torch.float32)}, [arg])
            written += arg
            ours.extend(data.clone())
            theirs.extend(data.clone())
        elif op == "update":
            pairs = [(i, p) for i, p in arg if i < len(ours)]  # stored items only (unstored: refused here)
            if pairs:
                index, priority = torch.tensor([i for i, _ in pairs]), torch.tensor([p for _, p in pairs])
                ours.update_priority(index, priority)
                theirs.update_priority(index, priority)
        elif op in ("alpha", "beta"):
            setattr(ours.sampler, op, arg)
            setattr(theirs.sampler, op, arg)
        elif op == "empty":
            ours.empty()
            theirs.empty()
        elif len(ours):
            batch = ours.sample(arg)
            stored = len(theirs)
            leaves = torch.tensor([theirs.sampler._sum_tree[i] for i in range(stored)], dtype=torch.float64)
            # Their leaves are (p + eps) ** alpha: the weights of the items we drew, from them.
            expected = (leaves[batch["index"]] / leaves[leaves > 0].min()) ** -theirs.sampler.beta
            torch.testing.assert_close(batch["priority_weight"].double(), expected, rtol=1e-4, atol=0)
            assert int(batch["index"].max()) < stored
        assert len(ours) == len(theirs)
        stored = len(theirs)
        if stored:
            mine = ours.sampler.tree.leaves[:stored].double()
            their_leaves = torch.tensor([theirs.sampler._sum_tree[i] for i in range(stored)], dtype=torch.float64)
            torch.testing.assert_close(mine, their_leaves, rtol=1e-4, atol=1e-6)
            assert ours.sampler.default_priority == pytest.approx(
                max(float(theirs.sampler._max_priority[0] or 0.0), 1.0), rel=1e-5)


def test_trees_stay_with_their_priorities_on_a_cpu_storage():
    storage = LazyTensorStorage(8, device="cpu")
    storage.set(torch.arange(3), TensorDict({"x": torch.zeros(3)}, [3]))
    sampler = PrioritizedSampler(8, alpha=1.0, beta=0.4)
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 3.0]))
    index, _ = sampler.sample(storage, 64)
    assert sampler.device == torch.device("cpu") and sampler.max_size == 8
    assert set(index.tolist()) <= {0, 1, 2}
    assert sampler.tree.leaves[:3].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="trees follow a CUDA storage")
def test_trees_follow_a_cuda_storage_unless_a_device_was_given():
    storage = LazyTensorStorage(8, device="cuda")
    storage.set(torch.arange(3), TensorDict({"x": torch.zeros(3)}, [3]))
    follows, pinned = PrioritizedSampler(8, alpha=1.0, beta=0.4), PrioritizedSampler(8, alpha=1.0, beta=0.4, device="cpu")
    for sampler in (follows, pinned):
        # The first write moves the trees (as TorchRL's sampler does), so it is not lost at the first sample.
        sampler.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 3.0]), storage=storage)
        index, _ = sampler.sample(storage, 64)
        assert set(index.tolist()) <= {0, 1, 2} and sampler.tree.leaves[:3].tolist() == [1.0, 2.0, 3.0]
    assert follows.device.type == "cuda" and pinned.device == torch.device("cpu")


# --------------------------------------------------------------------------- overflowing priorities
def _tree_state(sampler):
    return [level.clone() for level in sampler.tree.state_dict()["levels"]], sampler.default_priority


def _same_tree_state(sampler, before):
    levels, default = before
    assert all(torch.equal(a, b) for a, b in zip(levels, sampler.tree.state_dict()["levels"]))
    assert sampler.default_priority == default


@pytest.mark.parametrize(
    "alpha,priority,shown",
    [
        (2.0, torch.tensor([1e20]), "priority=1e\\+20"),  # finite, but 1e40 overflows float32
        (1.0, torch.tensor([1e39], dtype=torch.float64), "priority=1e\\+39"),  # the value given
        (1.0, 1e39, "priority=1e\\+39"),  # a Python float, not its float32 cast (inf)
    ],
)
def test_priority_overflowing_the_tree_dtype_is_refused(alpha, priority, shown):
    sampler = filled_sampler([1.0, 2.0, 3.0], alpha=alpha)
    before = _tree_state(sampler)
    with pytest.raises(ValueError, match=f"{shown} with alpha={alpha:g} .* 3.403e\\+38, the largest torch.float32"):
        sampler.update_priority(torch.tensor([0]), priority)
    with pytest.raises(ValueError, match=shown):
        sampler.check_priority(priority, 1)
    _same_tree_state(sampler, before)
    assert sampler.default_priority == 3.0  # the refused priority is not the max seen


def test_overflowing_priority_through_the_buffer_leaves_sampling_intact():
    from torchrl_ext.replay_buffers import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(alpha=2.0, beta=0.4, storage=LazyTensorStorage(8), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    with pytest.raises(ValueError, match="priority=1e\\+20"):
        rb.update_priority(torch.tensor([0]), torch.tensor([1e20]))
    rb.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
    assert rb.sampler.tree.leaves[:6].tolist() == [1.0] * 6
    assert torch.isfinite(rb.sample()["priority_weight"]).all()


def test_float64_trees_hold_what_float32_trees_refuse():
    sampler = PrioritizedSampler(2, 2.0, 0.5, 0.0, dtype=torch.float64)
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1e20, 1.0], dtype=torch.float64))
    assert sampler.tree.leaves.tolist() == [1e40, 1.0]


def test_alpha_overflowing_stored_priorities_is_refused_and_kept():
    sampler = filled_sampler([1.0, 1e19, 3.0], alpha=1.0)
    before = _tree_state(sampler)
    with pytest.raises(ValueError, match="stored priority 1e\\+19 with alpha=3 .*alpha and the priorities were kept"):
        sampler.alpha = 3.0
    assert sampler.alpha == 1.0
    _same_tree_state(sampler, before)
    sampler.alpha = 2.0  # 1e38 fits float32
    assert sampler.tree.leaves.tolist() == pytest.approx([1.0, 1e38, 9.0], rel=1e-5)


@pytest.mark.parametrize("priority", ["a", object(), [None]])
def test_priority_that_holds_no_numbers_is_a_type_error_naming_it(priority):
    sampler = filled_sampler([1.0, 2.0])
    before = _tree_state(sampler)
    with pytest.raises(TypeError, match="priority must be a real number or a tensor of them, got priority="):
        sampler.update_priority(torch.tensor([0]), priority)
    _same_tree_state(sampler, before)


def test_buffer_update_priority_with_a_string_is_a_type_error_naming_priority():
    from torchrl_ext.replay_buffers import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(8), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    with pytest.raises(TypeError, match="priority must be a real number .* got priority='a'"):
        rb.update_priority(torch.tensor([0]), "a")
    assert rb.sampler.tree.leaves[:4].tolist() == [1.0] * 4


@pytest.mark.parametrize("ndim", [1, 2])
def test_update_tensordict_priority_without_index_names_the_missing_key(ndim):
    # tests/replay_buffers belongs to another change; replay_buffers/prioritized.py's check is tested here.
    from torchrl_ext.replay_buffers import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.4, storage=LazyTensorStorage(8, ndim=ndim), batch_size=4)
    shape = [2, 2] if ndim == 2 else [4]
    rb.extend(TensorDict({"x": torch.arange(4.0).view(shape)}, shape))
    with pytest.raises(ValueError, match="needs the \"index\" entry .* keys \\['td_error'\\]"):
        rb.update_tensordict_priority(TensorDict({"td_error": torch.full((4,), 5.0)}, [4]))
    assert rb.sampler.tree.leaves[:4].tolist() == [1.0] * 4
    assert rb.sampler.default_priority == 1.0


@pytest.mark.parametrize("inside_first", [True, False])
def test_sampler_used_inside_then_outside_inference_mode(inside_first):
    # Large writes and stratified walks use the trees' lazily made scratch buffers.
    sampler = PrioritizedSamplerWithoutReplacement(20000, 1.0, 0.5, 0.0)
    storage = FullStorage(20000)
    reference = torch.zeros(20000)
    for step, inside in enumerate([inside_first, not inside_first]):
        index = torch.arange(step * 10000, step * 10000 + 10000)
        with torch.inference_mode(inside):
            sampler.update_priority(index, torch.full((10000,), 2.0 + step), storage=storage)
            sampler.sample(storage, 64)
        reference[index] = 2.0 + step
    assert torch.equal(sampler.tree.leaves[:20000], reference)


@pytest.mark.parametrize("reduction", ["max", "min", "mean", "median", "sum"])
@pytest.mark.parametrize("bad", [-5.0, math.inf, math.nan])
@pytest.mark.parametrize("how", ["tensordict", "prioritized", "update_priority", "ndim2"])
def test_a_bad_agent_priority_is_refused_whatever_the_reduction(reduction, bad, how):
    """Each agent's (or step's) priority is checked before it is reduced to one per item: a
    ``max`` would hide a negative one, a ``min`` an infinite one. Nothing is written."""
    from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
    from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer

    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0, reduction=reduction)
    if how == "prioritized":
        rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, reduction=reduction,
                                     storage=FastTensorStorage(8), batch_size=2)
        sampler = rb.sampler
    elif how == "ndim2":
        rb = ExtTensorDictReplayBuffer(storage=FastTensorStorage(8, ndim=2), sampler=sampler, batch_size=2)
    else:
        rb = ExtTensorDictReplayBuffer(storage=FastTensorStorage(8), sampler=sampler, batch_size=2)
    if how == "ndim2":
        rb.extend(TensorDict({"x": torch.zeros(2, 2, 1)}, [2, 2]))
        index = torch.tensor([[0, 0], [0, 1]])
    else:
        rb.extend(TensorDict({"x": torch.zeros(4, 1)}, [4]))
        index = torch.tensor([0, 1])
    leaves = sampler.tree.leaves.clone()
    agents = torch.tensor([[bad, 6.0, 1.0], [0.5, 0.5, 0.5]])
    with pytest.raises(ValueError, match="priority must be finite and >= 0"):
        if how == "update_priority":
            rb.update_priority(index, agents)
        else:
            rb.update_tensordict_priority(TensorDict({"index": index, "td_error": agents}, [2]))
    assert torch.equal(sampler.tree.leaves, leaves)


@pytest.mark.parametrize("build", ["sampler", "buffer"])
def test_two_dim_storage_cells_past_the_trees_are_refused_before_the_first_write(build):
    """TorchRL rounds an ndim=2 storage's max_size up to whole env columns (5 -> 3 rows x 2 envs):
    trees sized to max_size would leave a cell without a priority, found on the third write
    after it was stored; the first write is refused instead, naming the capacity needed."""
    from torchrl_ext.replay_buffers import PrioritizedReplayBuffer, TensorDictReplayBuffer

    def make(capacity):
        if build == "buffer":
            return PrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=FastTensorStorage(capacity, ndim=2),
                                           batch_size=2, dim_extend=0)
        return TensorDictReplayBuffer(storage=FastTensorStorage(5, ndim=2), batch_size=2, dim_extend=0,
                                      sampler=PrioritizedSampler(capacity, alpha=1.0, beta=0.5))

    step = TensorDict({"obs": torch.tensor([[0.0, 1.0]])}, [1, 2])
    rb = make(5)
    with pytest.raises(ValueError, match=r"max_capacity=5 is smaller than the storage's 6 cells \(3 rows x 2 envs\)"):
        rb.extend(step)
    assert len(rb) == 0 and rb.write_count == 0
    rb = make(6)
    for t in range(4):
        rb.extend(step + 2.0 * t)
    assert len(rb) == 6
    sample = rb.sample()
    assert torch.equal(rb.storage.get(tuple(sample["index"].unbind(-1)))["obs"], sample["obs"])
