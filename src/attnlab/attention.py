"""Scaled dot-product attention, written out from scratch in NumPy.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias, masked) V,   scale = 1/√D

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width. ``...`` is any number of leading batch dims.

Mask convention (the only one in attnlab): ``mask`` is boolean and
**True = may attend**. Additive values (ALiBi, -inf blocks, a relative bias) go
through ``bias``. The seeds use two other conventions:

- seed 000: ``scores + mask * -1e9`` with **1 = blocked** -> ``attnlab.masks.from_blocked(m)``
- seed 001: ``masked_fill(mask == 0, -1e9)`` with **0 = blocked** -> ``attnlab.masks.from_keep(m)``

A query row whose keys are all masked gets weights 0 and output 0 (never NaN,
and never the uniform average that ``-1e9`` filling silently produces).
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from .errors import (
    MAX_ELEMENTS,
    AttnlabError,
    ShapeError,
    as_bool_mask,
    as_float_array,
    check_broadcastable,
    check_flag,
    check_ndim,
    check_scale,
    shape_str,
)
from .masks import causal_mask

__all__ = ["softmax", "scaled_dot_product_attention", "self_attention", "MAX_SCORE_ELEMENTS"]

#: The plain path refuses to build a score matrix with more elements than this
#: (2**31 elements = 8 GiB in float32), instead of swapping the machine to death:
#: attnlab's one size limit, :data:`attnlab.errors.MAX_ELEMENTS`.
MAX_SCORE_ELEMENTS = MAX_ELEMENTS


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    softmax(x)_i = exp(x_i - max(x)) / Σ_j exp(x_j - max(x))

    Subtracting the row maximum changes nothing mathematically but keeps every
    exponent ≤ 0, so scores of ±1e4 neither overflow nor give NaN (the seed-000
    version ``np.exp(s) / np.sum(np.exp(s))`` returns NaN already at s = 710).
    ``-inf`` entries get probability 0; a slice that is entirely ``-inf`` gets all
    zeros (the library's rule for a row with nothing to attend to).

    Shapes: x (...) -> (...), same shape; integers are computed in float64.

    >>> softmax([1.0, 2.0, 3.0]).round(4)
    array([0.09  , 0.2447, 0.6652])
    >>> softmax([1e4, -1e4]).tolist()
    [1.0, 0.0]
    """
    arr = as_float_array(x, "x", allow_nonfinite=True)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise AttnlabError("x: expected finite values or -inf, got NaN or +inf")
    if arr.ndim == 0:
        raise ShapeError("x: expected at least 1 dimension, got a scalar")
    axis = check_axis(axis, arr.ndim)
    return _softmax(arr, axis)


def check_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    """Return ``axis`` as an int in [-ndim, ndim - 1], or raise naming ``name``."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
            or not -ndim <= axis < ndim:
        raise AttnlabError(f"{name}: expected an int in [{-ndim}, {ndim - 1}], got {axis!r}")
    return int(axis)


def _softmax_inplace(scores: np.ndarray) -> np.ndarray:
    """``_softmax`` over the last axis, reusing ``scores``' memory (which it overwrites).

    The plain attention path owns its score matrix, so it can spare the two
    temporaries of the same size that the out-of-place version allocates.
    """
    if scores.shape[-1] == 0:
        return scores
    row_max = np.max(scores, axis=-1, keepdims=True)  # (..., T, 1)
    row_max[np.isneginf(row_max)] = 0.0  # all-masked row: avoid -inf - -inf
    with np.errstate(over="ignore"):  # -1e308 - 1e308 = -inf: exp gives its exact weight 0
        scores -= row_max
    np.exp(scores, out=scores)
    sums = np.sum(scores, axis=-1, keepdims=True)  # (..., T, 1)
    sums[sums == 0.0] = 1.0  # nothing to attend to: leave the zeros
    scores /= sums
    return scores


def _softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax without validation; -inf = excluded; an all -inf slice gives zeros."""
    row_max = np.max(scores, axis=axis, keepdims=True) if scores.shape[axis] else None
    if row_max is None:  # S = 0: nothing to normalise
        return np.zeros_like(scores)
    row_max = np.where(np.isneginf(row_max), 0.0, row_max)  # all-masked row: avoid -inf - -inf
    with np.errstate(over="ignore"):  # -1e308 - 1e308 = -inf: exp gives its exact weight 0
        exps = np.exp(scores - row_max)
    sums = np.sum(exps, axis=axis, keepdims=True)
    # Rows with nothing to attend to have sum 0: divide by 1 instead, leaving zeros.
    return exps / np.where(sums == 0.0, 1.0, sums)


