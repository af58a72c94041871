"""Every torchrl_ext storage, sampler, writer, buffer and preset from a picklable factory.

Measures: each public component has a config (so ``buffer_factory`` turns it into a
factory), the factory survives ``cloudpickle`` and builds the component, buffers
accept their parts as factories (what ``RayReplayBuffer`` sends), and
``buffer_factory`` rejects what it cannot build with a message naming the fix.
The Ray test module builds the same factories in a fresh Ray worker.
"""
from __future__ import annotations

import functools
import pickle
from typing import Any

import cloudpickle
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

import torchrl_ext.presets
import torchrl_ext.replay_buffers
import torchrl_ext.samplers
import torchrl_ext.storages
import torchrl_ext.writers
from torchrl_ext.configs import REGISTRY
from torchrl_ext.distributed import buffer_factory

_FAST = {"_target_": "torchrl_ext.storages.FastTensorStorage", "max_size": 16}
#: Arguments the configs leave for the user to give.
REQUIRED = {
    "storage/ext_fast_tensor": {"max_size": 16},
    "storage/ext_fast_memmap": {"max_size": 16},
    "replay_buffer/ext_prioritized_replay": {"alpha": 0.6, "beta": 0.4, "storage": _FAST},
    "replay_buffer/ext_env_ring": {"num_envs": 2, "max_length": 8},
}
#: The configs of every storage, writer, sampler, buffer class and preset.
COMPONENT_GROUPS = {
    f"{group}/{name}": OmegaConf.merge(OmegaConf.structured(config), REQUIRED.get(f"{group}/{name}", {}))
    for (group, name), config in REGISTRY.items()
    if group in ("storage", "writer", "sampler", "replay_buffer")
}
#: Public names that are not components built from a config.
NOT_COMPONENTS = {"gather_rows", "EnvRingStorageCheckpointer", "OnPolicyKeys", "VeloraReplayBuffer",
                  "load_velora_replay_buffer"}


def build_all(payload: bytes) -> dict[str, str]:
    """Unpickles ``{name: factory}`` and builds each; returns the built types' names."""
    torch.set_num_threads(1)
    return {name: type(factory()).__name__ for name, factory in cloudpickle.loads(payload).items()}


def test_every_public_component_has_a_config() -> None:
    targets = {cfg._target_.rsplit(".", 1)[1] for cfg in COMPONENT_GROUPS.values()}
    public = set()
    for module in (torchrl_ext.storages, torchrl_ext.samplers, torchrl_ext.writers,
                   torchrl_ext.replay_buffers, torchrl_ext.presets):
        public |= {name for name in module.__all__
                   if not (isinstance(getattr(module, name), type)
                           and issubclass(getattr(module, name), Exception))}  # errors are not built
    assert public - NOT_COMPONENTS - targets == set()


@pytest.mark.parametrize("name", sorted(COMPONENT_GROUPS))
def test_factory_pickles_and_builds(name: str) -> None:
    config = COMPONENT_GROUPS[name]
    factory = buffer_factory(config)
    built = cloudpickle.loads(cloudpickle.dumps(factory))()
    assert type(built).__name__ == config._target_.rsplit(".", 1)[1] or name.startswith("replay_buffer/")
    pickle.dumps(factory)  # plain containers: no cloudpickle needed either


def test_buffers_take_their_parts_as_factories() -> None:
    from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
    from torchrl_ext.samplers import PrioritizedTrajectorySampler
    from torchrl_ext.storages import EnvRingStorage, RolloutStorage
    from torchrl_ext.writers import EnvRingWriter, RolloutWriter

    rb = EnvRingReplayBuffer(storage=functools.partial(EnvRingStorage, 2, 8), writer=EnvRingWriter,
                             sampler=functools.partial(PrioritizedTrajectorySampler, 2), batch_size=4)
    for t in range(4):
        rb.extend(TensorDict({"t": torch.full((2,), t)}, [2]), env_ids=torch.tensor([1, 0]))
    assert rb.sample()["t"].shape == (4, 2)
    # A storage factory gets the same defaults as the storage (writer, collate_fn).
    rollout = TensorDictReplayBuffer(storage=functools.partial(RolloutStorage, 4))
    assert isinstance(rollout.writer, RolloutWriter) and isinstance(rollout.storage, RolloutStorage)


def test_window_priorities_through_the_buffer() -> None:
    from torchrl_ext.presets import alf_replay_buffer

    rb = alf_replay_buffer(2, 8, batch_length=2, batch_size=8, prioritized_sampling=True)
    for t in range(5):
        rb.extend(TensorDict({"t": torch.full((2,), t)}, [2]))
    rb.update_window_priority(torch.tensor([1]), torch.tensor([2]), 1e9)
    batch = rb.sample()
    assert batch["env_ids"][:, 0].tolist() == [1] * 8 and batch["positions"][:, 0].tolist() == [2] * 8
    # TorchRL's update_tensordict_priority ignored trajectory samplers (a silent no-op).
    batch["td_error"] = torch.zeros(8, 2)
    batch["td_error"][0, 1] = 1.0  # max over the window's steps
    rb.update_tensordict_priority(batch)
    rb.update_window_priority(torch.tensor([0]), torch.tensor([1]), 1e9)
    batch = rb.sample()
    assert batch["env_ids"][:, 0].tolist() == [0] * 8 and batch["positions"][:, 0].tolist() == [1] * 8
    plain = alf_replay_buffer(2, 8)
    with pytest.raises(TypeError, match="TrajectorySampler keeps no window priorities"):
        plain.update_window_priority([0], [0], 1.0)


@pytest.mark.parametrize(
    "spec, error, match",
    [
        (42, TypeError, "spec must be a zero-argument factory"),
        ({"num_environments": 2}, TypeError, "spec must be"),
        (__import__("omegaconf").OmegaConf.create({"num_environments": 2}), ValueError, "has no _target_"),
    ],
)
def test_buffer_factory_rejects(spec: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        buffer_factory(spec)
