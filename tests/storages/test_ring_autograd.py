"""The per-env ring storages store steps detached from the writer's autograd graph, as ALF's rings.

Was: a step written while it required grad stayed in the graph for some item shapes and
dtypes only (rows copied through an int64 view were cut from it, the others not), so samples
carried ``requires_grad`` and their backward reached the collector's parameters.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.storages import DedupEnvRingStorage, EnvRingStorage, EpisodicEnvRingStorage

NUM_ENVS, STEPS = 3, 4
STORAGES = {
    "ring": lambda: EnvRingStorage(NUM_ENVS, 8),
    "episodic": lambda: EpisodicEnvRingStorage(NUM_ENVS, 8, record_episodic_return=True),
    "dedup": lambda: DedupEnvRingStorage(NUM_ENVS, 8),
}


def steps(weight: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> list[TensorDict]:
    """``STEPS`` consecutive steps of every env, each leaf a function of ``weight``."""
    frames = [torch.randn(NUM_ENVS, *shape, dtype=dtype) * weight for _ in range(STEPS + 1)]
    return [TensorDict({"observation": frames[t], "reward": torch.ones(NUM_ENVS, 1) * weight,
                        "discount": torch.ones(NUM_ENVS, 1), "step_type": torch.full((NUM_ENVS,), int(t > 0)),
                        "next": {"observation": frames[t + 1], "done": torch.zeros(NUM_ENVS, 1, dtype=torch.bool)}},
                       [NUM_ENVS]) for t in range(STEPS)]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("how", ["every env", "env subsets", "[N, T] block"])
@pytest.mark.parametrize("shape,dtype", [((3,), torch.float32), ((20,), torch.float32), ((3,), torch.float64),
                                         ((20,), torch.float64)])
@pytest.mark.parametrize("name", sorted(STORAGES))
def test_stored_steps_leave_the_writers_graph(name, shape, dtype, how, fast):
    weight = torch.ones((), dtype=dtype, requires_grad=True)
    rb = EnvRingReplayBuffer(storage=STORAGES[name](), batch_size=4)
    batch = steps(weight, shape, dtype)
    with torchrl_ext.fastpath(fast):
        if how == "every env":
            for step in batch:
                rb.extend(step)
        elif how == "env subsets":
            for step in batch:
                rb.extend(step[:1], env_ids=[0])
                rb.extend(step[1:], env_ids=[1, 2])
        else:
            rb.extend(torch.stack(batch, 1))
        sample = rb.sample()
    assert len(rb) == NUM_ENVS * STEPS
    leaves = sample.exclude("index").values(True, True)
    assert not any(leaf.requires_grad for leaf in leaves)
    stored = rb.storage.flat_leaves
    assert not any(leaf.requires_grad for _, leaf in stored)
    # The stored values are the written ones, detached.
    first = rb.storage.get((torch.arange(NUM_ENVS), torch.zeros(NUM_ENVS, dtype=torch.long)))
    torch.testing.assert_close(first["observation"], batch[0]["observation"].detach())
    assert weight.grad is None
