"""Input checks for the torch layer: the same rules and messages as :mod:`attnlab.errors`.

Shape and dtype checks read only metadata. Value checks (NaN, +-Inf) need the
data; they reduce each tensor to one sum first (any NaN or Inf makes the sum
non-finite) and only look element by element when that sum is not finite, so
the common case costs one cheap reduction instead of an ``isfinite`` pass.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import errors
from ..errors import AttnlabError, ShapeError, shape_str

__all__ = [
    "as_float_tensor",
    "as_bool_tensor",
    "check_finite",
    "check_has_data",
    "check_bias_values",
    "check_same_device",
    "check_probability",
    "check_positive_float",
    "broadcast_batch",
    "module_input",
    "check_flag",
    "check_module_dtype",
]

_HALF = (torch.float16, torch.bfloat16)
_REAL = (int, float, np.integer, np.floating)  # Python and NumPy numbers, as in the core


def as_float_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a floating-point tensor, or raise naming ``name``.

    Integer tensors become float64 (as the NumPy core does with integer
    arrays); bool and complex tensors, and anything that is not a tensor, are
    refused. Values are not looked at here (see :func:`check_finite`).
    """
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
    if not x.is_floating_point():
        return x.to(torch.float64)
    return x


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


def check_has_data(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Refuse tensors on the "meta" device: they have a shape but no values to check or use."""
    for name, t in named:
        if t.device.type == "meta":
            raise AttnlabError(
                f"{name}: expected a tensor holding values (attnlab checks them for NaN and "
                "overflow), got one on the meta device, which holds none; move the "
                "module or tensor to a real device first (e.g. .to_empty(device='cpu'))"
            )


def check_finite(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Raise if any tensor holds NaN or +-Inf, naming it, the count and the first index."""
    check_has_data(named)
    tensors = [t for _, t in named if t.numel()]
    if not tensors:
        return
    # One sum per tensor and one host sync for all of them: a NaN or Inf anywhere
    # makes its sum non-finite. A finite tensor whose sum overflows is rare and
    # only costs the exact check below.
    with torch.no_grad():  # a check, not part of the model: nothing for autograd to record
        sums = torch.stack([t.sum().float() for t in tensors])
        if bool(torch.isfinite(sums).all()):
            return
    for name, t in named:
        finite = torch.isfinite(t)
        if bool(finite.all()):
            continue
        bad = torch.nonzero(~finite)
        first = tuple(int(i) for i in bad[0])
        kind = "NaN" if bool(torch.isnan(t[first])) else "Inf"
        raise AttnlabError(
            f"{name}: expected finite values, got {len(bad)} non-finite "
            f"(first: {kind} at index {first})"
        )


def check_bias_values(bias: torch.Tensor, name: str = "bias") -> None:
    """A bias may hold -inf (a block) but never NaN or +inf."""
    check_has_data([(name, bias)])
    if bias.numel() and bool((torch.isnan(bias) | torch.isposinf(bias)).any()):
        raise AttnlabError(f"{name}: expected finite values or -inf, got NaN or +inf")


def check_same_device(reference: torch.Tensor, ref_name: str, x: torch.Tensor, name: str) -> None:
    if x.device != reference.device:
        raise AttnlabError(
            f"{name}: expected a tensor on {ref_name}'s device {reference.device}, "
            f"got {x.device}"
        )


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


def broadcast_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    """The broadcast of the leading (batch) dims of q, k and v, or a ShapeError naming all three."""
    try:
        return tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except RuntimeError:
        raise ShapeError(
            "q, k, v: expected leading (batch) dims that broadcast together, got "
            f"q {shape_str(q.shape)}, k {shape_str(k.shape)}, v {shape_str(v.shape)}"
        ) from None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32 on the plain path (as the NumPy core does)."""
    return torch.float32 if dtype in _HALF else dtype


def module_input(x: Any, name: str, like: torch.Tensor) -> torch.Tensor:
    """``x`` must be a float tensor with the dtype and device of the parameter ``like``."""
    if not isinstance(x, torch.Tensor):
        raise AttnlabError(
            f"{name}: expected a torch.Tensor, got {type(x).__name__}; "
            "convert NumPy arrays with torch.from_numpy(a)"
        )
    if x.dtype != like.dtype:
        raise AttnlabError(
            f"{name}: expected dtype {like.dtype} (the module's parameters), got {x.dtype}; "
            f"convert the input with .to({like.dtype}) or the module with .to(dtype)"
        )
    if x.device != like.device:
        raise AttnlabError(
            f"{name}: expected a tensor on the module's device {like.device}, got {x.device}"
        )
    return x


def check_module_dtype(dtype: Any) -> Any:
    """A module's ``dtype=``: None (torch's default) or a floating-point torch.dtype."""
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise AttnlabError(f"dtype: expected a torch float dtype or None, got {dtype!r}")
    return dtype


def check_flag(value: Any, name: str) -> bool:
    """True or False (NumPy's ``np.bool_`` too, as in the core); anything else is refused."""
    return errors.check_flag(value, name)
