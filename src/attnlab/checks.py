"""The argument checks every public function runs before any math, raising
:class:`attnlab.errors.AttnlabError` (or :class:`~attnlab.errors.ShapeError`) that names
the argument, what was expected and what was received.

Dimension legend (used in every message): B batch, H heads, T query length,
S key length, D head dim, Dv value dim, E model width.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import AttnlabError, ShapeError
from .messages import Message, msg

__all__ = [
    "MAX_ELEMENTS",
    "describe",
    "shape_str",
    "as_float_array",
    "as_array",
    "check_finite",
    "check_ndim",
    "as_vector",
    "check_positive_int",
    "check_broadcastable",
    "check_flag",
    "check_scale",
    "check_text",
    "check_alloc",
    "make_folder",
    "as_bool_mask",
]

#: The most elements attnlab allocates for one array whose size comes from an
#: argument (a mask, a position table, a KV cache, generated tokens, a score
#: matrix): 2**31, i.e. 8 GiB in float32, 2 GiB as bool. Past it a call is refused
#: by :func:`check_alloc` before any memory is touched, instead of ending in a bare
#: MemoryError or in minutes of swapping. ``attnlab.attention.MAX_SCORE_ELEMENTS``
#: is this same limit.
MAX_ELEMENTS = 2**31


def describe(value: Any) -> str:
    """A received value for a message: arrays and tensors by type, shape and dtype
    (their repr spans lines and can be huge), anything else by a repr cut to 80."""
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "dtype", None) is not None and not np.isscalar(value):
        return f"{type(value).__name__} of shape {shape_str(shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def shape_str(shape: Sequence[int]) -> str:
    """``(2, 7, 32)`` -- tuples of length one print without the trailing comma."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def as_float_array(x: Any, name: str, *, allow_nonfinite: bool = False) -> np.ndarray:
    """Convert ``x`` to a floating-point array, or raise naming ``name``.

    - Python lists and integer arrays (the seeds write ``np.array([[1, 0, 1, 0], ...])``)
      become float64.
    - float16 and bfloat16 (``ml_dtypes``) are computed in float32 (float16 sums
      overflow at 65504; bfloat16 keeps 8 bits), as torch does on CPU; float32 and
      float64 are kept as they are.
    - bool, complex, object and string arrays are refused.
    - NaN or Inf is refused unless ``allow_nonfinite`` (it would otherwise spread
      through every softmax row it touches).
    """
    if x is None:
        raise AttnlabError(msg("check.none", name=name))
    arr = as_array(x, name, msg("check.what.numeric_array"))
    if arr.dtype == np.bool_:
        raise AttnlabError(msg("check.dtype_bool", name=name))
    if np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.float64)
    elif arr.dtype == np.float16 or arr.dtype.name == "bfloat16":  # ml_dtypes' bfloat16
        arr = arr.astype(np.float32)
    elif not np.issubdtype(arr.dtype, np.floating) or arr.dtype.itemsize > 8:
        raise AttnlabError(msg("check.dtype_real", name=name, dtype=arr.dtype))
    if not allow_nonfinite:
        check_finite(arr, name)
    return arr


def as_array(x: Any, name: str, what: str | Message | None = None) -> np.ndarray:
    """``np.asarray(x)``, with a ragged nested list reported as an AttnlabError naming ``name``.

    A torch tensor that requires grad cannot become a NumPy array (NumPy would
    drop its graph): that is said here, with the two ways out.
    """
    if getattr(x, "requires_grad", False) is True and hasattr(x, "detach"):
        raise AttnlabError(msg("check.requires_grad", name=name, type=type(x).__name__))
    try:
        return np.asarray(x)
    except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
        # ragged nested lists; tensors that NumPy cannot read (another device, meta)
        raise AttnlabError(msg("check.unreadable", name=name, detail=exc,
                               what=msg("check.what.array") if what is None else what)) from None


def check_finite(arr: np.ndarray, name: str) -> None:
    """Raise if ``arr`` holds NaN or +-Inf, saying how many and where the first one is."""
    finite = np.isfinite(arr)
    if not finite.all():
        bad = np.argwhere(~finite)
        first = tuple(int(i) for i in bad[0])
        kind = "NaN" if np.isnan(arr[first]) else "Inf"
        raise AttnlabError(msg("check.finite", name=name, count=len(bad), kind=kind, index=first))


def check_ndim(arr: np.ndarray, name: str, min_ndim: int, layout: str) -> None:
    """Require at least ``min_ndim`` dimensions; ``layout`` is the expected shape in words."""
    if arr.ndim < min_ndim:
        raise ShapeError(msg("check.ndim", name=name, layout=layout, shape=shape_str(arr.shape)))


def as_vector(value: Any, name: str, size: int) -> np.ndarray:
    """``value`` as a float vector of exactly ``size`` elements (a bias, LayerNorm's gamma),
    or raise naming ``name``, the expected and the received shape."""
    arr = as_float_array(value, name)
    if arr.shape != (size,):
        raise ShapeError(msg("check.ndim", name=name, layout=f"({size},)",
                             shape=shape_str(arr.shape)))
    return arr


