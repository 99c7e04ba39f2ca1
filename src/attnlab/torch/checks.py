"""The tensor checks of attnlab.torch: type, dtype, device -- metadata only.

These are what the torch layer adds to :mod:`attnlab.errors` (whose checks of
flags, integers, scales and broadcastable shapes it uses as they are) and to
:mod:`attnlab.shapes` (the shape rules and slot arithmetic both twins share).
Nothing here reads a tensor's values or waits for its device; the checks that
do are in :mod:`attnlab.torch.debug`, switched on by ``debug_checks()``.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .. import checks as core_checks
from ..checks import check_alloc, shape_str
from ..errors import AttnlabError, ShapeError

__all__ = [
    "as_float_tensor",
    "as_bool_tensor",
    "check_same_device",
    "check_sinks_tensor",
    "check_probability",
    "check_positive_float",
    "module_input",
    "check_module_dtype",
]

_REAL = (int, float, np.integer, np.floating)  # Python and NumPy numbers, as in the core


def as_float_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a floating-point tensor, or raise naming ``name``.

    Integer tensors become float64 (as the NumPy core does with integer
    arrays); bool and complex tensors, and anything that is not a tensor, are
    refused. Values are not looked at here (see :mod:`attnlab.torch.debug`).
    """
    if isinstance(x, torch.Tensor) and x.is_floating_point():  # the common case first
        return x
    if x is None:
        raise AttnlabError(f"{name}: expected a torch.Tensor, got None")
    if not isinstance(x, torch.Tensor):
        raise AttnlabError(
            f"{name}: expected a torch.Tensor, got {type(x).__name__}; "
            "convert NumPy arrays with torch.from_numpy(a) or use the NumPy core (attnlab)"
        )
    if x.dtype == torch.bool:
        raise AttnlabError(f"{name}: expected a numeric tensor, got dtype torch.bool")
    if x.is_complex():
        raise AttnlabError(f"{name}: expected a real float or integer tensor, got dtype {x.dtype}")
    return x.to(torch.float64)


def as_bool_tensor(mask: Any, name: str = "mask") -> torch.Tensor:
    """``mask`` as a bool tensor, True = may attend; other dtypes are refused, never guessed."""
    if not isinstance(mask, torch.Tensor):
        raise AttnlabError(
            f"{name}: expected a bool torch.Tensor (True = may attend), got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise AttnlabError(
            f"{name}: expected a bool tensor (True = may attend), got dtype {mask.dtype}. "
            "For a 0/1 mask use m == 1 (1 = may attend, as in seed 001) or m == 0 "
            "(1 = blocked, as in seed 000); additive values belong in bias="
        )
    return mask


def check_tensor_alloc(shape: Any, dtype: torch.dtype, what: str, name: str) -> None:
    """:func:`attnlab.checks.check_alloc` (the same one-line refusal) in a form torch.compile
    traces without a graph break: a plain loop over the sizes, the message only past the
    limit."""
    count = 1
    for size in shape:
        count *= int(size)
    if count > core_checks.MAX_ELEMENTS:  # read at call time: tests lower it
        check_alloc(tuple(int(size) for size in shape), dtype, what, name)


def check_same_device(reference: torch.Tensor, ref_name: str, x: torch.Tensor, name: str) -> None:
    if x.device != reference.device:
        raise AttnlabError(
            f"{name}: expected a tensor on {ref_name}'s device {reference.device}, "
            f"got {x.device}"
        )


def check_sinks_tensor(sinks: Any, batch: Any, q: torch.Tensor) -> torch.Tensor | None:
    """Attention sinks (H,): one logit per head of q (..., H, T, D) (``batch`` = q's leading
    dims), on q's device; the NumPy twin's rule (:func:`attnlab.kernel.check_sinks`). Kept
    differentiable; None for None."""
    if sinks is None:
        return None
    sink_t = as_float_tensor(sinks, "sinks")
    batch = tuple(batch)
    if sink_t.ndim != 1 or not batch or batch[-1] != sink_t.shape[0]:
        raise ShapeError(
            f"sinks: expected one logit per head of q (..., H, T, D), (H,) = "
            f"{shape_str(batch[-1:] or (1,))}, got {shape_str(tuple(sink_t.shape))}")
    check_same_device(q, "q", sink_t, "sinks")
    return sink_t


def check_probability(p: Any, name: str) -> float:
    """A dropout probability in [0, 1)."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, _REAL) or not 0.0 <= p < 1.0:
        raise AttnlabError(f"{name}: expected a probability in [0, 1), got {p!r}")
    return float(p)


def check_positive_float(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL):
        raise AttnlabError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise AttnlabError(f"{name}: expected a finite number > 0, got {value}")
    return float(value)


def module_input(x: Any, name: str, like: torch.Tensor) -> torch.Tensor:
    """``x`` must be a float tensor with the dtype and device of the parameter ``like``."""
    if not isinstance(x, torch.Tensor):
        raise AttnlabError(
            f"{name}: expected a torch.Tensor, got {type(x).__name__}; "
            "convert NumPy arrays with torch.from_numpy(a)"
        )
    if x.dtype != like.dtype and not _autocast_dtype(x):
        raise AttnlabError(
            f"{name}: expected dtype {like.dtype} (the module's parameters), got {x.dtype}; "
            f"convert the input with .to({like.dtype}) or the module with .to(dtype)"
        )
    if x.device != like.device:
        raise AttnlabError(
            f"{name}: expected a tensor on the module's device {like.device}, got {x.device}"
        )
    return x


def _autocast_dtype(x: torch.Tensor) -> bool:
    """Whether ``x`` is what autocast makes on its device (then the module runs as nn's do:
    autocast casts each op's inputs; the parameters' dtype no longer decides)."""
    device = x.device.type
    try:
        return bool(torch.is_autocast_enabled(device)) and x.dtype in (
            torch.get_autocast_dtype(device), torch.float32)
    except (TypeError, RuntimeError, AttributeError):  # torch < 2.4 or no autocast there
        return False


def check_module_dtype(dtype: Any) -> Any:
    """A module's ``dtype=``: None (torch's default) or a floating-point torch.dtype."""
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise AttnlabError(f"dtype: expected a torch float dtype or None, got {dtype!r}")
    return dtype
