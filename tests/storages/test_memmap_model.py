"""FastMemmapStorage + DistinctUniformSampler against the round-robin ring model.

Reuses the state machine of ``tests/storages/test_fast_model.py`` (extends
that wrap, reads by index, samples, ``empty``, ``state_dict`` and
``dumps``/``loads`` round trips, all checked against ``RoundRobinModel``) with
a memory-mapped storage in a per-run scratch directory and the distinct
uniform sampler. One more rule checks the sampler's documented contract: a
batch holds ``min(batch_size, stored items)`` distinct stored items.
"""
from __future__ import annotations

import shutil
import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests._hypothesis import machine_settings
from tests.storages import test_fast_model as fast
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import DistinctUniformSampler
from torchrl_ext.storages import FastMemmapStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


class MemmapDistinctMachine(fast.FastStorageMachine):
    """The fast-storage machine on ``FastMemmapStorage`` sampled by ``DistinctUniformSampler``."""

    def _new_buffer(self) -> TensorDictReplayBuffer:
        if not hasattr(self, "scratch"):
            self.scratch = tempfile.mkdtemp(prefix="memmap_model_")
            self.buffers = 0
        self.buffers += 1
        scratch_dir = f"{self.scratch}/{self.buffers}"  # each buffer its own files
        if self.two_d:
            # DistinctUniformSampler draws flat indices, which a 2-D storage does not take
            # (see test_distinct_sampler_on_2d_storage): the default sampler here.
            storage = FastMemmapStorage(self.capacity * self.envs, ndim=2, scratch_dir=scratch_dir,
                                        strict=self.strict)
            sampler = {}
        else:
            storage = FastMemmapStorage(self.capacity, scratch_dir=scratch_dir, strict=self.strict)
            sampler = {"sampler": DistinctUniformSampler()}
        return TensorDictReplayBuffer(storage=storage, batch_size=3, **sampler,
                                      generator=torch.Generator().manual_seed(self.seed))

    @precondition(lambda self: not self.two_d)
    @rule(batch=st.integers(1, 8))
    def sample_distinct(self, batch: int) -> None:
        stored = self.model.filled() * self.envs
        if stored == 0:
            with pytest.raises(RuntimeError):
                self.rb.sample(batch)
            return
        out = self.rb.sample(batch)
        index = out["index"]
        cells = index.tolist()
        assert len(cells) == min(batch, stored)
        assert len(set(cells)) == len(cells)  # distinct within the batch
        assert all(0 <= r < self.model.filled() for r in cells)  # stored rows only
        uids = [self.model.rows[r][0] for r in cells]
        assert out["nested", "k"].tolist() == uids

    def teardown(self) -> None:
        if hasattr(self, "scratch"):
            shutil.rmtree(self.scratch, ignore_errors=True)


MemmapDistinctMachine.TestCase.settings = machine_settings(max_examples=8, step_count=20)
TestMemmapDistinctMachine = MemmapDistinctMachine.TestCase


def test_distinct_sampler_on_2d_storage() -> None:
    """Documented: a batch holds min(batch_size, len(storage)) distinct stored items."""
    from tensordict import TensorDict

    from torchrl_ext.storages import FastTensorStorage

    rb = TensorDictReplayBuffer(storage=FastTensorStorage(2, ndim=2), sampler=DistinctUniformSampler())
    rb.extend(TensorDict({"x": torch.tensor([[1.0], [2.0]])}, [2, 1]))  # [num_envs=2, T=1]
    assert sorted(rb.sample(2)["x"].reshape(-1).tolist()) == [1.0, 2.0]


def test_distinct_sampler_on_a_partly_filled_2d_storage() -> None:
    from tensordict import TensorDict

    from torchrl_ext.storages import FastTensorStorage

    rb = TensorDictReplayBuffer(storage=FastTensorStorage(12, ndim=2), sampler=DistinctUniformSampler())
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3, 2]))  # 3 envs x 2 steps
    batch = rb.sample(100)  # only 6 stored: each once
    assert sorted(batch["x"].tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