@overload
def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., return_weights: Literal[False] = ...,
) -> np.ndarray: ...
@overload
def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., return_weights: Literal[True],
) -> tuple[np.ndarray, np.ndarray]: ...
def scaled_dot_product_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention.

    Shapes:
        q    (..., T, D)      queries
        k    (..., S, D)      keys
        v    (..., S, Dv)     values
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); added to the scaled scores (-inf allowed)
        ->   out (..., T, Dv), and weights (..., T, S) if ``return_weights``

    The leading dims of q, k and v broadcast against each other (e.g. one k/v
    shared by several query batches).

    Formula::

        scores  = q @ kᵀ                          (..., T, S)
        scaled  = scores * scale + bias           scale = 1/√D by default
        weights = softmax(scaled where allowed)   allowed = mask & causal
        out     = weights @ v                     (..., T, Dv)

    ``is_causal`` is aligned bottom-right, as in FlashAttention: query i sits at
    absolute position S - T + i and may attend to keys j ≤ S - T + i. With T == S
    this is the usual lower-triangular mask (identical to torch's ``is_causal``);
    with T < S it is what cached decoding needs (the new queries are the last T
    positions). With T > S the first T - S queries see nothing and get zeros.

    A row with no key to attend to (all masked, or all bias -inf) gets weights 0
    and output 0.

    Dtypes: float32 stays float32, float64 stays float64, integers compute in
    float64, float16 computes in float32 and is returned as float16.

    >>> import numpy as np
    >>> q = k = v = np.eye(2)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).round(3)
    array([[1.  , 0.  ],
           [0.33, 0.67]])
    """
    return_weights = check_flag(return_weights, "return_weights")
    q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, out_dtype = _prepare(
        q, k, v, mask, bias, is_causal, scale
    )
    scaled = q_arr @ np.swapaxes(k_arr, -1, -2)  # (..., T, S) scores
    scaled *= np.asarray(scale_value, dtype=scaled.dtype)  # in place: one pass, no copy
    extra = [a.shape for a in (bias_arr, allowed) if a is not None]
    if extra and np.broadcast_shapes(scaled.shape, *extra) != scaled.shape:
        # A mask/bias with more batch dims than q and k: materialise the broadcast.
        scaled = np.array(np.broadcast_to(scaled, np.broadcast_shapes(scaled.shape, *extra)))
    if bias_arr is not None:
        # A score plus a finite bias below -finfo.max (finfo.min fills in float32) goes
        # to -inf: that key is blocked, as on the tiled and fused paths. No warning.
        with np.errstate(over="ignore"):
            scaled += bias_arr  # (..., T, S)
    if allowed is not None:
        np.copyto(scaled, -np.inf, where=~allowed)  # (..., T, S) blocked -> -inf
    weights = _softmax_inplace(scaled)  # (..., T, S)
    out = weights @ v_arr  # (..., T, Dv)
    if out_dtype != out.dtype:
        out, weights = out.astype(out_dtype), weights.astype(out_dtype)
    return (out, weights) if return_weights else out


def _prepare(
    q: Any, k: Any, v: Any, mask: Any, bias: Any, is_causal: bool, scale: float | None,
    *, tiled: bool = False,
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, float, np.dtype
]:
    """Validate and convert the inputs of attention; shared by the plain and fast paths.

    Returns q, k, v (one float dtype), the allowed mask (``mask`` and, unless
    ``tiled``, the dense causal mask; None if neither), bias, the scale and the
    output dtype. ``tiled=True`` is for paths that never build the (T, S) score
    matrix (flash): no MAX_SCORE_ELEMENTS refusal, and causality is left to them.
    """
    all_half = all(getattr(a, "dtype", None) == np.float16 for a in (q, k, v))
    q_arr = as_float_array(q, "q")
    k_arr = as_float_array(k, "k")
    v_arr = as_float_array(v, "v")
    check_ndim(q_arr, "q", 2, "(..., T, D)")
    check_ndim(k_arr, "k", 2, "(..., S, D)")
    check_ndim(v_arr, "v", 2, "(..., S, Dv)")
    T, D = q_arr.shape[-2:]
    S = k_arr.shape[-2]
    if k_arr.shape[-1] != D:
        raise ShapeError(
            f"k: expected (..., S, {D}) to match q's last dim {D}, got {shape_str(k_arr.shape)}"
        )
    if v_arr.shape[-2] != S:
        raise ShapeError(
            f"v: expected (..., {S}, Dv) to match k's length S = {S}, got {shape_str(v_arr.shape)}"
        )
    try:
        batch = np.broadcast_shapes(q_arr.shape[:-2], k_arr.shape[:-2], v_arr.shape[:-2])
    except ValueError:
        raise ShapeError(
            "q, k, v: expected leading (batch) dims that broadcast together, got "
            f"q {shape_str(q_arr.shape)}, k {shape_str(k_arr.shape)}, v {shape_str(v_arr.shape)}"
        ) from None
    score_shape = (*batch, T, S)
    n_scores = int(np.prod(score_shape, dtype=np.int64))
    if not tiled and n_scores > MAX_SCORE_ELEMENTS:
        raise AttnlabError(
            f"q, k: the score matrix {shape_str(score_shape)} would hold {n_scores:,} elements, "
            f"more than the plain path's limit of {MAX_SCORE_ELEMENTS:,} "
            "(attnlab.attention.MAX_SCORE_ELEMENTS); attnlab.flash_attention computes this "
            "tile by tile in O(T + S) memory"
        )

    dtype = np.result_type(q_arr, k_arr, v_arr)
    q_arr, k_arr, v_arr = (a.astype(dtype, copy=False) for a in (q_arr, k_arr, v_arr))

    scale_value = check_scale(scale, D)
    is_causal = check_flag(is_causal, "is_causal")

    allowed: np.ndarray | None = None
    if mask is not None:
        allowed = as_bool_mask(mask, "mask")
        check_broadcastable(allowed.shape, score_shape, "mask", "(..., T, S)")
    if is_causal and not tiled:
        causal = causal_mask(T, S)  # (T, S)
        allowed = causal if allowed is None else (allowed & causal)

    bias_arr: np.ndarray | None = None
    if bias is not None:
        bias_arr = as_float_array(bias, "bias", allow_nonfinite=True)
        if np.isnan(bias_arr).any() or np.isposinf(bias_arr).any():
            raise AttnlabError("bias: expected finite values or -inf, got NaN or +inf")
        check_broadcastable(bias_arr.shape, score_shape, "bias", "(..., T, S)")
        bias_arr = bias_arr.astype(dtype, copy=False)
    check_score_range(
        abs_max(q_arr), abs_max(k_arr), D, scale_value, dtype,
        bias_max=float(np.max(bias_arr)) if bias_arr is not None and bias_arr.size else 0.0,
    )

    out_dtype = np.dtype(np.float16) if all_half else dtype
    return q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, out_dtype


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
    advice = "scale q and k down" + ("" if np.dtype(dtype) == np.float64 else
                                     ", or compute in float64")
    if raw >= limit and bound + max(bias_max, 0.0) < limit:
        raise AttnlabError(
            f"{names}: the scores q·kᵀ could reach {raw:.3g} before scaling (D·max|q|·max|k| "
            f"with D = {D}, max|q| = {q_max:.3g}, max|k| = {k_max:.3g}), beyond "
            f"{np.dtype(dtype)}'s largest value {limit:.3g}: they would overflow to inf and "
            f"give NaN; {advice}"
        )
    if bound + max(bias_max, 0.0) < limit and q_max * scale < limit:
        return
    raise AttnlabError(
        f"{names}: the scaled scores could reach {bound:.3g} (D·max|q|·max|k|·|scale| with "
        f"D = {D}, max|q| = {q_max:.3g}, max|k| = {k_max:.3g}, scale = {scale:.3g}), beyond "
        f"{np.dtype(dtype)}'s largest value {limit:.3g}: they would overflow to inf and give "
        f"NaN; {advice}"
    )


def self_attention(X: Any, Wq: Any, Wk: Any, Wv: Any) -> np.ndarray:
    """Seed 000's ``self_attention``: project X, then scaled dot-product attention.

    Shapes: X (..., T, E), Wq (E, D), Wk (E, D), Wv (E, Dv) -> (..., T, Dv)

    Formula::

        Q, K, V = X Wq, X Wk, X Wv
        out     = softmax(Q Kᵀ / √D) V

    Gives the seed's numbers on the same weights, but with a stable softmax, so
    large scores give the right answer instead of NaN.

    >>> import numpy as np
    >>> X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])
    >>> W = np.random.default_rng(0).standard_normal((4, 3))
    >>> self_attention(X, W, W, W).shape
    (3, 3)
    """
    x_arr = as_float_array(X, "X")
    check_ndim(x_arr, "X", 2, "(..., T, E)")
    E = x_arr.shape[-1]
    projections = []
    for name, w in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv)):
        w_arr = as_float_array(w, name)
        if w_arr.ndim != 2 or w_arr.shape[0] != E:
            raise ShapeError(
                f"{name}: expected ({E}, d) to match X's last dim E = {E}, "
                f"got {shape_str(w_arr.shape)}"
            )
        projections.append(w_arr)
    w_q, w_k, w_v = projections
    if w_k.shape[1] != w_q.shape[1]:
        raise ShapeError(
            f"Wk: expected ({E}, {w_q.shape[1]}) to match Wq's output dim {w_q.shape[1]}, "
            f"got {shape_str(w_k.shape)}"
        )
    Q = x_arr @ w_q  # (..., T, D)
    K = x_arr @ w_k  # (..., T, D)
    V = x_arr @ w_v  # (..., T, Dv)
    return scaled_dot_product_attention(Q, K, V)
