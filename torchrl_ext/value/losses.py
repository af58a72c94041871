"""One call that gives a TorchRL loss a torchrl_ext estimator, wired as TorchRL wires its own."""
from __future__ import annotations

import dataclasses
import inspect
from enum import Enum
from typing import Any

from torchrl.objectives import LossModule
from torchrl.objectives.utils import ValueEstimators, get_value_estimator_entry
from torchrl.objectives.value import ValueEstimatorBase

from torchrl_ext import _compat
from torchrl_ext.value.estimators import GAE, ExtValueEstimators, VTrace
from torchrl_ext.value.td_lambda import TDLambda

__all__ = ["make_value_estimator"]

#: TorchRL's estimators of the same math: a loss wires them, and the wiring is taken over.
_TWINS = {GAE: ValueEstimators.GAE, VTrace: ValueEstimators.VTrace, TDLambda: ValueEstimators.TDLambda}
#: The loss keys TorchRL's policy-gradient losses hand their estimator (``make_value_estimator``).
_LOSS_KEYS = ("advantage", "value", "value_target", "reward", "done", "terminated", "sample_log_prob")


def make_value_estimator(loss: LossModule, estimator: Any = "ext_gae", **hyperparams: Any) -> LossModule:
    """Makes ``loss`` compute advantages and value targets with a torchrl_ext estimator.

    What ``loss.make_value_estimator(ValueEstimators.GAE, ...)`` does for TorchRL's own
    estimators, for torchrl_ext's: the estimator gets the loss's critic (``critic_network``
    or ``value_network``; V-trace also its ``actor_network``), the loss's ``gamma`` unless
    given, the registry defaults (``lmbda=0.95``, ``differentiable=True``), and the loss's
    tensor keys (``set_keys(reward=("agents", "reward"), ...)``, before or after this call).
    TorchRL's own ``loss.make_value_estimator(GAE, ...)`` builds the class without any of
    these, and refuses the registered names (``"ext_gae"``) on its policy-gradient losses.

    Args:
        loss: a TorchRL loss with a critic, e.g. ``ClipPPOLoss``, ``KLPENPPOLoss``,
            ``A2CLoss``, ``ReinforceLoss``.
        estimator: :class:`~torchrl_ext.value.GAE`, :class:`~torchrl_ext.value.VTrace`,
            :class:`~torchrl_ext.value.TDLambda` (or any TorchRL estimator class), a member of
            :class:`~torchrl_ext.value.ExtValueEstimators`, or its name (``"ext_gae"``,
            ``"ext_vtrace"``, ``"ext_td_lambda"``).
        **hyperparams: the estimator's keywords (``gamma``, ``lmbda``, ``average_gae``, ...).

    Returns:
        ``loss``, for chaining.

    Raises:
        TypeError, ValueError: for a bad ``loss``, ``estimator`` or hyperparameter; ``loss``
            then keeps its previous estimator and ``value_type``.

    Examples:
        >>> import torch
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from torchrl.objectives import ClipPPOLoss
        >>> from torchrl_ext.value import GAE, make_value_estimator
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        ...                      in_keys=["observation"], out_keys=["loc", "scale"]),
        ...     in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal, return_log_prob=True)
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> loss = make_value_estimator(ClipPPOLoss(actor, critic), GAE, gamma=0.99, lmbda=0.95)
        >>> type(loss.value_estimator).__name__, loss.value_estimator.value_network is loss.critic_network
        ('GAE', True)
    """
    if not isinstance(loss, LossModule):
        raise TypeError(f"loss must be a TorchRL LossModule (e.g. ClipPPOLoss), got {type(loss).__name__}.")
    cls, settings = _resolve(estimator)
    if hasattr(loss, "gamma"):
        settings["gamma"] = loss.gamma
    settings.update(hyperparams)
    # The wiring runs TorchRL's make_value_estimator, which replaces the loss's estimator before
    # ours checks the settings: a refused call puts the previous one back.
    previous = loss._value_estimator, loss.value_type
    try:
        wiring = _torchrl_wiring(loss, cls, settings)
        if wiring is None:  # the loss knows no TorchRL estimator of this math: a critic's usual wiring
            value_estimator = cls.for_loss(loss, **settings)
            keys = {name: getattr(loss.tensor_keys, name) for name in _LOSS_KEYS if hasattr(loss.tensor_keys, name)}
        else:
            networks, keys = wiring
            value_estimator = cls(**networks, **settings)
        accepted = {field.name for field in dataclasses.fields(value_estimator.tensor_keys)}
        # A key TorchRL leaves None is unset (and set_keys refuses None).
        value_estimator.set_keys(**{name: key for name, key in keys.items() if name in accepted and key is not None})
    except BaseException:
        _compat.set_value_estimator(loss, previous[0])
        loss.value_type = previous[1]
        raise
    _compat.set_value_estimator(loss, value_estimator)
    loss.value_type = cls
    return loss


def _torchrl_wiring(loss: LossModule, cls: type, settings: dict[str, Any]) -> tuple[dict, dict] | None:
    """The networks and keys ``loss`` gives TorchRL's estimator of ``cls``'s math (a DDPG loss
    its actor-critic and ``state_action_value``, say), or ``None`` if it takes none."""
    twin = _TWINS.get(cls)
    if twin is None or twin not in getattr(loss, "SUPPORTED_VALUE_ESTIMATORS", ()):
        return None
    accepted = inspect.signature(get_value_estimator_entry(twin).cls.__init__).parameters
    loss.make_value_estimator(twin, **{name: value for name, value in settings.items() if name in accepted})
    reference = loss.value_estimator
    networks = {"value_network": reference.value_network}
    if twin is ValueEstimators.VTrace:
        networks["actor_network"] = reference.actor_network
    return networks, dataclasses.asdict(reference.tensor_keys)


def _resolve(estimator: Any) -> tuple[type, dict[str, Any]]:
    """The estimator class and a fresh copy of its registry defaults (none for a class that is
    not registered, e.g. a user's subclass)."""
    if isinstance(estimator, type) and issubclass(estimator, ValueEstimatorBase):
        # TorchRL's classes too, as loss.make_value_estimator(ValueEstimators.GAE) gives them.
        for key in (*ExtValueEstimators, *ValueEstimators):
            entry = get_value_estimator_entry(key)
            if entry.cls is estimator:
                return estimator, dict(entry.default_kwargs)
        return estimator, {}
    if isinstance(estimator, (str, Enum)):
        try:
            entry = get_value_estimator_entry(estimator)
        except (KeyError, NotImplementedError, ValueError) as err:
            raise ValueError(
                f"estimator {estimator!r} is not a registered value estimator; use GAE, VTrace or "
                "TDLambda from torchrl_ext.value, or 'ext_gae', 'ext_vtrace', 'ext_td_lambda'."
            ) from err
        return entry.cls, dict(entry.default_kwargs)
    raise TypeError(
        f"estimator must be an estimator class (GAE, VTrace, TDLambda), an ExtValueEstimators "
        f"member or its name, got {estimator!r}."
    )
