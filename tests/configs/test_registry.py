"""Hydra configs: registered in TorchRL's ConfigStore groups, instantiable, composable."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import OmegaConf
from tensordict import TensorDict

import torchrl_ext.configs as configs
from torchrl_ext.demos import DemoStore
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
    NStepSampler,
    PrioritizedTrajectorySampler,
    TrajectorySampler,
)
from torchrl_ext.storages import (
    DedupEnvRingStorage,
    EnvRingStorage,
    EpisodicEnvRingStorage,
    FastMemmapStorage,
    FastTensorStorage,
    RolloutStorage,
)
from torchrl_ext.writers import EnvRingWriter

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    "group, name, cls",
    [
        ("storage", "ext_env_ring", EnvRingStorage),
        ("storage", "ext_episodic_env_ring", EpisodicEnvRingStorage),
        ("storage", "ext_dedup_env_ring", DedupEnvRingStorage),
        ("writer", "ext_env_ring", EnvRingWriter),
        ("sampler", "ext_trajectory", TrajectorySampler),
        ("sampler", "ext_prioritized_trajectory", PrioritizedTrajectorySampler),
        ("storage", "ext_rollout", RolloutStorage),
        ("sampler", "ext_feed_forward", FeedForwardMinibatchSampler),
        ("sampler", "ext_naive_recurrent", NaiveRecurrentMinibatchSampler),
        ("sampler", "ext_chunked_recurrent", ChunkedRecurrentMinibatchSampler),
        ("sampler", "ext_nstep", NStepSampler),
        ("storage", "ext_fast_tensor", FastTensorStorage),
        ("storage", "ext_fast_memmap", FastMemmapStorage),
    ],
)
def test_component_configs_are_registered_and_instantiate(group, name, cls):
    node = ConfigStore.instance().repo[group][f"{name}.yaml"].node
    obj = instantiate(node, **({"max_size": 10} if "fast" in name else {}))
    assert type(obj) is cls


def test_configs_carry_every_constructor_argument():
    cfg = configs.PrioritizedTrajectorySamplerConfig(batch_length=4, alpha=0.6, weights="per",
                                                     recent_data_ratio=0.5, recent_data_steps=3)
    sampler = instantiate(cfg)
    assert (sampler.batch_length, sampler.alpha, sampler.weights) == (4, 0.6, "per")
    assert (sampler.recent_data_ratio, sampler.recent_data_steps) == (0.5, 3)
    storage = instantiate(configs.EpisodicEnvRingStorageConfig(
        num_envs=3, max_length=5, record_episodic_return=True, reward_clip=[-1.0, 1.0]))
    assert storage.shape == torch.Size([3, 5]) and storage.record_episodic_return


def test_buffer_composed_from_torchrl_style_groups():
    cfg = OmegaConf.structured(configs.EnvRingReplayBufferConfig(
        storage=configs.EnvRingStorageConfig(num_envs=2, max_length=8),
        sampler=configs.TrajectorySamplerConfig(batch_length=2),
        writer=configs.EnvRingWriterConfig(),
        batch_size=3,
    ))
    rb = instantiate(cfg)
    assert isinstance(rb, EnvRingReplayBuffer)
    for t in range(4):
        rb.extend(TensorDict({"x": torch.full((2,), float(t))}, [2]))
    assert rb.sample().shape == torch.Size([3, 2])


def test_alf_yaml_and_overrides_compose():
    with initialize_config_dir(config_dir=str(CONF / "buffer"), version_base=None):
        cfg = compose(config_name="alf", overrides=["num_environments=3", "batch_length=2",
                                                    "prioritized_sampling=true"])
    rb = instantiate(cfg)
    assert rb.storage.num_envs == 3
    assert isinstance(rb.sampler, PrioritizedTrajectorySampler)
    for t in range(3):
        rb.extend(TensorDict({"x": torch.full((3,), float(t))}, [3]))
    assert rb.sample().shape == torch.Size([64, 2])


def test_alf_preset_is_registered():
    node = ConfigStore.instance().repo["replay_buffer"]["ext_alf.yaml"].node
    rb = instantiate(node, num_environments=2, max_length=4)
    assert isinstance(rb, EnvRingReplayBuffer) and rb.storage.max_length == 4


def test_harl_preset_is_registered_and_iterates_an_epoch():
    node = ConfigStore.instance().repo["replay_buffer"]["ext_harl.yaml"].node
    rb = instantiate(node, episode_length=4, num_mini_batch=2, use_recurrent_policy=True,
                     data_chunk_length=2)
    assert isinstance(rb.sampler, ChunkedRecurrentMinibatchSampler)
    for t in range(4):
        rb.storage.insert(TensorDict({"x": torch.full((3,), float(t)),
                                      "next": {"x": torch.full((3,), t + 1.0)}}, [3]))
    assert sum(batch.numel() for batch in rb) == 12


def test_keys_from_yaml_lists_become_tuples():
    """Hydra passes tuple defaults as ListConfig; components turn them back into nested keys."""
    sampler = instantiate(OmegaConf.structured(configs.NStepSamplerConfig(n_step=2)))
    assert sampler.reward_key == ("next", "reward") and sampler.done_key == ("next", "done")
    storage = instantiate(OmegaConf.structured(configs.DedupEnvRingStorageConfig(num_envs=1, max_length=4)))
    assert storage.done_key == ("next", "done")
    with pytest.raises(TypeError, match=r"done_key must be a key: a str or a tuple of str .*, got done_key=3"):
        NStepSampler(2, done_key=3)


def test_n_step_buffer_on_a_fast_two_dim_storage_from_configs():
    cfg = OmegaConf.structured(configs.ExtTensorDictReplayBufferConfig(
        storage=configs.FastTensorStorageConfig(max_size=40, ndim=2),
        sampler=configs.NStepSamplerConfig(n_step=3, gamma=0.5), batch_size=8))
    rb = instantiate(cfg)
    assert isinstance(rb, TensorDictReplayBuffer) and isinstance(rb.sampler, NStepSampler)
    rb.extend(TensorDict({"obs": torch.zeros(2, 5, 1), "next": {
        "reward": torch.ones(2, 5, 1), "done": torch.zeros(2, 5, 1, dtype=torch.bool)}}, [2, 5]))
    batch = rb.sample()
    want = torch.tensor([1.0, 1.5, 1.75])[batch["steps_to_next_obs"][:, 0] - 1]
    assert torch.equal(batch["next", "reward"][:, 0], want)


def test_harl_off_policy_preset_is_registered():
    node = ConfigStore.instance().repo["replay_buffer"]["ext_harl_off_policy.yaml"].node
    rb = instantiate(node, buffer_size=12, n_rollout_threads=3, state_type="FP", n_step=2)
    assert isinstance(rb, EnvRingReplayBuffer) and rb.storage.max_length == 4
    assert rb.sampler.agent_group == "agents" and rb.sampler.n_step == 2


@pytest.mark.parametrize("name, storage, cls_name", [
    ("ext_on_policy", None, "OnPolicyReplayBuffer"),
    ("ext_vtrace_on_policy", None, "VTraceReplayBuffer"),
    ("ext_pytorchrl", "vanilla", "OnPolicyReplayBuffer"),
    ("ext_pytorchrl", "vtrace", "VTraceReplayBuffer"),
])
def test_on_policy_buffers_are_registered(name, storage, cls_name):
    node = ConfigStore.instance().repo["replay_buffer"][f"{name}.yaml"].node
    extra = {"storage": storage, "size": 4} if storage else {"num_steps": 4}
    rb = instantiate(node, gamma=0.5, **extra)
    assert type(rb).__name__ == cls_name and rb.gamma == 0.5 and rb.storage.num_steps == 4
    if storage == "vanilla":
        assert rb.gae_lambda is None


def test_instantiate_from_yaml_files_and_dicts_like_l2r(tmp_path):
    from torchrl_ext.config_files import instantiate_from_config, validated_config

    path = tmp_path / "buffer.yaml"
    path.write_text("name: ext_l2r_simple_replay\nconfig:\n  obs_dim: 2\n  act_dim: 1\n  size: 250_000\n  batch_size: 8\n")
    rb = instantiate_from_config(path)
    assert rb.storage.max_size == 250_000 and rb.batch_size == 8
    dims = {"obs_dim": 2, "act_dim": 1}
    rb = instantiate_from_config({**dims, "size": 10, "batch_size": 2, "lam": 0.5}, name="replay_buffer/ext_l2r_ppo")
    assert rb.lam == 0.5 and rb.storage.max_size == 10
    cfg = validated_config({"name": "L2RPPOBufferConfig", "config": {**dims, "size": 5, "batch_size": 2}})
    assert cfg.size == 5 and cfg.gamma == 0.99  # defaults filled in, like strictyaml's Optional
    # l2r's schemas require these; the registered config's placeholders do not stand in for them
    with pytest.raises(ValueError, match="L2RPPOBufferConfig: missing required 'size', 'batch_size'. Valid keys: act_dim"):
        instantiate_from_config({"name": "ext_l2r_ppo", "config": dims})
    with pytest.raises(ValueError, match="missing required 'obs_dim', 'act_dim', 'size', 'batch_size'"):
        validated_config({"name": "ext_l2r_simple_replay", "config": None})
    assert instantiate_from_config({"size": 4}, name="ext_l2r_simple_replay", obs_dim=2, act_dim=1,
                                   batch_size=2).storage.max_size == 4  # given apart, as overrides
    with pytest.raises(ValueError, match="bad entry 'gama': Key 'gama' not in 'L2RPPOBufferConfig'. Valid keys: act_dim"):
        instantiate_from_config({"gama": 0.9}, name="ext_l2r_ppo")
    with pytest.raises(ValueError, match="bad entry 'size': .*Valid keys"):
        instantiate_from_config({"size": "big"}, name="ext_l2r_ppo")
    with pytest.raises(ValueError, match="config name 'ext_nope' is not a registered config; known: "):
        instantiate_from_config({}, name="ext_nope")
    with pytest.raises(ValueError, match="config file .*missing.yaml' does not exist"):
        instantiate_from_config(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="give name= or use the wrapper"):
        instantiate_from_config({"size": 3})
    with pytest.raises(ValueError, match="'_target_' is fixed by L2RPPOBufferConfig"):
        instantiate_from_config({"_target_": "os.system"}, name="ext_l2r_ppo")


def test_velora_preset_from_a_validated_dict():
    from torchrl_ext.config_files import instantiate_from_config

    rb = instantiate_from_config({"name": "ext_velora", "config": {
        "capacity": 8, "state_dim": 3, "action_dim": 2, "hidden_dim": 4}})
    assert rb.capacity == 8
    with pytest.raises(ValueError, match="bad entry 'state_dims'"):
        instantiate_from_config({"state_dims": 3}, name="ext_velora")


def test_every_registered_config_class_has_its_own_docstring():
    import inspect

    undocumented = set()
    for cfg in configs.REGISTRY.values():
        cls = cfg if inspect.isclass(cfg) else type(cfg)
        doc = cls.__dict__.get("__doc__") or ""
        if not doc.strip() or doc.startswith(f"{cls.__name__}("):  # the dataclass's generated one
            undocumented.add(cls.__name__)
    assert not undocumented, sorted(undocumented)


def _key_fields() -> list[tuple[tuple[str, str], str]]:
    """Key fields YAML may write as lists (a field typed ``str`` refuses them in OmegaConf)."""
    return [(entry, field.name) for entry, node in sorted(configs.REGISTRY.items())
            for field in dataclasses.fields(node)
            if field.name.endswith(("_key", "_keys")) and field.type in (Any, "Any")]


def _build(make: Any) -> Any:
    """What ``make()`` builds, or the type of what it raises."""
    try:
        return make()
    except Exception as err:  # noqa: BLE001 - compared between the two ways of writing the key
        return type(err.__cause__ or err)


def _key_attributes(obj: Any, path: str = "", depth: int = 0) -> dict[str, Any]:
    """Every attribute named like a key, in ``obj`` and the torchrl_ext components it holds."""
    found = {}
    for name, value in getattr(obj, "__dict__", {}).items():
        if "key" in name:
            found[path + name] = value
        elif depth < 3 and type(value).__module__.startswith("torchrl_ext"):
            found |= _key_attributes(value, f"{path}{name}.", depth + 1)
    return found


@pytest.mark.parametrize("entry, field", _key_fields(), ids=lambda x: "/".join(x) if isinstance(x, tuple) else x)
def test_keys_written_in_yaml_build_what_keys_written_in_code_build(entry, field):
    """YAML writes a nested key as a list, Hydra hands it over as a ``ListConfig``: the component
    must keep exactly what the same key given as a tuple in code gives (a ``ListConfig`` kept
    as a key fails later, far from the config)."""
    node = configs.REGISTRY[entry]
    key = ("agents", "signal")
    value = [key, "other"] if field.endswith("_keys") else key
    needs = {"store": DemoStore(rho=0.5, phi=0.0, capacity=2)} if "store" in node.__dataclass_fields__ else {}
    from_yaml = _build(lambda: instantiate(OmegaConf.structured(node(**{field: value})), **needs))
    from_code = _build(lambda: instantiate(OmegaConf.structured(node), _partial_=True)(**{field: value}, **needs))
    if isinstance(from_code, type):  # TorchRL refuses some keys in constructors (set_keys instead)
        assert from_yaml is from_code
        return
    got, want = _key_attributes(from_yaml), _key_attributes(from_code)
    assert got.keys() == want.keys()
    for name in want:
        assert type(got[name]) is type(want[name]) and got[name] == want[name], name
