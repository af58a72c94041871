"""On-policy minibatch samplers: HARL's generators (vectors), epochs, coverage, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer

from tests._vectors import vectors_path
from torchrl_ext.samplers import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
)

T, N, A, CHUNK, NUM_MB = 8, 4, 2, 4, 3

ACTOR_FIELDS = {  # HARL's yield name -> stored array name (first T slots)
    "obs": "obs", "rnn_states": "rnn_states", "actions": "actions", "masks": "masks",
    "active_masks": "active_masks", "old_action_log_probs": "action_log_probs",
    "adv_targ": "advantages", "available_actions": "available_actions", "factor": "factor",
}
CRITIC_FIELDS = {name: name for name in
                 ("share_obs", "rnn_states_critic", "value_preds", "returns", "masks")}


@pytest.fixture(scope="module")
def vectors():
    return np.load(vectors_path("harl_generators.npz"))


def rollout(vectors, prefix, fields, batch):
    data = {name: torch.from_numpy(vectors[f"{prefix}_{stored}"][:T]) for name, stored in fields.items()}
    return TensorDict(data, batch)


def make_buffer(data, sampler):
    storage = LazyTensorStorage(data.numel(), ndim=data.ndim)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=1, dim_extend=0)
    rb.extend(data)
    return rb


def harl_order(batch, kind):
    """Our minibatch in HARL's row order: ff [B]; naive/rec [k, L] -> time-major [L * k]."""
    if kind == "ff":
        return batch
    return batch.transpose(0, 1).reshape(-1)


CASES = [
    ("actor", ACTOR_FIELDS, (T, N), "rnn_states"),
    ("critic_ep", CRITIC_FIELDS, (T, N), "rnn_states_critic"),
    ("critic_fp", CRITIC_FIELDS, (T, N, A), "rnn_states_critic"),
]


@pytest.mark.parametrize("prefix, fields, batch, rnn_key", CASES)
@pytest.mark.parametrize("kind", ["ff", "naive", "rec"])
def test_minibatches_equal_harl_with_the_same_permutation(vectors, prefix, fields, batch, rnn_key, kind):
    if kind == "ff":
        sampler = FeedForwardMinibatchSampler(NUM_MB, drop_last=True)
    elif kind == "naive":
        sampler = NaiveRecurrentMinibatchSampler(NUM_MB, drop_last=True)
    else:
        sampler = ChunkedRecurrentMinibatchSampler(NUM_MB, data_chunk_length=CHUNK, drop_last=True)
    rb = make_buffer(rollout(vectors, prefix, fields, batch), sampler)
    sampler.set_permutation(torch.from_numpy(vectors[f"{prefix}_{kind}_perm"]))
    batches = list(rb)
    assert len(batches) == NUM_MB
    for i, out in enumerate(batches):
        for name in fields:
            want = torch.from_numpy(vectors[f"{prefix}_{kind}_mb{i}_{name}"])
            if name == rnn_key and kind != "ff":
                got = out[name][:, 0]  # the state a sequence or chunk starts from
            else:
                got = harl_order(out, kind)[name]
            assert torch.equal(got.reshape(want.shape), want), (kind, i, name)


def numbered(batch_shape):
    """Every step carries its own coordinates, to check coverage."""
    total = int(np.prod(batch_shape))
    return TensorDict({"id": torch.arange(total).view(batch_shape)}, batch_shape)


@pytest.mark.parametrize("batch_shape", [(10, 3), (6, 5, 2)])
@pytest.mark.parametrize("num_mb", [1, 4, 7])
def test_every_step_appears_exactly_once_per_epoch(batch_shape, num_mb):
    for sampler in (FeedForwardMinibatchSampler(num_mb), NaiveRecurrentMinibatchSampler(min(num_mb, 3)),
                    ChunkedRecurrentMinibatchSampler(num_mb, data_chunk_length=2)):
        rb = make_buffer(numbered(batch_shape), sampler)
        rb.set_rng(torch.Generator().manual_seed(num_mb))
        for _epoch in range(2):
            ids = torch.cat([batch["id"].reshape(-1) for batch in rb])
            assert sorted(ids.tolist()) == list(range(int(np.prod(batch_shape)))), type(sampler).__name__


