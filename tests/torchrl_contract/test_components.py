"""TorchRL's samplers and writers on TorchRL's storages and on the fast storages that replace
them, in TorchRL's buffer and in torchrl_ext's: the same samples, info and stored rows."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    PrioritizedSampler,
    RandomSampler,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
)

from tests.torchrl_contract.test_storages import BUFFERS, PAIRS, assert_same, make

CAPACITY = 24
SAMPLERS: dict[str, Callable[[], Any]] = {
    "random": RandomSampler,
    "without_replacement": lambda: SamplerWithoutReplacement(drop_last=False),
    "slice": lambda: SliceSampler(num_slices=2, traj_key="episode", strict_length=False),
    "torchrl_prioritized": lambda: PrioritizedSampler(CAPACITY, 0.7, 0.5),
}
WRITERS: dict[str, Callable[[], Any]] = {
    "round_robin": TensorDictRoundRobinWriter,
    "plain_round_robin": RoundRobinWriter,
    "max_value": lambda: TensorDictMaxValueWriter(rank_key="score"),
}


def episodes(start: int, n: int) -> TensorDict:
    """Steps ``start ... start + n - 1`` in episodes of 5 steps, with a score for the max-value writer."""
    step = torch.arange(start, start + n)
    return TensorDict({"obs": step.float().unsqueeze(-1).expand(n, 2).clone(), "episode": step // 5,
                       "score": (step * 7 % 11).float(),
                       "next": {"done": (step % 5 == 4).unsqueeze(-1), "reward": step.float().unsqueeze(-1)}}, [n])


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("buffer", BUFFERS)
def test_samplers_and_writers_see_the_same_storage(buffer, kind, sampler, writer, tmp_path):
    outputs, buffers = [], []
    for storage_cls in PAIRS[kind]:
        rb = BUFFERS[buffer](storage=make(storage_cls, CAPACITY, tmp_path), sampler=SAMPLERS[sampler](),
                             writer=WRITERS[writer](), batch_size=6, generator=torch.Generator().manual_seed(3))
        for start, n in ((0, 10), (10, 10), (20, 9)):  # the last write wraps around
            rb.extend(episodes(start, n))
        if sampler == "torchrl_prioritized":
            rb.update_priority(torch.arange(len(rb)), torch.arange(1.0, len(rb) + 1.0))
        samples = []
        for _ in range(3):
            samples.append(rb.sample())
        outputs.append(samples)
        buffers.append(rb)
    assert len(buffers[0]) == len(buffers[1])
    assert_same(buffers[0].storage.get(torch.arange(len(buffers[0]))),
                buffers[1].storage.get(torch.arange(len(buffers[1]))), "stored")
    for x, y in zip(*outputs, strict=True):
        assert_same(x, y, "sample")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory needs CUDA (TorchRL's pin_memory too)")
@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("buffer", BUFFERS)
def test_pinned_samples_match(buffer, kind, tmp_path):
    outputs = []
    for storage_cls in PAIRS[kind]:
        rb = BUFFERS[buffer](storage=make(storage_cls, CAPACITY, tmp_path), batch_size=6, pin_memory=True,
                             generator=torch.Generator().manual_seed(3))
        rb.extend(episodes(0, 20))
        sample = rb.sample()
        assert all(leaf.is_pinned() for leaf in sample.values(True, True))
        outputs.append(sample)
    assert_same(*outputs, "pinned sample")
