"""The YAML files under ``conf/``: every group file instantiates, every example config composes,
every smoke experiment is run by a test, and Hydra names bad options and keys."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torchrl.data import ReplayBuffer

import torchrl_ext.configs as configs  # registers the ext_* nodes

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PRIMARY = sorted(p.stem for p in CONF.glob("*.yaml"))
SMOKE = sorted(p.stem for p in (CONF / "experiment").glob("*_smoke.yaml"))


def group_files(group: str) -> list[Path]:
    return sorted((CONF / group).glob("*.yaml"))


def test_the_layout_is_there() -> None:
    for group in ("buffer", "value", "env", "experiment"):
        assert group_files(group), f"conf/{group}/ is empty"
    assert "ppo_cartpole" in PRIMARY and "ppo_cartpole_smoke" in SMOKE


def compose_group_file(path: Path):
    """A group file composed on its own (its defaults list pulls in the registered ext_* configs)."""
    with initialize_config_dir(str(CONF), version_base=None):
        return compose(config_name=f"{path.parent.name}/{path.stem}")[path.parent.name]


@pytest.mark.parametrize("path", group_files("buffer"), ids=lambda p: p.stem)
def test_every_buffer_yaml_instantiates_on_its_own(path: Path) -> None:
    buffer = instantiate(compose_group_file(path))
    assert isinstance(buffer, ReplayBuffer)


def _restated_defaults(raw: dict, registered: dict[str, Any], where: str = "") -> list[str]:
    """Keys of ``raw`` (one YAML node) whose value equals the registered config's default."""
    found = []
    for key, value in raw.items():
        if key in ("defaults", "_target_"):
            continue
        if isinstance(value, dict):
            found += _restated_defaults(value, registered, f"{where}{key}.")
            continue
        default = registered.get(where.rstrip("."), {})
        if key in default and default[key] == value:
            found.append(f"{where}{key}: {value!r}")
    return found


@pytest.mark.parametrize("path", group_files("buffer") + group_files("value"), ids=lambda p: p.stem)
def test_group_files_compose_registered_configs_and_restate_no_default(path: Path) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if raw.get("_target_", "").startswith("torchrl."):
        return  # TorchRL's own classes, written out for comparison (conf/buffer/torchrl_lazy.yaml)
    registered = {}
    for entry in raw.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/"):  # /group/name@package
            path, _, at = entry.lstrip("/").partition("@")
            group, _, name = path.partition("/")
            node = configs.REGISTRY[(group, name)]
            registered["" if at in ("", "_here_") else at] = OmegaConf.to_container(
                OmegaConf.structured(node), resolve=False)
    assert "" in registered, f"{path.name} does not compose a registered ext_* config (defaults: /group/name@_here_)"
    assert _restated_defaults(raw, registered) == [], f"{path.name} restates defaults the dataclass holds"


def test_the_default_finder_finds_a_restated_default() -> None:
    registered = {"": {"a": 1, "b": 2}, "sampler": {"n": 1}}
    assert _restated_defaults({"a": 1, "b": 3, "sampler": {"n": 1}}, registered) == ["a: 1", "sampler.n: 1"]


def _critic_and_actor():
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    critic = TensorDictModule(nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"])
    actor = ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
    )
    return critic, actor


@pytest.mark.parametrize("path", group_files("value"), ids=lambda p: p.stem)
def test_every_value_yaml_gives_an_estimator_once_given_networks(path: Path) -> None:
    from torchrl.objectives.value import ValueEstimatorBase

    node = instantiate(compose_group_file(path))
    assert isinstance(node, functools.partial), "value configs are partial: the networks come later"
    critic, actor = _critic_and_actor()
    kwargs = {"value_network": critic}
    if "actor_network" in node.func.__init__.__code__.co_varnames:
        kwargs["actor_network"] = actor
    assert isinstance(node(**kwargs), ValueEstimatorBase)


