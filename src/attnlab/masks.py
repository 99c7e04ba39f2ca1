"""Boolean attention masks, and conversions from the seeds' conventions.

attnlab has one mask convention: a bool array broadcastable to (..., T, S),
**True = may attend**. Additive values go through ``bias`` instead.

The seed articles use two other conventions; convert them once, at the edge:

=============================  ==========================  =====================
source                         meaning of 1                attnlab mask
=============================  ==========================  =====================
seed 000 ``scores + m*-1e9``   1 = blocked                 ``from_blocked(m)``
seed 001 ``masked_fill(m==0)`` 1 = may attend (0 blocked)  ``from_keep(m)``
Hugging Face attention_mask    1 = real token              ``padding_mask(m)``
=============================  ==========================  =====================

Dimension legend: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import as_array, as_bool_mask, check_alloc, check_flag, check_positive_int, shape_str
from .errors import AttnlabError, ShapeError
from .shapes import Band, attention_band, check_causal_alignment, check_window_pair

__all__ = [
    "band_mask",
    "causal_mask",
    "window_mask",
    "window_band",
    "padding_mask",
    "from_blocked",
    "from_keep",
    "mask_to_bias",
]


def causal_mask(
    T: int, S: int | None = None, *, causal_alignment: str = "bottom_right"
) -> np.ndarray:
    """Causal mask, True = may attend; bottom-right aligned unless told otherwise.

    Shapes: -> (T, S); S defaults to T.

    ``causal_alignment="bottom_right"`` (the default, FlashAttention's): query i
    sits at absolute position S - T + i and may attend to keys j ≤ S - T + i.
    With T == S it is the lower triangle; with T = 1 (one decoding step over S
    cached keys) it allows all S. ``"top_left"`` (torch's ``is_causal``, JAX's):
    query i may attend to keys j ≤ i, ``np.tril(np.ones((T, S), bool))``. The
    two agree when T == S.

    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    >>> causal_mask(2, 4).astype(int)
    array([[1, 1, 1, 0],
           [1, 1, 1, 1]])
    >>> causal_mask(2, 4, causal_alignment="top_left").astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0]])
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    alignment = check_causal_alignment(causal_alignment)
    check_alloc((T, S), np.bool_, "the causal mask (T, S)", sizes)
    band = attention_band(T, S, is_causal=True, window=None, causal_alignment=alignment)
    assert band is not None  # is_causal always gives a band
    return band_mask(band, T, S)  # (T, S)


