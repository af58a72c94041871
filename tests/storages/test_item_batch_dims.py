"""Reads keep the batch dims stored entries have of their own, as TensorDict's indexing does:
``("agents", ...)`` entries of batch ``[..., n_agents]`` come back as ``[B, n_agents]``."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import FeedForwardMinibatchSampler, NStepSampler, TrajectorySampler
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, RolloutStorage

AGENTS = 3


def steps(n: int, start: float = 0.0, lead: tuple[int, ...] = ()) -> TensorDict:
    """``n`` steps (after ``lead`` dims) with per-agent entries under ``"agents"`` and
    ``("next", "agents")`` and team-level reward and done."""
    shape = (*lead, n)
    value = torch.arange(start, start + n).expand(*shape)
    agents = TensorDict({"obs": value[..., None, None].expand(*shape, AGENTS, 2).clone(),
                         "deep": TensorDict({"x": value[..., None].expand(*shape, AGENTS).clone()}, [*shape, AGENTS])},
                        [*shape, AGENTS])
    return TensorDict({"agents": agents, "next": {"agents": agents.clone(), "reward": value[..., None].float().clone(),
                                                  "done": torch.zeros(*shape, 1, dtype=torch.bool)}}, list(shape))


def assert_agent_dims(batch: TensorDict) -> None:
    lead = batch.batch_size
    for key in ("agents", ("next", "agents")):
        assert batch.get(key).batch_size == (*lead, AGENTS), key
    assert batch.get(("agents", "deep")).batch_size == (*lead, AGENTS)


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, FastTensorStorage, FastMemmapStorage])
def test_fast_storages_and_the_buffer(storage_cls):
    rb = TensorDictReplayBuffer(storage=storage_cls(8), batch_size=5)
    rb.extend(steps(6))
    rb.extend(steps(4, 10.0))  # wraps around
    assert_agent_dims(rb.sample())
    assert_agent_dims(rb.storage.get(torch.tensor([0, 7, 3])))
    assert_agent_dims(rb[torch.tensor([1, 2])])


@pytest.mark.parametrize("sampler", ["trajectory", "nstep"])
def test_env_rings(sampler):
    chosen = TrajectorySampler(2) if sampler == "trajectory" else NStepSampler(2, 0.9)
    rb = EnvRingReplayBuffer(num_envs=2, max_length=6, sampler=chosen)
    for t in range(4):
        rb.extend(steps(2, float(t)))
    batch = rb.sample(4)
    assert_agent_dims(batch)
    assert batch["agents", "obs"].shape == (*batch.batch_size, AGENTS, 2)


def test_rollout_minibatches():
    rb = TensorDictReplayBuffer(storage=RolloutStorage(4), sampler=FeedForwardMinibatchSampler(2))
    rb.extend(steps(2, lead=(4,)))
    batches = list(rb)
    assert batches
    for batch in batches:
        assert_agent_dims(batch)


@pytest.mark.parametrize("kind", ["ring", "rollout", "fast"])
def test_checkpoints_keep_them(kind, tmp_path):
    """``dumps`` / ``loads`` into a new buffer: the batch dims of nested entries come back."""
    def build():
        if kind == "ring":
            return EnvRingReplayBuffer(num_envs=2, max_length=6, sampler=TrajectorySampler(1))
        if kind == "rollout":
            return TensorDictReplayBuffer(storage=RolloutStorage(4), sampler=FeedForwardMinibatchSampler(2))
        return TensorDictReplayBuffer(storage=FastTensorStorage(8), batch_size=4)

    rb = build()
    if kind == "ring":
        for t in range(4):
            rb.extend(steps(2, float(t)))
    else:
        rb.extend(steps(2, lead=(4,)) if kind == "rollout" else steps(6))
    rb.dumps(tmp_path / "ckpt")
    restored = build()
    restored.loads(tmp_path / "ckpt")
    batch = next(iter(restored)) if kind == "rollout" else restored.sample(4) if kind == "ring" else restored.sample()
    assert_agent_dims(batch)
