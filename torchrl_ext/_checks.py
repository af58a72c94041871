"""Every reusable argument check: one function per rule, so the same bad input raises the same
exception type with the same kind of message in every component.

Conventions (each message names the argument, the value given and the bound or the fix):

* a non-number where a real number is expected: ``TypeError``
  ``"<name> must be a real number, got <value>."``;
* NaN, an infinity or a number out of range: ``ValueError``
  ``"<name> must be a number in [lo, hi], got <name>=<v>."`` (or ``">= lo"``, ``"> lo"``;
  infinities: ``"must be a finite number"``);
* an int setting: ``ValueError`` ``"<name> must be an int >= <minimum>, got <name>=<v>."``
  (a bool, a float or any other value is not an int; a numpy or 0-d tensor integer is told
  to pass ``int(<name>)``);
* tensors: a wrong dtype raises ``TypeError``, a wrong shape or a bad value ``ValueError``.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Callable

import numpy as np
import torch


__all__ = [
    "SHAPE_ERR",
    "CheckedSetting",
    "check_batch_size",
    "check_choice",
    "check_device",
    "as_index",
    "check_finite",
    "check_flag",
    "check_floating",
    "check_generator",
    "check_indices",
    "check_int",
    "check_priorities",
    "check_real",
    "check_reals",
    "check_same_shape",
    "check_signals",
    "check_state_keys",
    "is_int_tensor",
    "makes_kept_tensors",
    "read_only",
    "resolve_time_dim",
]

SHAPE_ERR = (
    "All input tensors (state_value, next_state_value, reward, done, terminated"
    "{extra}) must share one shape [*B, T, *F]; got {shapes}."
)


def _end(hint: str) -> str:
    """The end of a message: ``"; <hint>."`` or ``"."``."""
    return f"; {hint}." if hint else "."


########################################################################
# Numbers
# -------


def as_index(value: Any) -> Any:
    """``value`` as a Python int when it is an integer of another type that ``operator.index``
    takes (numpy integers, 0-d integer tensors), as TorchRL's ``sample`` takes them; anything
    else is returned unchanged (bools and bool tensors too: they are not counts)."""
    if isinstance(value, (int, np.bool_)) or (
        isinstance(value, torch.Tensor) and (value.ndim or value.dtype is torch.bool)
    ):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None, hint: str = "") -> int:
    """``value`` must be an int (not a bool) in ``[minimum, maximum]``; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
        maximum is not None and value > maximum
    ):
        bound = f" >= {minimum}" if maximum is None else f" in [{minimum}, {maximum}]"
        if not isinstance(value, int) and as_index(value) is not value:  # e.g. np.int64(4): a number, not an int
            raise ValueError(f"{name} must be a Python int{bound}, got {name}={value!r} "
                             f"({type(value).__name__}); pass int({name}){_end(hint)}")
        raise ValueError(f"{name} must be an int{bound}, got {name}={value!r}{_end(hint)}")
    if value >= 2**62:  # sizes beyond what tensors index (torch would raise OverflowError)
        raise ValueError(f"{name} must be below 2**62, got {name}={value!r}{_end(hint)}")
    return value


def check_choice(name: str, value: Any, allowed: tuple[str, ...], *, one_of: bool = False) -> Any:
    """``value`` must be one of ``allowed``; ``ValueError`` listing them (``"'a' or 'b'"``, or
    ``"one of ('a', 'b')"`` with ``one_of``) otherwise."""
    if value not in allowed:
        what = f"one of {allowed}" if one_of else " or ".join(map(repr, allowed))
        raise ValueError(f"{name} must be {what}, got {name}={value!r}.")
    return value


def check_state_keys(state: Any, keys: tuple[str, ...], owner_hint: str = "") -> None:
    """``ValueError`` naming the ``keys`` (in their order) that ``state``, a state_dict, lacks;
    ``owner_hint`` ends the message (e.g. whose ``state_dict()`` to pass)."""
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(f"state_dict lacks {missing}: it is damaged or of another sampler{_end(owner_hint)}")


def check_device(name: str, value: Any) -> torch.device:
    """``value`` as a ``torch.device`` (a device, a string such as ``"cuda:0"`` or a CUDA index);
    ``ValueError`` for a string torch cannot parse, ``TypeError`` for any other type."""
    try:
        return value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, TypeError):
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', "
                    f"got {name}={value!r}.") from None


def check_generator(name: str, value: Any) -> Any:
    """``value`` must be a ``torch.Generator`` or ``None``; ``TypeError`` otherwise (torch would
    refuse it only at the first draw, far from where it was given)."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {name}={value!r}; "
                        f"e.g. {name}=torch.Generator().manual_seed(0).")
    return value


def check_batch_size(batch_size: Any) -> int:
    """A sampler's ``batch_size``: an int ``>= 1``; ``ValueError`` otherwise."""
    return check_int("batch_size", batch_size, minimum=1)


def _bound(low: float, high: float | None, open_low: bool) -> str:
    if high is not None:
        return f"a number in {'(' if open_low else '['}{low:g}, {high:g}]"
    if low == -math.inf:
        return "a real number"
    return f"{'>' if open_low else '>='} {low}"