def window_mask(
    T: int, S: int | None = None, *, window: Any, is_causal: bool = False,
    causal_alignment: str = "bottom_right",
) -> np.ndarray:
    """The mask of ``window`` (and ``is_causal``) as every attention path applies it: -> (T, S).

    Query i sits at position p (p = S - T + i bottom-right, p = i top-left), key
    j at j. ``window=(left, right)`` is FlashAttention's ``window_size``: keys
    p - left ≤ j ≤ p + right, -1 = unbounded on that side; ``is_causal`` also
    cuts at j ≤ p. An int W keeps attnlab's meaning: with ``is_causal`` the W most
    recent keys, itself included, i.e. (W - 1, 0); without, W odd and (W - 1) / 2
    keys on each side. The documentation's page "What the kernel can express"
    (docs/kernel.md) maps other libraries' conventions onto these.

    >>> window_mask(4, window=(1, 0)).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    >>> window_mask(3, 4, window=(0, 1), causal_alignment="top_left").astype(int)
    array([[1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    T, S, band = window_band(T, S, window=window, is_causal=is_causal,
                             causal_alignment=causal_alignment, dtype=np.bool_)
    if band is None:
        return np.ones((T, S), dtype=bool)
    return band_mask(band, T, S)  # (T, S)


def window_band(
    T: int, S: int | None, *, window: Any, is_causal: Any, causal_alignment: Any, dtype: Any,
) -> tuple[int, int, Band | None]:
    """:func:`window_mask`'s arguments checked, as (T, S, band); band None = no limit.

    The NumPy and torch ``window_mask`` share it; ``dtype`` is the mask's, for the
    size check (a (T, S) mask too large for memory names T and S)."""
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    is_causal = check_flag(is_causal, "is_causal")
    pair = check_window_pair(window, is_causal)
    alignment = check_causal_alignment(causal_alignment)
    check_alloc((T, S), dtype, "the window mask (T, S)", sizes)
    band = attention_band(T, S, is_causal=is_causal, window=pair, causal_alignment=alignment)
    return T, S, band


def band_mask(band: Band, T: int, S: int, q0: int = 0, k0: int = 0) -> np.ndarray:
    """The checked ``band``'s mask for queries q0 .. q0 + T - 1 and keys k0 .. k0 + S - 1:
    -> (T, S) bool, True = may attend. No checks (see :func:`window_mask`)."""
    query_pos = np.arange(q0, q0 + T)[:, None] + band.offset  # (T, 1) absolute positions
    key_pos = np.arange(k0, k0 + S)[None, :]  # (1, S)
    allowed = np.ones((T, S), dtype=bool)
    if band.right is not None:
        allowed &= key_pos <= query_pos + band.right
    if band.left is not None:
        allowed &= key_pos >= query_pos - band.left
    return allowed  # (T, S)


def padding_mask(attention_mask: Any) -> np.ndarray:
    """Key-padding mask from a 0/1 "real token" matrix (Hugging Face's attention_mask).

    Shapes: attention_mask (B, S) of 0/1 or bool -> (B, 1, 1, S) bool, which
    broadcasts against (B, H, T, S) scores.

    >>> padding_mask([[1, 1, 0]]).shape
    (1, 1, 1, 3)
    """
    arr = _as_01(attention_mask, "attention_mask")
    if arr.ndim != 2:
        raise ShapeError(f"attention_mask: expected (B, S), got {shape_str(arr.shape)}")
    return arr[:, None, None, :]  # (B, 1, 1, S)


def from_blocked(mask: Any) -> np.ndarray:
    """Convert seed 000's mask (1 = blocked, added as ``mask * -1e9``) to attnlab's.

    Shapes: (...) -> (...) bool, True = may attend.

    >>> from_blocked([[0, 1], [0, 0]]).tolist()
    [[True, False], [True, True]]
    """
    return ~_as_01(mask, "mask")


def from_keep(mask: Any) -> np.ndarray:
    """Convert seed 001's mask (``masked_fill(mask == 0, -1e9)``: 0 = blocked) to attnlab's.

    Shapes: (...) -> (...) bool, True = may attend.

    >>> from_keep([[1, 0], [1, 1]]).tolist()
    [[True, False], [True, True]]
    """
    return _as_01(mask, "mask")


def mask_to_bias(mask: Any, dtype: Any = np.float64) -> np.ndarray:
    """Additive bias equal to a boolean mask: 0 where allowed, -inf where blocked.

    Shapes: (...) -> (...) float.

    -inf rather than seed 001's -1e9: with -1e9 a fully blocked row silently
    becomes a uniform average over the blocked keys; with -inf attnlab gives 0.
    """
    arr = as_bool_mask(mask, "mask")
    try:
        float_dtype = np.dtype(dtype)
    except (TypeError, ValueError, UnicodeError):  # not a dtype, e.g. a tensor
        raise AttnlabError(f"dtype: expected a float dtype, got {dtype!r}") from None
    if not np.issubdtype(float_dtype, np.floating):  # -inf has no int or complex bias
        raise AttnlabError(f"dtype: expected a float dtype (-inf marks blocked), got {float_dtype}")
    return np.where(arr, 0.0, -np.inf).astype(float_dtype)


def _as_01(mask: Any, name: str) -> np.ndarray:
    """A 0/1 (or bool) array as bool; anything else is an error, not a guess."""
    arr = as_array(mask, name)
    if arr.dtype == np.bool_:
        return arr
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise AttnlabError(f"{name}: expected a 0/1 or bool array, got dtype {arr.dtype}")
    values = np.unique(arr)
    if not np.isin(values, (0, 1)).all():
        shown = ", ".join(str(x) for x in values[~np.isin(values, (0, 1))][:5])
        raise AttnlabError(f"{name}: expected only 0 and 1, got values {shown}")
    return arr.astype(bool)
