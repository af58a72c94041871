"""EnvRingReplayBuffer.extend: env ids are checked once, before anything is written, and
the fast paths and TorchRL's path accept and refuse the same inputs; a sampler that cannot
read rings is refused when the buffer is built, before any write."""
from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedNStepSampler
from torchrl_ext.storages import EnvRingStorage


def filled() -> EnvRingReplayBuffer:
    """3 envs x 4 steps, one step of each written: x = env."""
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    rb.extend(TensorDict({"x": torch.tensor([0.0, 1.0, 2.0])}, [3]))
    return rb


def state(rb: EnvRingReplayBuffer) -> tuple:
    storage = rb.storage
    pos, size = storage.current_pos.tolist(), storage.current_size.tolist()
    steps = [rb.read(torch.full((n,), env), torch.arange(p - n, p))["x"].tolist()
             for env, (p, n) in enumerate(zip(pos, size))]
    return pos, size, rb.writer._write_count, steps


FLOAT_IDS = pytest.mark.parametrize("ids, dtype", [
    (torch.tensor([0.7, 1.9]), "float32"),
    ([0.0, 1.0], "float32"),
    (torch.tensor([True, False]), "bool"),
    (torch.tensor([1 + 0j, 0j]), "complex64"),
])


@FLOAT_IDS
@pytest.mark.parametrize("fast", [True, False])
def test_non_integer_env_ids_are_refused_before_any_write(ids, dtype, fast):
    rb = filled()
    before = state(rb)
    with torchrl_ext.fastpath(fast), pytest.raises(TypeError, match=rf"env_ids must hold integer env ids, got dtype=torch\.{dtype}"):
        rb.extend(TensorDict({"x": torch.tensor([5.0, 6.0])}, [2]), env_ids=ids)
    assert state(rb) == before


@pytest.mark.parametrize("fast", [True, False])
def test_float_env_id_entry_names_the_entry(fast):
    rb = filled()
    before = state(rb)
    data = TensorDict({"x": torch.tensor([5.0, 6.0]), "env_id": torch.tensor([0.7, 1.9])}, [2])
    with torchrl_ext.fastpath(fast), pytest.raises(TypeError, match=r"data\['env_id'\] must hold integer env ids"):
        rb.extend(data)
    assert state(rb) == before


@pytest.mark.parametrize("method", ["clear", "remove_up_to", "dequeue"])
@pytest.mark.parametrize("ids, match", [
    ([1.5], r"env_ids must hold integer env ids, got dtype=torch\.float32"),
    (torch.tensor([False, True, False]), r"got dtype=torch\.bool; .*mask\.nonzero\(\)\.squeeze\(1\)"),
])
def test_removals_refuse_non_integer_env_ids(method, ids, match):
    rb = filled()
    before = state(rb)
    call = {"clear": lambda: rb.clear(env_ids=ids), "remove_up_to": lambda: rb.remove_up_to(1, env_ids=ids),
            "dequeue": lambda: rb.dequeue(1, env_ids=ids)}[method]
    with pytest.raises(TypeError, match=match):
        call()
    assert state(rb) == before
    rb.clear(env_ids=torch.tensor([False, True, False]).nonzero().squeeze(1))  # the fix the message gives
    assert rb.storage.current_size.tolist() == [1, 0, 1]