def check_real(
    name: str, value: Any, *, low: float, high: float | None = None, open_low: bool = False,
    finite: bool = True, hint: str = "",
) -> float:
    """``value`` (a number or a one-element tensor) as a float in ``[low, high]`` (``(low, high]``
    with ``open_low``). ``TypeError`` for a non-number (bools included), ``ValueError`` for NaN,
    for infinities (unless ``finite=False``) and out of range: NaN and infinities turn priorities,
    weights and discounts into NaN later, far from the call that set them. ``hint`` ends the
    message (e.g. the default value)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}{_end(hint)}")
    value = float(value)
    if finite and math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {name}={value}{_end(hint)}")
    if math.isnan(value) or value < low or (open_low and value == low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_bound(low, high, open_low)}, got {name}={value}{_end(hint)}")
    return value


def check_reals(
    name: str, value: Any, *, low: float, high: float | None = None, open_low: bool = False,
    finite: bool = True, shape: torch.Size | None = None, hint: str = "",
) -> None:
    """:func:`check_real` for a number, elementwise for a tensor of real numbers (per-step or
    per-env discounts, clip thresholds), which must also broadcast to ``shape`` when given.
    Every element must be in range, and finite unless ``finite=False`` (a clip threshold of
    ``+inf`` clips nothing); the messages are :func:`check_real`'s."""
    if not isinstance(value, torch.Tensor):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number or a tensor of them, got {value!r}{_end(hint)}")
        check_real(name, value, low=low, high=high, open_low=open_low, finite=finite, hint=hint)
        return
    if value.dtype is torch.bool or value.is_complex():
        raise TypeError(f"{name} must be a real number or a tensor of them, got dtype={value.dtype}{_end(hint)}")
    if shape is not None:
        try:
            broadcast = torch.broadcast_shapes(value.shape, shape)
        except RuntimeError:
            broadcast = None
        if broadcast != shape:
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to the data "
                f"shape {tuple(shape)}; pass a scalar or a tensor broadcastable to it."
            )
    # One fused reduction: NaN fails every comparison, so it is caught too.
    ok = value > low if open_low else value >= low
    if high is not None:
        ok = ok & (value <= high)
    elif finite:
        ok = ok & (value < math.inf)
    if not bool(ok.all()):
        what = _bound(low, high, open_low)
        if finite and bool(torch.isinf(value).any()) and not bool(torch.isnan(value).any()):
            what = "a finite number"
        raise ValueError(
            f"{name} must be {what}, got values in [{value.min().item()}, {value.max().item()}]{_end(hint)}"
        )


class CheckedSetting:
    """A validated setting: every assignment (the constructor's included) stores
    ``check(name, value, **bounds)`` in ``attr`` (default ``_<name>``). ``hook``, a method name,
    is called with ``<name>=checked value`` before storing, so it can refuse the change by raising.

    Examples:
        >>> class Sampler:
        ...     n_step = CheckedSetting(check_int, "Maximum steps per transition.", minimum=1)
        >>> sampler = Sampler()
        >>> sampler.n_step = 3
        >>> sampler.n_step, sampler._n_step, Sampler.n_step.__doc__
        (3, 3, 'Maximum steps per transition.')
    """

    def __init__(
        self, check: Callable[..., Any], doc: str, *, hook: str | None = None, attr: str = "", **bounds: Any
    ) -> None:
        self.check, self.bounds, self.hook, self.attr, self.__doc__ = check, bounds, hook, attr, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.attr = name, self.attr or f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.attr)

    def __set__(self, obj: Any, value: Any) -> None:
        value = self.check(self.name, value, **self.bounds)
        if self.hook is not None:
            getattr(obj, self.hook)(**{self.name: value})
        setattr(obj, self.attr, value)


def read_only(attr: str, doc: str) -> property:
    """A read-only property documented by ``doc`` that returns ``self.<attr>`` (a dotted path is followed)."""
    return property(operator.attrgetter(attr), doc=doc)


def makes_kept_tensors(method: Callable) -> Callable:
    """Runs ``method`` with ``torch.inference_mode`` off, for methods that make tensors a component
    keeps and later updates in place (storage, trees, tables, a loaded state). Made inside
    ``torch.inference_mode()`` they would be inference tensors, which no in-place update outside
    it may touch, so a first call or a load there would break every later call outside it."""
    return torch.inference_mode(False)(method)


########################################################################
# Tensors
# -------


def check_finite(name: str, values: torch.Tensor, then: str) -> None:
    """``ValueError`` naming ``name`` and counting the NaN / infinite entries of ``values``;
    ``then`` says what was left unchanged and how to fix it."""
    bad = int((~torch.isfinite(values)).sum())
    if bad:
        raise ValueError(f"`{name}` holds {bad} NaN or infinite value(s) of {values.numel()}; {then}")


def bounds(values: torch.Tensor) -> tuple[Any, Any]:
    """``(min, max)`` of a non-empty tensor as Python numbers (NaN if it holds one).

    Examples:
        >>> import torch
        >>> bounds(torch.tensor([3, -1, 2]))
        (-1, 3)
    """
    low, high = torch.aminmax(values.detach())
    return low.item(), high.item()