@pytest.mark.parametrize("path", group_files("env"), ids=lambda p: p.stem)
def test_every_env_yaml_instantiates_and_resets(path: Path) -> None:
    cfg = OmegaConf.load(path)
    if "Vmas" in str(cfg._target_):
        pytest.importorskip("vmas")
    env = instantiate(cfg)
    try:
        td = env.reset()
        assert td.batch_size == env.batch_size
    finally:
        env.close()


def compose_example(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize("name", PRIMARY)
def test_every_example_config_composes_and_builds_its_buffer(name: str) -> None:
    for overrides in ((), (f"experiment={name}_smoke",)):
        cfg = compose_example(name, *overrides)
        assert isinstance(instantiate(cfg.buffer), ReplayBuffer)


@pytest.mark.parametrize("name", PRIMARY)
def test_every_example_has_a_smoke_experiment_that_a_test_runs(name: str) -> None:
    assert f"{name}_smoke" in SMOKE, f"conf/experiment/{name}_smoke.yaml is missing"
    assert (ROOT / "examples" / name / "train.py").is_file()
    assert (ROOT / "examples" / name / "README.md").is_file()
    test_file = ROOT / "tests" / "examples" / f"test_{name}.py"
    assert f"experiment={name}_smoke" in test_file.read_text(), f"{test_file.name} does not run the smoke config"


def test_swapping_a_buffer_is_one_override() -> None:
    from torchrl.data import LazyTensorStorage

    from torchrl_ext.storages import RolloutStorage

    assert isinstance(instantiate(compose_example("ppo_cartpole").buffer).storage, RolloutStorage)
    swapped = instantiate(compose_example("ppo_cartpole", "buffer=torchrl_lazy").buffer)
    assert type(swapped.storage) is LazyTensorStorage and swapped.storage.max_size == 1024


def test_unknown_option_or_key_is_a_hydra_error_naming_it() -> None:
    with pytest.raises(MissingConfigException, match="Could not find 'buffer/no_such_buffer'"):
        compose_example("ppo_cartpole", "buffer=no_such_buffer")
    with pytest.raises(ConfigCompositionException, match="Could not override 'optim.learning_rate'"):
        compose_example("ppo_cartpole", "optim.learning_rate=0.1")
    with pytest.raises(MissingConfigException, match="Could not find 'experiment/no_such_smoke'"):
        compose_example("ppo_cartpole", "experiment=no_such_smoke")


def test_a_misspelt_constructor_argument_is_an_error_naming_it() -> None:
    cfg = compose_example("ppo_cartpole", "+buffer.sampler.mini_batchsize=64")
    with pytest.raises(Exception, match="mini_batchsize"):
        instantiate(cfg.buffer)
    with pytest.raises(Exception, match="num_stepz"):
        instantiate(configs.RolloutStorageConfig, num_stepz=3)


@pytest.mark.parametrize("config", [[1, 2], "n_step: 3", 3])
def test_a_wrapper_whose_config_is_not_a_mapping_is_a_value_error_naming_it(config: Any) -> None:
    # Was: dict() of the wrapper's 'config' raised a TypeError / ValueError naming nothing.
    from torchrl_ext.config_files import instantiate_from_config, validated_config

    pattern = rf"'config' must be a mapping of NStepSamplerConfig's fields, got config={re.escape(repr(config))}\."
    for call in (validated_config, instantiate_from_config):
        with pytest.raises(ValueError, match=pattern):
            call({"name": "ext_nstep", "config": config})
    assert validated_config({"name": "ext_nstep", "config": None}).n_step == 1  # an empty wrapper still works


@pytest.mark.parametrize("source", [3, None, [("name", "ext_nstep")]])
def test_a_source_that_is_neither_a_path_nor_a_mapping_is_a_type_error(source: Any) -> None:
    from torchrl_ext.config_files import validated_config

    with pytest.raises(TypeError, match=r"source must be a YAML file path or a mapping, got source="):
        validated_config(source, name="ext_nstep")