def test_minibatch_sizes_spread_the_remainder_or_drop_it():
    rb = make_buffer(numbered((10, 3)), FeedForwardMinibatchSampler(4))
    assert [b.shape[0] for b in rb] == [8, 8, 7, 7]
    rb = make_buffer(numbered((10, 3)), FeedForwardMinibatchSampler(4, drop_last=True))
    assert [b.shape[0] for b in rb] == [7, 7, 7, 7]
    rb = make_buffer(numbered((10, 3)), FeedForwardMinibatchSampler(mini_batch_size=8))
    assert [b.shape[0] for b in rb] == [8, 8, 8, 6]
    rb = make_buffer(numbered((10, 3)), FeedForwardMinibatchSampler(mini_batch_size=8, drop_last=True))
    assert [b.shape[0] for b in rb] == [8, 8, 8]


def test_chunks_stay_within_one_thread_and_are_consecutive():
    rb = make_buffer(numbered((12, 5)), ChunkedRecurrentMinibatchSampler(4, data_chunk_length=3))
    for batch in rb:
        assert batch.shape[1] == 3
        ids = batch["id"]
        thread, t = ids % 5, ids // 5
        assert bool((thread == thread[:, :1]).all())
        assert bool((t.diff(dim=1) == 1).all()) and bool((t[:, 0] % 3 == 0).all())


def test_naive_sequences_cover_the_whole_rollout_batch_first():
    rb = make_buffer(numbered((6, 4)), NaiveRecurrentMinibatchSampler(2, shuffle=False))
    first, second = list(rb)
    assert first["id"].tolist() == [[t * 4 + n for t in range(6)] for n in (0, 1)]
    assert second["id"].tolist() == [[t * 4 + n for t in range(6)] for n in (2, 3)]


def test_each_epoch_draws_a_new_permutation_and_ran_out_marks_its_end():
    sampler = FeedForwardMinibatchSampler(2)
    rb = make_buffer(numbered((4, 2)), sampler)
    rb.set_rng(torch.Generator().manual_seed(0))
    first = [b["id"].tolist() for b in rb]
    assert sampler.ran_out
    second = [b["id"].tolist() for b in rb]
    assert first != second and len(second) == 2


def test_state_dict_resumes_mid_epoch():
    sampler = ChunkedRecurrentMinibatchSampler(3, data_chunk_length=2)
    rb = make_buffer(numbered((6, 3)), sampler)
    rb.set_rng(torch.Generator().manual_seed(1))
    rb.sample()
    fresh = ChunkedRecurrentMinibatchSampler(3, data_chunk_length=2)
    rb2 = make_buffer(numbered((6, 3)), fresh)
    fresh.load_state_dict(sampler.state_dict())
    assert torch.equal(rb.sample()["id"], rb2.sample()["id"])
    assert torch.equal(rb.sample()["id"], rb2.sample()["id"])
    assert sampler.ran_out and fresh.ran_out


def test_dumps_loads(tmp_path):
    sampler = FeedForwardMinibatchSampler(4)
    rb = make_buffer(numbered((5, 2)), sampler)
    rb.sample()
    sampler.dumps(tmp_path / "s")
    fresh = FeedForwardMinibatchSampler(4)
    fresh.loads(tmp_path / "s")
    assert all(torch.equal(a, b) for a, b in zip(sampler._splits, fresh._splits)) and fresh._next == 1