def check_positive_int(value: Any, name: str, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise if it is not a (strictly) positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise AttnlabError(msg("check.integer", name=name, type=type(value).__name__,
                               got=describe(value)))
    low = 0 if allow_zero else 1
    if value < low:
        raise AttnlabError(msg("check.integer_at_least", name=name, low=low, got=value))
    return int(value)


def check_broadcastable(
    shape: Sequence[int], target: Sequence[int], name: str, layout: str
) -> None:
    """Raise unless an array of ``shape`` broadcasts to ``target`` (without growing it)."""
    try:
        result = np.broadcast_shapes(tuple(shape), tuple(target))
    except ValueError:
        result = None
    if result != tuple(target):
        raise ShapeError(msg("check.broadcast", name=name, layout=layout,
                             target=shape_str(target), shape=shape_str(shape)))


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool; only ``True``/``False`` (and NumPy's ``np.bool_``) pass.

    Flags are checked, not truth-tested: ``return_weights="no"`` is a mistake to
    report, not a request for weights.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise AttnlabError(msg("check.flag", name=name, got=describe(value)))
    return bool(value)


def check_scale(scale: Any, D: int, name: str = "scale") -> float:
    """The softmax scale: ``1/√D`` for None (1.0 when D = 0), else a finite real number.

    Python and NumPy numbers are accepted alike (``np.float32(0.5)``); bools,
    strings, arrays and tensors are refused.
    """
    if scale is None:
        return 1.0 / math.sqrt(D) if D > 0 else 1.0
    if isinstance(scale, (bool, np.bool_)) or not isinstance(
        scale, (int, float, np.integer, np.floating)
    ):
        raise AttnlabError(msg("check.scale_type", name=name, got=describe(scale)))
    value = float(scale)
    if not math.isfinite(value):
        raise AttnlabError(msg("check.scale_finite", name=name, got=value))
    return value


def check_text(text: str, name: str) -> str:
    """Refuse a str that cannot be written as UTF-8 (a lone surrogate, as Python makes
    from undecodable bytes), before anything is written; returns ``text``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AttnlabError(msg("check.utf8", name=name, got=repr(text),
                               char=repr(text[exc.start]), index=exc.start)) from None
    return text


def check_alloc(shape: Sequence[int], dtype: Any, what: str, name: str) -> None:
    """Refuse to allocate ``what`` of ``shape`` if it would hold more than MAX_ELEMENTS.

    Call it wherever an argument sets the size of an array, before allocating;
    ``name`` is the argument to blame. ``dtype`` (a NumPy or torch dtype) only
    sizes the message.

    >>> check_alloc((10**6, 10**6), bool, "the causal mask (T, S)", "T")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    attnlab.errors.AttnlabError: T: the causal mask (T, S) = (1000000, 1000000) would hold ...
    """
    count = math.prod(int(s) for s in shape)
    if count <= MAX_ELEMENTS:
        return
    try:
        itemsize = np.dtype(dtype).itemsize
    except (TypeError, ValueError, UnicodeError):  # a torch dtype
        itemsize = int(getattr(dtype, "itemsize", 1))
    raise AttnlabError(msg("check.alloc", name=name, what=what, shape=shape_str(shape),
                           count=f"{count:,}", gib=f"{count * itemsize / 2**30:,.1f}",
                           limit=f"{MAX_ELEMENTS:,}"))


def make_folder(path: str | os.PathLike[str], name: str) -> Path:
    """Create the folder ``path`` and its parents, or raise naming the argument ``name``.

    A path through a regular file, an existing file or a folder that cannot be
    made (no permission, /proc) is reported in one line instead of a bare OSError.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise AttnlabError(msg("check.folder_is_file", name=name, path=repr(os.fspath(path))))
    blocking = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise AttnlabError(msg("check.folder_blocked", name=name, path=repr(os.fspath(path)),
                               blocking=repr(os.fspath(blocking))))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnlabError(msg("check.folder_failed", name=name, path=repr(os.fspath(path)),
                               detail=exc.strerror or exc)) from None
    return folder


def as_bool_mask(mask: Any, name: str = "mask") -> np.ndarray:
    """Return ``mask`` as a bool array; True = may attend.

    Only boolean masks are accepted: the meaning of a mask never changes with
    its dtype. Seed 000 writes 1 = blocked and seed 001 writes 0 = blocked;
    convert them with :func:`attnlab.masks.from_blocked` /
    :func:`attnlab.masks.from_keep`, or pass additive values through ``bias``.
    """
    arr = as_array(mask, name)
    if arr.dtype != np.bool_:
        raise AttnlabError(msg("check.bool_mask", name=name, dtype=arr.dtype))
    return arr
