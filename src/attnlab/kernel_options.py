"""The options of attention, checked: what may reshape the score matrix, and its bounds.

:func:`attnlab.kernel.check_inputs` validates every option of attention with
these, and the paths that take fewer arguments (multi-head attention, the KV
caches, sparse, flash's tiles) call the ones they need:

    softcap         c of c·tanh(scores / c) (Gemma 2, FlashAttention's ``softcap``)
    alibi_slopes    ALiBi's bias -slope·|i' - j| per head, and its range
    sinks           one logit per head that joins every row's softmax (GPT-OSS)
    dropout         the keep-mask and its scale, from a seeded generator or given
    key_padding     bool (..., S), True = a real key
    mask, bias      bool True = may attend, and additive values (-inf allowed)
    score range     the refusal of q, k whose scaled scores could overflow

Dimension legend: B batch, H heads, T query length, S key length, D head dim.
Mask convention (the only one in attnlab): boolean, **True = may attend**;
additive values go through ``bias``. Every name here is re-exported by
:mod:`attnlab.kernel`, where it was first defined.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import (
    as_bool_mask,
    as_float_array,
    check_broadcastable,
    check_flag,
    check_positive_int,
)
from .errors import AttnlabError
from .masks import band_mask
from .messages import msg
from .shapes import Band, check_alibi_slopes_shape, check_sinks_shape

__all__ = [
    "abs_max",
    "alibi_max",
    "alibi_tile",
    "check_alibi_range",
    "check_alibi_slopes",
    "check_dropout",
    "check_key_padding",
    "check_mask_and_bias",
    "check_score_range",
    "check_sinks",
    "check_softcap",
    "with_sinks",
]


def check_softcap(softcap: Any) -> float | None:
    """The soft cap c of c·tanh(scores / c): None (or 0, FlashAttention's "off") or a finite
    real number > 0."""
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(
        softcap, (int, float, np.integer, np.floating)
    ):
        raise AttnlabError(f"softcap: expected a real number > 0 or None, got {softcap!r}")
    value = float(softcap)
    if value == 0.0:
        return None
    if not (value > 0.0 and np.isfinite(value)):
        raise AttnlabError(f"softcap: expected a finite real number > 0 or None, got {value}")
    return value


def check_alibi_slopes(
    slopes: Any, batch: tuple[int, ...], dtype: Any, T: int, S: int
) -> np.ndarray | None:
    """ALiBi slopes (H,) or (B, H), FlashAttention's ``alibi_slopes``, broadcasting against
    the batch dims (..., H): -> (..., H, 1, 1) in ``dtype``, or None. Finite, and small
    enough that the bias -slope·|i' - j| stays finite (:func:`check_alibi_range`)."""
    if slopes is None:
        return None
    arr = as_float_array(slopes, "alibi_slopes")
    check_alibi_slopes_shape(arr.shape, batch)
    check_alibi_range(abs_max(arr), T, S, dtype)
    return arr.astype(dtype, copy=False)[..., None, None]  # (..., H, 1, 1)


def check_alibi_range(slope_max: float, T: int, S: int, dtype: Any) -> None:
    """Refuse ALiBi slopes whose bias -slope·|i' - j| could overflow ``dtype``.

    The distance |i' - j| is below T + S, so max|slope|·(T + S) bounds the
    bias; it must stay below a quarter of the largest value, which leaves room
    for the scores and a fill added to it. Real slopes (2^-8h/H) are < 1.
    """
    limit = float(np.finfo(dtype).max) / 4
    reach = slope_max * max(T + S, 1)  # Python floats: inf on overflow, no exception
    if not reach < limit:
        raise AttnlabError(msg("kernel.alibi_range", limit=f"{limit:.3g}", dtype=np.dtype(dtype),
                               slope=f"{slope_max:.3g}", length=T + S))


def alibi_max(slopes: np.ndarray | None, T: int, S: int) -> float:
    """The largest value ALiBi's bias can add to a score: -min(slope)·(T + S) if a slope is
    negative, else 0 (checked slopes (..., 1, 1) or None)."""
    if slopes is None or not slopes.size:
        return 0.0
    return max(0.0, -float(np.min(slopes))) * (T + S)


def alibi_tile(
    slopes: np.ndarray, offset: int, q0: int, q1: int, k0: int, k1: int
) -> np.ndarray:
    """ALiBi's bias for queries q0..q1-1 (at offset + i) and keys k0..k1-1: -slope·|i' - j|.

    Shapes: slopes (..., 1, 1) -> (..., q1 - q0, k1 - k0). FlashAttention's
    ``alibi_slopes`` bias (its non-causal form; with a causal mask it differs
    from the causal form by a constant per row, which softmax ignores).
    """
    query_pos = np.arange(q0, q1, dtype=slopes.dtype)[:, None] + slopes.dtype.type(offset)
    distance = np.abs(query_pos - np.arange(k0, k1, dtype=slopes.dtype)[None, :])  # (bq, bk)
    return -slopes * distance  # (..., bq, bk)


def check_sinks(sinks: Any, batch: tuple[int, ...], dtype: Any) -> np.ndarray | None:
    """Attention sinks (H,): one finite logit per head, broadcasting against the batch
    dims (..., H) -> (H, 1, 1) in ``dtype`` (broadcasting to (..., H, T, 1)), or None."""
    if sinks is None:
        return None
    arr = as_float_array(sinks, "sinks")
    check_sinks_shape(arr.shape, batch)
    return arr.astype(dtype, copy=False)[:, None, None]  # (H, 1, 1)


def with_sinks(scaled: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """The scores with each head's sink logit as one more column: (..., H, T, S) and
    (H, 1, 1) -> (..., H, T, S + 1)."""
    column = np.broadcast_to(sinks.astype(scaled.dtype, copy=False),
                             (*scaled.shape[:-1], 1))  # (..., H, T, 1)
    return np.concatenate([scaled, column], axis=-1)  # (..., H, T, S + 1)


def check_dropout(
    dropout_p: Any, rng: Any, dropout_mask: Any, score_shape: tuple[int, ...]
) -> tuple[np.ndarray | None, float]:
    """Dropout on the weights: (keep, 1 / (1 - p)), keep bool broadcastable to (..., T, S)
    (True = kept), or (None, 1.0) without dropout.

    ``dropout_mask`` is the keep-mask itself (pass the same to the torch twin);
    else ``rng`` (a ``np.random.Generator`` or an int seed) draws keep ~ Bernoulli(1 - p).
    """
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(
        dropout_p, (int, float, np.integer, np.floating)
    ) or not 0.0 <= float(dropout_p) < 1.0:
        raise AttnlabError(f"dropout_p: expected a probability in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if dropout_mask is not None:
        keep = as_bool_mask(dropout_mask, "dropout_mask")
        check_broadcastable(keep.shape, score_shape, "dropout_mask", "(..., T, S)")
        if p == 0.0:
            raise AttnlabError(
                "dropout_p: expected the probability the dropout_mask was drawn with (> 0), "
                "got 0.0"
            )
        return keep, 1.0 / (1.0 - p)
    if p == 0.0:
        return None, 1.0
    if rng is None:
        raise AttnlabError(
            "rng: expected a np.random.Generator or an int seed with dropout_p > 0 (or a "
            "dropout_mask), got None: attnlab draws no hidden random numbers"
        )
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(check_positive_int(rng, "rng", allow_zero=True))
    if not isinstance(rng, np.random.Generator):
        raise AttnlabError(f"rng: expected a np.random.Generator or an int seed, got {rng!r}")
    keep = rng.random(score_shape) >= p  # (..., T, S) True = kept
    return keep, 1.0 / (1.0 - p)



def check_key_padding(key_padding: Any, batch: tuple[int, ...], S: int) -> np.ndarray | None:
    """Validate ``key_padding``: bool (..., S), True = a real key, broadcastable to (*batch, S).

    Returns it as an array of at least one dim (a 0-d flag has no key axis to
    index), or None.
    """
    if key_padding is None:
        return None
    arr = as_bool_mask(key_padding, "key_padding")
    check_broadcastable(arr.shape, (*batch, S), "key_padding", "(..., S)")
    return arr.reshape(1) if arr.ndim == 0 else arr


def check_mask_and_bias(
    mask: Any, bias: Any, is_causal: Any, score_shape: tuple[int, ...], dtype: Any,
    *, tiled: bool = False,
) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
    """Validate what shapes the score matrix: the mask, the bias and ``is_causal``.

    Shapes: mask (bool, True = may attend) and bias (float, -inf allowed)
    broadcastable to ``score_shape`` = (..., T, S). Returns the allowed mask
    (with the bottom-right causal mask folded in unless ``tiled``; None if
    neither), the bias in ``dtype`` (or None) and ``is_causal`` as a bool. For
    callers whose q and k are computed, not given (multi-head attention).
    """
    is_causal = check_flag(is_causal, "is_causal")
    T, S = score_shape[-2:]
    allowed: np.ndarray | None = None
    if mask is not None:
        allowed = as_bool_mask(mask, "mask")
        check_broadcastable(allowed.shape, score_shape, "mask", "(..., T, S)")
    if is_causal and not tiled:
        causal = band_mask(Band(None, 0, S - T), T, S)  # (T, S) bottom-right
        allowed = causal if allowed is None else (allowed & causal)
    bias_arr: np.ndarray | None = None
    if bias is not None:
        bias_arr = as_float_array(bias, "bias", allow_nonfinite=True)
        if np.isnan(bias_arr).any() or np.isposinf(bias_arr).any():
            raise AttnlabError("bias: expected finite values or -inf, got NaN or +inf")
        check_broadcastable(bias_arr.shape, score_shape, "bias", "(..., T, S)")
        bias_arr = bias_arr.astype(dtype, copy=False)
    return allowed, bias_arr, is_causal


def abs_max(arr: np.ndarray) -> float:
    """The largest |value| of a finite array, as a Python float (0.0 if it is empty)."""
    if arr.size == 0:
        return 0.0
    return max(float(np.max(arr)), -float(np.min(arr)))


def check_score_range(
    q_max: float, k_max: float, D: int, scale: float, dtype: Any, *, bias_max: float = 0.0,
    names: str = "q, k",
) -> None:
    """Refuse q and k whose scaled scores q·kᵀ·scale could overflow ``dtype``.

    An overflowed score is ±inf: +inf turns its softmax row into NaN, a row of
    -inf silently into zeros. |q_i·k_j| ≤ D·max|q|·max|k|, so this bound, read
    from two O(T·D + S·D) reductions, rules overflow out before any O(T·S) work.
    It is far from any real input (float32: max|q|·max|k| ≈ 4e37 at D = 64).
    ``q_max · |scale|`` is bounded too: the tiled path folds the scale into q; and
    so is the unscaled D·max|q|·max|k|: the plain path forms q·kᵀ before scaling
    (with scale = 0 an overflowed q·kᵀ would give inf · 0 = NaN).
    """
    limit = float(np.finfo(dtype).max)
    scale = abs(float(scale))
    raw = q_max * k_max * D  # Python floats: inf on overflow, no exception
    bound = raw * scale
    advice = msg("kernel.advice" if np.dtype(dtype) == np.float64 else "kernel.advice_float64")
    numbers = {"names": names, "D": D, "q_max": f"{q_max:.3g}", "k_max": f"{k_max:.3g}",
               "dtype": np.dtype(dtype), "limit": f"{limit:.3g}", "advice": advice}
    if raw >= limit and bound + max(bias_max, 0.0) < limit:
        raise AttnlabError(msg("kernel.raw_overflow", raw=f"{raw:.3g}", **numbers))
    if bound + max(bias_max, 0.0) < limit and q_max * scale < limit:
        return
    raise AttnlabError(msg("kernel.scaled_overflow", bound=f"{bound:.3g}", scale=f"{scale:.3g}",
                           **numbers))