def test_bad_input():
    with pytest.raises(ValueError, match="give exactly one of num_mini_batch and mini_batch_size"):
        FeedForwardMinibatchSampler()
    with pytest.raises(ValueError, match="give exactly one of num_mini_batch and mini_batch_size"):
        FeedForwardMinibatchSampler(2, mini_batch_size=4)
    with pytest.raises(ValueError, match="num_mini_batch must be an int >= 1, got num_mini_batch=0"):
        FeedForwardMinibatchSampler(0)
    with pytest.raises(ValueError, match="data_chunk_length must be an int >= 1"):
        ChunkedRecurrentMinibatchSampler(2, data_chunk_length=0)
    rb = make_buffer(numbered((6, 2)), ChunkedRecurrentMinibatchSampler(2, data_chunk_length=8))
    with pytest.raises(ValueError, match="data_chunk_length=8 must divide the rollout length T=6"):
        rb.sample()
    rb = make_buffer(numbered((6, 2)), ChunkedRecurrentMinibatchSampler(2, data_chunk_length=4))
    with pytest.raises(ValueError, match="data_chunk_length=4 must divide the rollout length T=6"):
        rb.sample()
    rb = make_buffer(numbered((6, 2)), NaiveRecurrentMinibatchSampler(3))
    with pytest.raises(ValueError, match="num_mini_batch=3 is larger than the 2 threads"):
        rb.sample()
    sampler = FeedForwardMinibatchSampler(2)
    rb = make_buffer(numbered((2, 2)), sampler)
    sampler.set_permutation(torch.tensor([0, 1, 1, 2]))
    with pytest.raises(ValueError, match="must hold each of the 4 steps once"):
        rb.sample()
    with pytest.raises(TypeError, match="permutation must hold integer unit indices, got dtype=torch.float32"):
        sampler.set_permutation(torch.tensor([0.0, 1.0, 3.0, 2.0]))  # whole numbers, yet not indices
    flat = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=FeedForwardMinibatchSampler(2),
                                  batch_size=1)
    flat.extend(TensorDict({"x": torch.zeros(4)}, [4]))
    with pytest.raises(ValueError, match=r"need a storage of shape \[T, \*threads\]"):
        flat.sample()


# --------------------------------------------------------------------------- settings, epochs, errors
def _ff_buffer(sampler, steps=5, threads=2):
    data = TensorDict({"u": torch.arange(steps * threads).view(steps, threads)}, [steps, threads])
    return make_buffer(data, sampler)


@pytest.mark.parametrize(
    "cls,kwargs", [(FeedForwardMinibatchSampler, {}), (NaiveRecurrentMinibatchSampler, {}),
                   (ChunkedRecurrentMinibatchSampler, {"data_chunk_length": 1})],
)
@pytest.mark.parametrize(
    "name,value,match",
    [
        ("num_mini_batch", 0, "num_mini_batch must be an int >= 1, got num_mini_batch=0"),
        ("mini_batch_size", -3, "mini_batch_size must be an int >= 1, got mini_batch_size=-3"),
        ("num_mini_batch", None, "num_mini_batch=None leaves neither"),
        ("mini_batch_size", 2.5, "mini_batch_size must be an int >= 1"),
    ],
)
def test_split_settings_are_checked_as_the_constructor_checks_them(cls, kwargs, name, value, match):
    sampler = cls(2, **kwargs)
    with pytest.raises(ValueError, match=match):
        setattr(sampler, name, value)
    assert (sampler.num_mini_batch, sampler.mini_batch_size) == (2, None)
    if value is not None:
        with pytest.raises(ValueError, match=match):
            cls(**{name: value}, **kwargs)


def test_data_chunk_length_is_checked_when_set():
    sampler = ChunkedRecurrentMinibatchSampler(2, data_chunk_length=2)
    with pytest.raises(ValueError, match="data_chunk_length must be an int >= 1, got data_chunk_length=0"):
        sampler.data_chunk_length = 0
    assert sampler.data_chunk_length == 2


def test_setting_one_split_clears_the_other():
    sampler = FeedForwardMinibatchSampler(2)
    rb = _ff_buffer(sampler)
    sampler.mini_batch_size = 3
    assert sampler.num_mini_batch is None
    assert [len(b) for b in rb] == [3, 3, 3, 1]  # 10 steps in minibatches of 3
    sampler.num_mini_batch = 5
    assert sampler.mini_batch_size is None
    assert [len(b) for b in rb] == [2] * 5


