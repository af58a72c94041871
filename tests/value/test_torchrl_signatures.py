"""Every public method a torchrl_ext estimator overrides keeps its TorchRL parent's signature,
and every function of torchrl_ext.value.functional has its TorchRL namesake's.

TorchRL's losses call estimator methods positionally and by keyword (``DQNLoss`` calls
``value_estimate(td, target_params=..., next_value=...)``): an override that renames, reorders
or drops a parameter, or changes a default, silently changes what such a call means. The
functional module promises drop-in replacements, so its signatures must equal TorchRL's.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torchrl.objectives.value.functional as torchrl_functional
from torchrl.objectives.value import ValueEstimatorBase

import torchrl_ext
from torchrl_ext.value import functional

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _estimator_classes() -> list[type]:
    found = set()
    for info in pkgutil.walk_packages(torchrl_ext.__path__, "torchrl_ext."):
        for value in vars(importlib.import_module(info.name)).values():
            if inspect.isclass(value) and issubclass(value, ValueEstimatorBase) \
                    and value.__module__.startswith("torchrl_ext"):
                found.add(value)
    return sorted(found, key=lambda cls: cls.__qualname__)


def _overrides() -> list[tuple[type, str, type]]:
    """``(our class, method, the TorchRL class whose method it replaces)``."""
    cases = []
    for cls in _estimator_classes():
        ours = [base for base in cls.__mro__ if base.__module__.startswith("torchrl_ext")]
        upstream = [base for base in cls.__mro__ if base.__module__.split(".")[0] == "torchrl"]
        names = {name for base in ours for name, member in vars(base).items()
                 if not name.startswith("_") and inspect.isfunction(member)}
        for name in sorted(names):
            parent = next((base for base in upstream if name in vars(base)), None)
            if parent is not None and inspect.isfunction(vars(parent)[name]):
                cases.append((cls, name, parent))
    return cases


def _incompatibilities(ours: inspect.Signature, theirs: inspect.Signature) -> list[str]:
    mine, parent = ours.parameters, theirs.parameters
    problems = []
    mine_pos = [p.name for p in mine.values() if p.kind in POSITIONAL]
    parent_pos = [p.name for p in parent.values() if p.kind in POSITIONAL]
    if mine_pos[:len(parent_pos)] != parent_pos:
        problems.append(f"positional parameters {mine_pos} do not start with TorchRL's {parent_pos}")
    for name, theirs_p in parent.items():
        ours_p = mine.get(name) if theirs_p.kind not in VARIADIC else next(
            (p for p in mine.values() if p.kind is theirs_p.kind), None)
        if ours_p is None:
            problems.append(f"{theirs_p} is missing")
        elif ours_p.kind is not theirs_p.kind:
            problems.append(f"{name} is {ours_p.kind.description}, TorchRL's is {theirs_p.kind.description}")
        elif ours_p.default is not theirs_p.default and ours_p.default != theirs_p.default:
            problems.append(f"{name} defaults to {ours_p.default!r}, TorchRL's to {theirs_p.default!r}")
    for name, ours_p in mine.items():
        extra = name not in parent and ours_p.kind not in VARIADIC
        if extra and ours_p.default is inspect.Parameter.empty:
            problems.append(f"{name} is required and TorchRL has no such parameter")
    return problems


def test_every_torchrl_ext_estimator_is_checked():
    classes = {cls.__name__ for cls in _estimator_classes()}
    assert {"GAE", "TDLambda", "VTrace"} <= classes
    assert {(cls.__name__, name) for cls, name, _ in _overrides()} >= {
        ("GAE", "forward"), ("GAE", "value_estimate"), ("TDLambda", "forward"),
        ("TDLambda", "value_estimate"), ("VTrace", "forward")}


@pytest.mark.parametrize("cls, name, parent", _overrides(),
                         ids=[f"{cls.__name__}.{name}" for cls, name, _ in _overrides()])
def test_overridden_public_methods_keep_torchrls_signature(cls, name, parent):
    """Same parameter names in the same positions, same kinds and defaults; an extra parameter
    is allowed only with a default (TorchRL never passes it)."""
    ours, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(parent, name))
    problems = _incompatibilities(ours, theirs)
    assert not problems, (f"{cls.__name__}.{name}{ours} differs from TorchRL's "
                          f"{parent.__name__}.{name}{theirs}: " + "; ".join(problems))


def test_the_check_catches_a_reordered_override():
    """The drift this file guards against: the old ``TDLambda.value_estimate`` took ``params``
    where TorchRL's takes ``target_params`` and had no ``next_value``."""
    def torchrl(self, tensordict, target_params=None, next_value=None, time_dim=None, **kwargs): ...

    def drifted(self, tensordict, params=None, target_params=None, time_dim=None, **kwargs): ...

    def extended(self, tensordict, target_params=None, next_value=None, time_dim=None, *, extra=1, **kwargs): ...

    problems = _incompatibilities(inspect.signature(drifted), inspect.signature(torchrl))
    assert any("positional" in p for p in problems) and any("next_value" in p for p in problems)
    assert not _incompatibilities(inspect.signature(extended), inspect.signature(torchrl))


# ---------------------------------------------------------------------------
# torchrl_ext.value.functional against torchrl.objectives.value.functional
# ---------------------------------------------------------------------------

SHARED_FUNCTIONS = sorted(name for name in functional.__all__ if hasattr(torchrl_functional, name))


def _parameters(function) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.description, p.default) for p in inspect.signature(function).parameters.values()]


def test_every_shared_functional_name_is_checked():
    assert set(SHARED_FUNCTIONS) >= {
        "generalized_advantage_estimate", "td_lambda_return_estimate", "vtrace_advantage_estimate"}


@pytest.mark.parametrize("name", SHARED_FUNCTIONS)
def test_functional_signatures_equal_torchrls(name):
    """Same parameter names, order, kinds and defaults: a call TorchRL takes means the same here.
    Was: no ``rolling_gamma`` in ``td_lambda_return_estimate``, and a keyword-only ``time_dim``
    in ``vtrace_advantage_estimate`` (TorchRL's is positional-or-keyword)."""
    ours, theirs = getattr(functional, name), getattr(torchrl_functional, name)
    assert _parameters(ours) == _parameters(theirs), (
        f"torchrl_ext's {name}{inspect.signature(ours)} differs from TorchRL's {name}{inspect.signature(theirs)}")
