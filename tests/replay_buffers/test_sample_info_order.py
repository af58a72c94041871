"""A sample's keys and values are TorchRL's for any transform, ``include_info`` and ``return_info``.

TorchRL's ``TensorDictReplayBuffer.sample`` runs the buffer's transform on the stored rows
and adds the sampler's info (``index``, ``priority_weight``, ...) after it, unless
``include_info=False``; the fast paths must give that result too.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RoundRobinWriter
from torchrl.data import TensorDictPrioritizedReplayBuffer as TorchRLPrioritizedReplayBuffer
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer
from torchrl.envs.transforms import RenameTransform, SelectTransform

import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler, TrajectorySampler
from torchrl_ext.storages import EnvRingStorage, FastTensorStorage
from torchrl_ext.writers import EnvRingWriter

TRANSFORMS = {
    "none": None,
    "select": lambda: SelectTransform("obs"),  # drops every other key
    "rename": lambda: RenameTransform(["obs"], ["observation"]),
}
INCLUDE_INFO = [None, True, False]
STORAGES = {"lazy": LazyTensorStorage, "fast": FastTensorStorage}
# name: (ours, TorchRL's, whether both draw the same rows from the same seed)
BUFFERS = {
    # RoundRobinWriter stores no "index": include_info=False leaves it out.
    "plain": (
        lambda storage: TensorDictReplayBuffer(storage=storage, writer=RoundRobinWriter(), batch_size=6),
        lambda storage: TorchRLTensorDictReplayBuffer(storage=storage, writer=RoundRobinWriter(), batch_size=6),
        True,
    ),
    "plain_default_writer": (
        lambda storage: TensorDictReplayBuffer(storage=storage, batch_size=6),
        lambda storage: TorchRLTensorDictReplayBuffer(storage=storage, batch_size=6),
        True,
    ),
    "prioritized": (
        lambda storage: PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, batch_size=6),
        lambda storage: TorchRLPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, batch_size=6),
        False,
    ),
}


def keys(data):
    return set(data.keys(True, True))


def draw(rb, fill, transform, include_info, return_info):
    """``rb.sample`` on a seeded draw, and the include_info warnings it gave."""
    if TRANSFORMS[transform] is not None:
        rb.append_transform(TRANSFORMS[transform]())
    fill(rb)
    torch.manual_seed(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = rb.sample(include_info=include_info, return_info=return_info)
    data, info = out if return_info else (out, None)
    return data, info, [str(w.message) for w in caught if "include_info" in str(w.message)]


def fill_rows(rb):
    rb.extend(TensorDict({"obs": torch.arange(20.0), "act": torch.arange(20) * 10}, [20]))


def as_tensor(value):
    return torch.stack(value, -1) if isinstance(value, tuple) else torch.as_tensor(value)


def same_info(ours, theirs):
    assert set(ours) == set(theirs)
    for key in theirs:
        assert torch.equal(as_tensor(ours[key]), as_tensor(theirs[key])), key


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("return_info", [False, True])
@pytest.mark.parametrize("include_info", INCLUDE_INFO)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("buffer", BUFFERS)
def test_sample_has_torchrls_keys_and_values(buffer, storage, transform, include_info, return_info, fast):
    make_ours, make_theirs, comparable = BUFFERS[buffer]
    ours_rb = make_ours(STORAGES[storage](32))
    with torchrl_ext.fastpath(fast):
        ours, our_info, our_warnings = draw(ours_rb, fill_rows, transform, include_info, return_info)
    theirs, their_info, their_warnings = draw(
        make_theirs(LazyTensorStorage(32)), fill_rows, transform, include_info, return_info
    )
    assert keys(ours) == keys(theirs)
    assert our_warnings == their_warnings
    obs = ours.get("obs", ours.get("observation", None))  # the stored row's position, as a float
    if comparable:
        assert (ours == theirs).all()
        if return_info:
            same_info(our_info, their_info)
    else:  # other trees, other draws: the rows must still be where "index" says
        for key in keys(theirs):
            assert (ours[key].dtype, ours[key].shape) == (theirs[key].dtype, theirs[key].shape), key
        if "index" in ours:
            assert torch.equal(ours["index"], obs.long())
        if "priority_weight" in theirs:  # equal priorities: every weight is 1 in both
            assert torch.equal(ours["priority_weight"], theirs["priority_weight"])
        if return_info:
            assert set(our_info) == set(their_info)
            assert torch.equal(as_tensor(our_info["index"]), obs.long())
    if buffer == "prioritized" and "index" in ours:
        ours["td_error"] = torch.rand(ours.shape[0])
        with torchrl_ext.fastpath(fast):
            ours_rb.update_tensordict_priority(ours)


# --------------------------------------------------------------------------- env rings
class TorchRLRingBuffer(TorchRLTensorDictReplayBuffer):
    """TorchRL's ``sample`` over env rings (the reference for ``EnvRingReplayBuffer``)."""

    _drives_env_rings = True

    def _set_index_in_td(self, tensordict, index):
        return  # [N * T, 2] coordinates do not fit an [N] batch; sample does not use them


RING_SAMPLERS = {"trajectory": lambda: TrajectorySampler(3), "nstep": lambda: NStepSampler(2, 0.9)}


def fill_rings(rb):
    for t in range(11):
        rb.extend(TensorDict({
            "obs": torch.tensor([t, 100.0 + t]), "reward": torch.rand(2), "done": torch.zeros(2, 1, dtype=torch.bool),
            "next": {"obs": torch.tensor([t + 1.0, 101.0 + t]), "reward": torch.rand(2),
                     "done": torch.zeros(2, 1, dtype=torch.bool)},
        }, [2]))


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("return_info", [False, True])
@pytest.mark.parametrize("include_info", INCLUDE_INFO)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("sampler", RING_SAMPLERS)
def test_env_ring_sample_has_torchrls_keys_and_values(sampler, transform, include_info, return_info, fast):
    ours_rb = EnvRingReplayBuffer(num_envs=2, max_length=8, sampler=RING_SAMPLERS[sampler](), batch_size=4)
    theirs_rb = TorchRLRingBuffer(storage=EnvRingStorage(2, 8), writer=EnvRingWriter(),
                                  sampler=RING_SAMPLERS[sampler](), dim_extend=0, batch_size=4,
                                  collate_fn=lambda data: data)
    torch.manual_seed(0)
    with torchrl_ext.fastpath(fast):
        ours, our_info, our_warnings = draw(ours_rb, fill_rings, transform, include_info, return_info)
    torch.manual_seed(0)
    theirs, their_info, their_warnings = draw(theirs_rb, fill_rings, transform, include_info, return_info)
    assert keys(ours) == keys(theirs)
    assert our_warnings == their_warnings
    assert (ours == theirs).all()
    if return_info:
        same_info(our_info, their_info)
