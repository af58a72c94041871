"""Components from YAML files or dicts, validated against their Hydra structured configs.

This is what l2r's ``instantiate_from_config`` / ``schema`` did with strictyaml,
on the configs :mod:`torchrl_ext.configs` registers: unknown keys, wrong types
and missing values raise a ``ValueError`` naming the key, before anything is
built.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchrl_ext import configs

__all__ = ["config_node", "instantiate_from_config", "validated_config"]


def config_node(name: str) -> type:
    """The structured config registered as ``name``: ``"group/name"`` (``"replay_buffer/ext_l2r_ppo"``),
    a registered name alone (``"ext_l2r_ppo"``) or a config class name (``"L2RPPOBufferConfig"``)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a config name such as 'ext_l2r_ppo', got name={name!r}.")
    if name in configs.__all__:
        return getattr(configs, name)
    group, _, short = name.rpartition("/")
    found = [node for (g, n), node in configs.REGISTRY.items() if n == short and group in ("", g)]
    if len(found) == 1:
        return found[0]
    known = sorted(f"{g}/{n}" for g, n in configs.REGISTRY)
    reason = "is ambiguous: prefix its group" if found else "is not a registered config"
    raise ValueError(f"config name {name!r} {reason}; known: {', '.join(known)}.")


def _read(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(OmegaConf.to_container(OmegaConf.create(dict(source)), resolve=True))
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a YAML file path or a mapping, got source={source!r}.")
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist; pass a YAML file path or a dict.")
    loaded = OmegaConf.load(path)
    if not OmegaConf.is_dict(loaded):
        raise ValueError(f"config file {str(path)!r} must hold a mapping, got {type(loaded).__name__}.")
    return dict(OmegaConf.to_container(loaded, resolve=True))


def validated_config(source: str | Path | Mapping[str, Any], name: str | None = None) -> Any:
    """The merged, type-checked config (an OmegaConf node) without building anything.

    Every argument the component requires must be given: the registered config holds a
    placeholder for it (so that a Hydra node instantiates), a file or dict does not (l2r's
    schemas make ``obs_dim``, ``act_dim``, ``size``, ... required).

    Args:
        source: a YAML file or dict: either the config's fields, or l2r's
            wrapper ``{"name": <config name>, "config": {fields}}``.
        name: the config name (see :func:`config_node`); taken from the
            wrapper's ``name`` when omitted.

    Raises:
        ValueError: naming the unknown key, the wrongly typed value, the missing
            required key or the missing name, and the valid keys; a wrapper's
            ``config`` that is not a mapping.
        TypeError: for a ``source`` that is neither a path nor a mapping.
    """
    return _validated(source, name, given=())


def _validated(source: str | Path | Mapping[str, Any], name: str | None, given: Any) -> Any:
    """:func:`validated_config`, with the keys in ``given`` passed apart (``overrides``)."""
    data = _read(source)
    wrapped = set(data) == {"name", "config"}
    if name is None and not wrapped:
        raise ValueError(
            "give name= or use the wrapper {'name': <config name>, 'config': {...}}; got keys "
            f"{sorted(data)}."
        )
    if wrapped:  # name= wins over the wrapper's
        name, data = data["name"] if name is None else name, data["config"] or {}
    node = config_node(name)
    if not isinstance(data, Mapping):  # dict() of a list or a string fails naming nothing
        raise ValueError(f"'config' must be a mapping of {node.__name__}'s fields, got config={data!r}.")
    if "_target_" in data:
        raise ValueError(f"'_target_' is fixed by {node.__name__}; remove it from the config.")
    schema = OmegaConf.structured(node)
    valid = sorted(key for key in schema.keys() if not str(key).startswith("_"))
    try:
        merged = OmegaConf.merge(schema, data)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        reason = str(getattr(err, "msg", err)).splitlines()[0]
        raise ValueError(
            f"{node.__name__}: bad entry {key!r}: {reason}. Valid keys: "
            f"{', '.join(valid)}."
        ) from None
    required = [p.name for p in inspect.signature(get_object(node._target_)).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [key for key in required if key not in data and key not in given]
    if missing:
        raise ValueError(f"{node.__name__}: missing required {', '.join(map(repr, missing))}. Valid keys: "
                         f"{', '.join(valid)}.")
    return merged


def instantiate_from_config(source: str | Path | Mapping[str, Any], name: str | None = None, **overrides: Any) -> Any:
    """Builds the component a YAML file or dict describes, after :func:`validated_config`.

    Examples:
        >>> from torchrl_ext.config_files import instantiate_from_config
        >>> rb = instantiate_from_config({"name": "ext_l2r_ppo", "config": {
        ...     "obs_dim": 3, "act_dim": 2, "size": 250_000, "batch_size": 64}})
        >>> rb.storage.max_size, rb.gamma
        (250000, 0.99)
        >>> instantiate_from_config({"obs_dim": 3, "act_dim": 2, "size": 10, "batch_size": 4,
        ...     "gama": 0.9}, name="ext_l2r_ppo")
        Traceback (most recent call last):
        ...
        ValueError: L2RPPOBufferConfig: bad entry 'gama': Key 'gama' not in 'L2RPPOBufferConfig'. Valid keys: act_dim, batch_size, device, eps, gamma, generator, lam, obs_dim, size.
    """
    return instantiate(_validated(source, name, given=overrides), **overrides)