def test_ran_out_is_cleared_each_epoch_as_torchrl_does():
    counts = {}
    for sampler in (SamplerWithoutReplacement(), FeedForwardMinibatchSampler(mini_batch_size=5)):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10, ndim=2), dim_extend=0,
                                    sampler=sampler, batch_size=5)
        rb.extend(TensorDict({"x": torch.arange(10).view(5, 2)}, [5, 2]))
        per_epoch = []
        for _ in range(3):
            n, flags = 0, []
            while True:
                rb.sample()
                n += 1
                flags.append(rb.sampler.ran_out)
                if rb.sampler.ran_out:
                    break
            per_epoch.append((n, flags))
        counts[type(sampler).__name__] = per_epoch
    assert counts["FeedForwardMinibatchSampler"] == counts["SamplerWithoutReplacement"] == [(2, [False, True])] * 3


def test_load_state_dict_with_missing_keys_names_them():
    sampler = FeedForwardMinibatchSampler(2)
    rb = _ff_buffer(sampler)
    rb.sample()
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="state_dict lacks \\['next', 'ran_out', 'splits', 'units'\\]"):
        sampler.load_state_dict({"x": 1})
    after = sampler.state_dict()
    assert after["next"] == before["next"] and all(torch.equal(a, b) for a, b in zip(after["splits"], before["splits"]))


def test_empty_multi_dimensional_storage_says_it_is_empty():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4, ndim=2), dim_extend=0,
                                sampler=FeedForwardMinibatchSampler(2), batch_size=1)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage."):
        rb.sample()


def test_a_refused_epoch_keeps_the_injected_permutation():
    """set_permutation is HARL's parity hook: an epoch refused for its split must not use it up."""
    sampler = FeedForwardMinibatchSampler(10, shuffle=True)
    rb = make_buffer(numbered((3, 2)), sampler)
    order = torch.arange(6).flip(0)
    sampler.set_permutation(order)
    with pytest.raises(ValueError, match="num_mini_batch=10 is larger than the 6 steps"):
        rb.sample()
    sampler.num_mini_batch = 1
    assert rb.sample()["id"].reshape(-1).tolist() == order.tolist()
    sampler.set_permutation(torch.tensor([0, 1, 1, 2, 3, 4]))
    for _ in range(2):  # a bad permutation stays refused until another is set
        with pytest.raises(ValueError, match="call set_permutation\\(\\) with such a permutation"):
            rb.sample()


@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
@pytest.mark.parametrize("cls", [FeedForwardMinibatchSampler, NaiveRecurrentMinibatchSampler])
def test_flags_refuse_other_values_in_the_constructor_and_the_setter(cls, name):
    """The string "False" is truthy: taken as a flag it would turn the feature on."""
    with pytest.raises(TypeError, match=f"{name} must be True or False, got {name}='False'"):
        cls(2, **{name: "False"})
    sampler = cls(2)
    before = getattr(sampler, name)
    with pytest.raises(TypeError, match=f"{name} must be True or False, got {name}='False'"):
        setattr(sampler, name, "False")
    assert getattr(sampler, name) is before
    setattr(sampler, name, np.bool_(not before))  # numpy bools are bools
    assert getattr(sampler, name) is (not before)


@pytest.mark.parametrize("split, match", [
    ({"num_mini_batch": 31}, "num_mini_batch=31 is larger than the 30 steps"),
    ({"mini_batch_size": 31, "drop_last": True}, "mini_batch_size=31 is larger than the 30 steps"),
])
def test_check_split_raises_what_the_epoch_would_without_drawing(split, match):
    sampler = FeedForwardMinibatchSampler(**split)
    rb = make_buffer(numbered((10, 3)), sampler)
    with pytest.raises(ValueError, match=match):
        sampler.check_split(rb.storage)
    assert sampler._splits is None  # nothing drawn
    FeedForwardMinibatchSampler(30).check_split(rb.storage)  # a split that fits passes
