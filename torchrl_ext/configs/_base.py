"""How every config gets its fields: read off its target's constructor, where each default is written once.

:func:`from_signature` turns a class statement (name, bases, docstring) into a dataclass
whose fields are the target's parameters with their defaults:

* ``**kwargs`` is followed up the target's MRO (for a function, into ``kwargs_to``) to the
  parameters it forwards; ``exclude`` names forwarded parameters the target fixes itself.
* A required parameter gets a usable default: a keyword of the decorator, else the parent
  config's. Keywords also set the few defaults that differ on purpose (``num_mini_batch=1``
  where the constructor's ``None`` needs a ``mini_batch_size``).
* dtypes and devices are written as strings (``"float32"``, ``"cpu"``).
* Parameters TorchRL's base config declares are left to it, and below a TorchRL base config
  that declares parameters TorchRL's classes are not read (TorchRL keeps those in step).
* The type is the plain one (bool, int, float, str) the annotation names, else the default's;
  ``Optional`` when ``None`` is allowed; ``Any`` for keys, containers and anything else, so
  that YAML may write those as lists.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional

import torch
from hydra.utils import get_object

_PLAIN = {"bool": bool, "int": int, "float": float, "str": str, "torch.device": str}
_LOOSE = ("Any", "Key", "tuple", "list", "Sequence", "Mapping", "dict")


class Validated:
    """TorchRL's config base declares an abstract ``__post_init__``; the components
    validate their own arguments when instantiated, so there is nothing to check here."""

    def __post_init__(self) -> None:
        return


def _parameters(target: Any, kwargs_to: str | None, read_torchrl: bool) -> dict[str, inspect.Parameter]:
    """``target``'s parameters, ``**kwargs`` followed to those it forwards."""
    chain = list(inspect.getmro(target)) if inspect.isclass(target) else [target]
    chain += list(inspect.getmro(get_object(kwargs_to))) if kwargs_to else []
    found: dict[str, inspect.Parameter] = {}
    for owner in chain:
        if owner is object or not read_torchrl and owner.__module__.startswith("torchrl."):
            break
        if inspect.isclass(owner) and "__init__" not in vars(owner):
            continue
        params = inspect.signature(owner.__init__ if inspect.isclass(owner) else owner).parameters.values()
        for p in params:
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                found.setdefault(p.name, p)
        if all(p.kind is not p.VAR_KEYWORD for p in params):
            break
    return found


def _field_type(annotation: Any, default: Any) -> Any:
    """The field type OmegaConf checks (the rules in the module docstring)."""
    text = str(annotation)
    kinds = {_PLAIN.get(kind.strip()) for kind in text.split("|") if kind.strip() != "None"}
    kind = kinds.pop() if len(kinds) == 1 and None not in kinds else type(default)
    if kind not in _PLAIN.values() or any(word in text for word in _LOOSE):
        return Any
    return Optional[kind] if default is None or "None" in text else kind


def from_signature(target: str, *, kwargs_to: str | None = None, exclude: tuple[str, ...] = (),
                   **defaults: Any) -> Callable[[type], type]:
    """Makes the decorated class the dataclass of ``target``'s parameters, ``_target_`` included."""

    def build(cls: type) -> type:
        inherited = {f.name: f.default for f in dataclasses.fields(cls)}  # the bases' fields
        torchrl = {f.name for base in cls.__mro__ if base.__module__.startswith("torchrl.")
                   and dataclasses.is_dataclass(base) for f in dataclasses.fields(base)} - {"_target_", "_partial_"}
        annotations = cls.__dict__.get("__annotations__", {})
        params = _parameters(get_object(target), kwargs_to, read_torchrl=not torchrl)
        if set(defaults) - set(params):
            raise TypeError(f"{cls.__name__}: {target} takes no {sorted(set(defaults) - set(params))}")
        for name, p in params.items():
            if name in exclude or name in torchrl:
                continue
            if p.default is p.empty and name not in defaults and name not in inherited:
                raise TypeError(f"{cls.__name__}: {target}'s required {name!r} needs a default")
            default = defaults.get(name, inherited.get(name) if p.default is p.empty else p.default)
            if isinstance(default, (torch.dtype, torch.device)):
                default = str(default).removeprefix("torch.")
            annotations[name] = _field_type(p.annotation, default)
            setattr(cls, name, default)
        annotations["_target_"] = str
        cls._target_ = target
        cls.__annotations__ = annotations
        return dataclasses.dataclass(cls)

    return build