def check_indices(name: str, value: Any, what: str = "indices") -> torch.Tensor:
    """``value`` (an int, a sequence, an array or a tensor of ints) as an int64 tensor on its
    device; ``TypeError`` for floats, bools, complex numbers or anything else, which a cast
    would silently truncate (``1.9`` -> env 1) or read as a mask (``[True, False]`` -> ids 1, 0).
    ``what`` names the entries in the message (``"env ids"``, ``"positions"``)."""
    try:
        tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must hold integer {what}, got {value!r}; pass integer {what}.") from None
    if tensor.numel() == 0 and not isinstance(value, torch.Tensor):
        return tensor.long()  # ``[]`` becomes a float tensor, but holds no float
    if tensor.dtype is torch.bool:
        raise TypeError(
            f"{name} must hold integer {what}, got dtype=torch.bool; pass integer {what}, "
            f"e.g. mask.nonzero().squeeze(1) for a boolean mask."
        )
    if tensor.dtype.is_floating_point or tensor.is_complex():
        raise TypeError(
            f"{name} must hold integer {what}, got dtype={tensor.dtype}; pass integer {what} "
            f"(e.g. {name}.long() if they are whole numbers)."
        )
    return tensor.long()


def is_int_tensor(obj: Any) -> bool:
    """Whether ``obj`` is an index tensor the fast gathers take: int64 or int32, the dtypes
    ``index_select`` takes. Others go to TorchRL, whose torch indexing reads uint8 as a mask
    (as bool) and refuses int8 / int16 with an ``IndexError``."""
    return isinstance(obj, torch.Tensor) and obj.dtype in (torch.int64, torch.int32)


def check_priorities(name: str, values: torch.Tensor) -> float:
    """The largest of the non-empty ``values``; ``ValueError`` unless every one is finite and ``>= 0``."""
    low, high = bounds(values)
    if not (math.isfinite(low) and math.isfinite(high)) or low < 0:
        raise ValueError(
            f"{name} must be finite and >= 0, got values in [{low}, {high}]; "
            "use e.g. td_error.abs() and replace NaN/inf before updating."
        )
    return high


def check_floating(name: str, tensor: object) -> None:
    """``tensor`` must be a floating-point ``torch.Tensor``; ``TypeError`` otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
    if not tensor.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype={tensor.dtype}; "
            f"convert it first, e.g. {name}.float()."
        )


def check_bool(name: str, value: object) -> bool:
    """``value`` (a bool or numpy bool) as a bool; ``TypeError`` for anything else."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {name}={value!r}.")
    return bool(value)


def check_flag(name: str, tensor: object) -> None:
    """``tensor`` must be a boolean ``torch.Tensor``; ``TypeError`` otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype is not torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor, got dtype={tensor.dtype}; "
            f"convert it first, e.g. {name}.bool() or ({name} != 0)."
        )


def check_same_shape(extra: str = "", **tensors: torch.Tensor) -> None:
    """The ``tensors`` share one shape; ``ValueError`` listing every shape (:data:`SHAPE_ERR`)."""
    first, *others = (t.shape for t in tensors.values())
    if all(shape == first for shape in others):
        return  # the common case, without building the message's pieces
    described = ", ".join(f"{name}={tuple(t.shape)}" for name, t in tensors.items())
    raise ValueError(SHAPE_ERR.format(extra=extra, shapes=described))


def resolve_time_dim(time_dim: Any, ndim: int) -> int:
    """``time_dim`` as a non-negative dim of ``ndim``-dim tensors; ``ValueError`` for a non-int
    (as :func:`check_int`) or a dim out of range."""
    if isinstance(time_dim, bool) or not isinstance(time_dim, int):
        check_int("time_dim", time_dim, minimum=-ndim, maximum=ndim - 1)
    if not -ndim <= time_dim < ndim:
        raise ValueError(
            f"time_dim={time_dim} is out of range for tensors with {ndim} dims; "
            f"use a value in [{-ndim}, {ndim - 1}]."
        )
    return time_dim % ndim


def check_signals(
    value: torch.Tensor,
    next_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    **extra_floats: torch.Tensor,
) -> None:
    """The value kernels' inputs: floating values and rewards (and ``extra_floats``), boolean
    ``done`` / ``terminated``, all of one shape."""
    shape = getattr(value, "shape", None)
    if all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == shape
        for t in (value, next_value, reward, *extra_floats.values())
    ) and all(
        isinstance(t, torch.Tensor) and t.dtype is torch.bool and t.shape == shape
        for t in (done, terminated)
    ):
        return  # all valid: skip building the per-argument error messages
    floats = {"state_value": value, "next_state_value": next_value, "reward": reward, **extra_floats}
    for name, tensor in floats.items():
        check_floating(name, tensor)
    check_flag("done", done)
    check_flag("terminated", terminated)
    extra = "".join(f", {name}" for name in extra_floats)
    check_same_shape(extra, **floats, done=done, terminated=terminated)