def test_read_refuses_float_env_ids_and_positions():
    rb = filled()
    with pytest.raises(TypeError, match=r"env_ids must hold integer env ids, got dtype=torch\.float32"):
        rb.read(torch.tensor([0.9]), torch.tensor([0]))
    with pytest.raises(TypeError, match=r"positions must hold integer positions, got dtype=torch\.float64"):
        rb.read(torch.tensor([1]), torch.tensor([0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"env_ids of shape \(2,\) and positions of shape \(3,\) do not broadcast"):
        rb.read(torch.tensor([0, 1]), torch.tensor([0, 0, 0]))
    assert rb.read(torch.tensor([2]), torch.tensor([0]))["x"].tolist() == [2.0]


def _outcome(fast: bool, ids, data: TensorDict):
    """What ``extend(data, env_ids=ids)`` gives on a filled buffer: the index and the stored
    steps, or the exception type."""
    rb = filled()
    with torchrl_ext.fastpath(fast):
        try:
            index = rb.extend(data, env_ids=ids)
        except (TypeError, ValueError, RuntimeError, IndexError) as error:
            return type(error), state(rb)
    return index.tolist(), state(rb)


@pytest.mark.parametrize("ids, data, accepted", [
    (torch.tensor([0]), TensorDict({"x": torch.zeros(2)}, [2]), False),  # one id for two rows
    (1, TensorDict({"x": torch.full((1,), 7.0)}, [1]), True),  # an int for one row
    (torch.tensor(1), TensorDict({"x": torch.full((1,), 7.0)}, [1]), True),  # 0-d
    (torch.tensor([[0, 1]]), TensorDict({"x": torch.zeros(2)}, [2]), False),  # 2-D ids
    (torch.tensor([0, 1]), TensorDict({"x": torch.zeros(2, 0)}, [2, 0]), True),  # no steps
    (torch.tensor([0, 1]), TensorDict({"x": torch.ones(2, 2)}, [2, 2]), True),  # [N, T]
    (torch.tensor([0, 1]), TensorDict({"x": torch.zeros(2, 1, 1)}, [2, 1, 1]), False),  # 3-D batch
])
def test_fast_paths_on_and_off_accept_and_refuse_the_same(ids, data, accepted):
    on, off = _outcome(True, ids, data), _outcome(False, ids, data)
    assert on == off
    assert accepted == (not isinstance(on[0], type))
    if not accepted:
        assert on[0] is ValueError and on[1] == state(filled())  # refused, nothing written


@pytest.mark.parametrize("blocking", [False, True])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
def test_a_batch_of_no_rows_writes_nothing_with_or_without_env_ids(fast, blocking):
    # Was: without env ids, a [0] batch was refused for not holding every env's step.
    with torchrl_ext.fastpath(fast):
        rb = filled()
        before = state(rb)
        for kwargs in ({}, {"env_ids": torch.tensor([], dtype=torch.long)}):
            index = rb.extend(TensorDict({"x": torch.zeros(0)}, [0]), blocking=blocking, **kwargs)
            assert index.shape == (0, 2)
        assert state(rb) == before
        with pytest.raises(ValueError):  # the ids are still checked: two ids for no rows
            rb.extend(TensorDict({"x": torch.zeros(0)}, [0]), env_ids=torch.tensor([0, 1]))


def test_a_sampler_that_cannot_read_rings_is_refused_when_the_buffer_is_built():
    # Was: the buffer was built, and its first extend stored the batch before the sampler refused it.
    storage = EnvRingStorage(2, 4)
    message = (r"PrioritizedNStepSampler supports tensor storages with ndim=2 .* got EnvRingStorage; "
               r"for per-env rings \(EnvRingStorage\) use NStepSampler\.")
    for sampler in (PrioritizedNStepSampler(8, 1.0, 0.5, n_step=2),
                    functools.partial(PrioritizedNStepSampler, 8, 1.0, 0.5)):  # a factory too
        with pytest.raises(TypeError, match=message):
            EnvRingReplayBuffer(storage=storage, sampler=sampler)
    # Nothing was stored or attached: the storage still serves a buffer with the advised sampler.
    rb = EnvRingReplayBuffer(storage=storage, sampler=NStepSampler(2))
    done = torch.zeros(2, dtype=torch.bool)
    rb.extend(TensorDict({"x": torch.zeros(2), "next": {"reward": torch.zeros(2), "done": done}}, [2]))
    assert storage.current_pos.tolist() == [1, 1] and rb.sample(2).shape == (2,)


def test_a_flat_prioritized_sampler_is_refused_when_the_buffer_is_built():
    from torchrl_ext.samplers import PrioritizedSampler

    with pytest.raises(TypeError, match="PrioritizedSampler keeps a priority per row of a tensor storage, got an "
                                        "EnvRingStorage; for per-env rings use PrioritizedTrajectorySampler"):
        EnvRingReplayBuffer(num_envs=2, max_length=4, sampler=PrioritizedSampler(8, 0.7, 0.5))
