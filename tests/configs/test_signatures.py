"""Every public class and preset has a registered config whose fields match its constructor.

The configs derive their fields from the constructors (``torchrl_ext/configs/_base.py``);
this test reads the constructors again, on its own, and states the deliberate differences.
The constructor's parameters are read with ``inspect.signature``; ``**kwargs``
that a class forwards to its parent are expanded with the parent's
parameters. Parameters owned by torchrl_ext must appear with the same default
(required ones with any default, so that every node instantiates).
Parameters inherited from TorchRL must appear too, unless the config derives
from TorchRL's own config for that class, which keeps them in step.
A parameter annotated with one plain type is a field of that type.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import typing
from typing import Any, Optional

import pytest
import torch
from omegaconf import OmegaConf

import torchrl_ext.configs as configs

PUBLIC_MODULES = ["storages", "samplers", "writers", "replay_buffers", "value", "presets", "demos", "io"]

# Public names that are not components built from arguments.
NOT_COMPONENTS = {
    "OnPolicyKeys": "a key-name mapping passed as the keys= argument (a dataclass itself)",
    "load_velora_replay_buffer": "a loader of saved files, not a constructor",
}
# Public classes built by a registered preset with the same signature.
BUILT_BY = {"VeloraReplayBuffer": "torchrl_ext.presets.velora_replay_buffer"}
# Config defaults that differ from the constructor's, on purpose.
DEFAULT_CHANGES = {
    ("FeedForwardMinibatchSampler", "num_mini_batch"): "None with mini_batch_size None is rejected",
    ("NaiveRecurrentMinibatchSampler", "num_mini_batch"): "as FeedForwardMinibatchSampler",
    ("ChunkedRecurrentMinibatchSampler", "num_mini_batch"): "as FeedForwardMinibatchSampler",
}
# Forwarded parameters a class fixes itself, and so rejects.
NOT_FORWARDED = {
    "DedupEnvRingStorage": {"step_type_key"},
    "pytorchrl_on_policy_buffer": {"num_steps", "advantage_eps"},  # size=, and a per-kind default
}
# Where a preset's **kwargs go.
KWARGS_TARGET = {"pytorchrl_on_policy_buffer": "torchrl_ext.replay_buffers.OnPolicyReplayBuffer"}
# TorchRL configs that keep TorchRL's own parameters in step.
TORCHRL_CONFIGS = {
    "TensorDictReplayBuffer": "torchrl.trainers.algorithms.configs.data.TensorDictReplayBufferConfig",
    "LazyTensorStorage": "torchrl.trainers.algorithms.configs.data.LazyTensorStorageConfig",
    "LazyMemmapStorage": "torchrl.trainers.algorithms.configs.data.LazyMemmapStorageConfig",
}


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def public_components() -> list[tuple[str, Any]]:
    found = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(f"torchrl_ext.{module_name}")
        for name in module.__all__:
            obj = getattr(module, name)
            if name in NOT_COMPONENTS or name in BUILT_BY:
                continue
            if inspect.isclass(obj):
                if issubclass(obj, (enum.Enum, tuple, Exception)) or dataclasses.is_dataclass(obj):
                    continue  # records, enums and errors: not components
                found.append((name, obj))
            elif module_name == "presets" and callable(obj):
                found.append((name, obj))
    return found


def _own_init(cls: type) -> Any:
    return cls.__init__ if inspect.isclass(cls) else cls


def effective_parameters(target: Any) -> dict[str, tuple[Any, bool, str, Any]]:
    """``name -> (default, torchrl_ext owns it, owner name, annotation)``, **kwargs expanded along the MRO."""
    params: dict[str, tuple[Any, bool, str, Any]] = {}
    chain = list(inspect.getmro(target)) if inspect.isclass(target) else [target]
    if not inspect.isclass(target) and target.__name__ in KWARGS_TARGET:
        chain += list(inspect.getmro(_resolve(KWARGS_TARGET[target.__name__])))
    for owner in chain:
        if owner is object:
            break
        if inspect.isclass(owner) and "__init__" not in vars(owner):
            continue
        signature = inspect.signature(_own_init(owner))
        ours = owner.__module__.startswith("torchrl_ext")
        for p in signature.parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            params.setdefault(p.name, (p.default, ours, owner.__name__, p.annotation))
        if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            break
    return params


def config_for(target: Any) -> type:
    path = f"{target.__module__}.{target.__name__}"
    short = f"{path.split('.')[0]}.{path.split('.')[1]}.{target.__name__}"
    matches = [node for node in configs.REGISTRY.values()
               if node._target_ in (path, short)]
    assert len(matches) == 1, f"{target.__name__}: expected one registered config, found {matches}"
    return matches[0]


def _normalise(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, torch.device):
        return str(value)
    return value


@pytest.mark.parametrize("name, target", public_components(), ids=lambda x: x if isinstance(x, str) else "")
def test_config_fields_match_the_constructor(name: str, target: Any) -> None:
    node = config_for(target)
    fields = {f.name: f for f in dataclasses.fields(node) if not f.name.startswith("_")}
    params = effective_parameters(target)
    excluded = NOT_FORWARDED.get(name, set())
    covered_by_torchrl = {
        _resolve(path) for owner, path in TORCHRL_CONFIGS.items() if issubclass(node, _resolve(path))
    }
    covered_owners = {c.__name__.removesuffix("Config") for c in covered_by_torchrl}
    expected = set()
    for param, (default, ours, owner, _) in params.items():
        if param in excluded:
            assert param not in fields, f"{name}: {param!r} is fixed by {name} and must not be a field"
            continue
        if not ours and (owner in covered_owners or owner == "ReplayBuffer" and covered_owners):
            continue  # TorchRL's own config carries it
        expected.add(param)
        assert param in fields, f"{node.__name__} lacks {param!r} (from {owner})"
        if default is inspect.Parameter.empty or (name, param) in DEFAULT_CHANGES:
            continue
        field = fields[param]
        value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert _normalise(value) == _normalise(default), (
            f"{node.__name__}.{param} defaults to {value!r}, {owner} to {default!r}"
        )
    inherited_torchrl = {f.name for base in covered_by_torchrl for f in dataclasses.fields(base)}
    extra = set(fields) - expected - inherited_torchrl
    assert not extra, f"{node.__name__} has fields {sorted(extra)} that {name} does not take"


PLAIN = {"bool": bool, "int": int, "float": float, "str": str}


@pytest.mark.parametrize("name, target", public_components(), ids=lambda x: x if isinstance(x, str) else "")
def test_config_field_types_follow_the_constructor(name: str, target: Any) -> None:
    """``int``, ``float | None``, ...: that type, ``Optional`` where ``None`` is allowed; keys: ``Any``
    (YAML writes a nested key as a list)."""
    node = config_for(target)
    OmegaConf.structured(node)  # OmegaConf accepts every field's type and default
    hints = typing.get_type_hints(node)
    defaults = {f.name: f.default for f in dataclasses.fields(node)}
    for param, (_, _, owner, annotation) in effective_parameters(target).items():
        if param not in hints:
            continue
        kinds = [kind.strip() for kind in str(annotation).split("|")]
        if "Key" in str(annotation):
            assert hints[param] is Any, f"{node.__name__}.{param} is {hints[param]}, {owner} takes a key"
        elif len(set(kinds) - {"None"}) == 1 and kinds[0] in PLAIN:
            want = Optional[PLAIN[kinds[0]]] if "None" in kinds or defaults[param] is None else PLAIN[kinds[0]]
            assert hints[param] == want, f"{node.__name__}.{param} is {hints[param]}, {owner} takes {annotation}"


def test_every_registered_config_targets_a_public_component() -> None:
    targets = {f"{t.__module__.split('.')[0]}.{t.__module__.split('.')[1]}.{t.__name__}"
               for _, t in public_components()}
    for (group, name), node in configs.REGISTRY.items():
        assert name.startswith("ext_"), (group, name)
        assert node._target_ in targets, f"{group}/{name} targets {node._target_}, not a public component"
