"""The attention kernel: one validation step and one formula, shared by every NumPy path.

Every public attention function in attnlab (the plain path, flash, sparse,
the KV caches, multi-head attention, explain, the profile) validates its inputs
once, at its own boundary, with :func:`check_inputs`, and then computes on the
validated arrays with :func:`attend` (or, on the tiled paths, with the same
softmax rule). Nothing below the boundary checks again.

    attend(q, k, v, allowed, bias, scale):
        scaled  = q @ kᵀ · scale + bias          (..., T, S)
        weights = softmax(scaled where allowed)  rows with nothing allowed -> 0
        out     = weights @ v                    (..., T, Dv)

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims, which broadcast.
Mask convention (the only one in attnlab): ``allowed`` / ``mask`` is boolean,
**True = may attend**; additive values go through ``bias``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

__all__ = [
    "AttentionInputs",
    "MAX_SCORE_ELEMENTS",
    "abs_max",
    "attend",
    "check_inputs",
    "check_key_padding",
    "check_mask_and_bias",
    "check_score_range",
    "softmax_rows",
    "stable_softmax",
]

#: The plain path refuses to build a score matrix with more elements than this
#: (2**31 elements = 8 GiB in float32), instead of swapping the machine to death:
#: attnlab's one size limit, :data:`attnlab.errors.MAX_ELEMENTS`.
MAX_SCORE_ELEMENTS = MAX_ELEMENTS


@dataclass(frozen=True)
class AttentionInputs:
    """Validated attention inputs: arrays of one float dtype, checked shapes, a scale.

    ``allowed`` includes the causal mask unless the inputs were checked with
    ``tiled=True`` (the tiled paths build causality per tile); ``is_causal``
    says whether it was asked for.
    """

    q: np.ndarray  # (..., T, D)
    k: np.ndarray  # (..., S, D)
    v: np.ndarray  # (..., S, Dv)
    allowed: np.ndarray | None  # bool, broadcastable to (..., T, S); None = all allowed
    bias: np.ndarray | None  # broadcastable to (..., T, S); -inf allowed
    scale: float
    is_causal: bool
    out_dtype: np.dtype  # float16 inputs compute in float32 and are returned as float16
    batch: tuple[int, ...]  # the broadcast leading dims of q, k, v

    @property
    def T(self) -> int:  # noqa: N802 - the dimension legend's letter
        return int(self.q.shape[-2])

    @property
    def S(self) -> int:  # noqa: N802
        return int(self.k.shape[-2])

    @property
    def D(self) -> int:  # noqa: N802
        return int(self.q.shape[-1])

    @property
    def Dv(self) -> int:  # noqa: N802
        return int(self.v.shape[-1])


def check_inputs(
    q: Any, k: Any, v: Any, mask: Any = None, *, bias: Any = None, is_causal: Any = False,
    scale: Any = None, tiled: bool = False,
) -> AttentionInputs:
    """Validate and convert the inputs of attention, before any math.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); mask (bool) and bias
    broadcastable to (..., T, S). Raises :class:`attnlab.AttnlabError` naming
    the argument, what was expected and what was received.

    ``tiled=True`` is for paths that never build the (T, S) score matrix
    (flash): no MAX_SCORE_ELEMENTS refusal, and causality is left to them.
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
            "(attnlab.kernel.MAX_SCORE_ELEMENTS); attnlab.flash_attention computes this "
            "tile by tile in O(T + S) memory"
        )
    dtype = np.result_type(q_arr, k_arr, v_arr)
    q_arr, k_arr, v_arr = (a.astype(dtype, copy=False) for a in (q_arr, k_arr, v_arr))

    scale_value = check_scale(scale, D)
    allowed, bias_arr, is_causal = check_mask_and_bias(
        mask, bias, is_causal, score_shape, dtype, tiled=tiled
    )
    check_score_range(
        abs_max(q_arr), abs_max(k_arr), D, scale_value, dtype,
        bias_max=float(np.max(bias_arr)) if bias_arr is not None and bias_arr.size else 0.0,
    )

    out_dtype = np.dtype(np.float16) if all_half else dtype
    return AttentionInputs(q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, is_causal,
                           out_dtype, tuple(batch))



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
        causal = causal_mask(T, S)  # (T, S)
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


def attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None, scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q kᵀ · scale + bias, where allowed) v, on already validated arrays.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); allowed (bool, True =
    may attend) and bias broadcastable to (..., T, S) -> out (..., T, Dv),
    weights (..., T, S). No checks: call it below a boundary that ran
    :func:`check_inputs` (or an equivalent check of its own arguments).
    """
    scaled = q @ np.swapaxes(k, -1, -2)  # (..., T, S) scores
    scaled *= np.asarray(scale, dtype=scaled.dtype)  # in place: one pass, no copy
    extra = [a.shape for a in (bias, allowed) if a is not None]
    if extra and np.broadcast_shapes(scaled.shape, *extra) != scaled.shape:
        # A mask/bias with more batch dims than q and k: materialise the broadcast.
        scaled = np.array(np.broadcast_to(scaled, np.broadcast_shapes(scaled.shape, *extra)))
    if bias is not None:
        with np.errstate(over="ignore"):  # score + finfo.min past the float range: -inf, blocked
            scaled += bias  # (..., T, S)
    if allowed is not None:
        np.copyto(scaled, -np.inf, where=~allowed)  # (..., T, S) blocked -> -inf
    weights = softmax_rows(scaled)  # (..., T, S)
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis *in place* (``scores`` is overwritten and returned).

    -inf entries get weight 0; a row that is all -inf (nothing to attend to)
    stays all 0. The row max is subtracted first, so ±1e4 neither overflows nor
    gives NaN. Shapes: (..., S) -> (..., S).
    """
    if scores.shape[-1] == 0:
        return scores
    row_max = np.max(scores, axis=-1, keepdims=True)  # (..., 1)
    row_max[np.isneginf(row_max)] = 0.0  # all-masked row: avoid -inf - -inf
    with np.errstate(over="ignore"):  # -1e308 - 1e308 = -inf: exp gives its exact weight 0
        scores -= row_max
    np.exp(scores, out=scores)
    sums = np.sum(scores, axis=-1, keepdims=True)  # (..., 1)
    sums[sums == 0.0] = 1.0  # nothing to attend to: leave the zeros
    scores /= sums
    return scores


def stable_softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` into a new array, without validation (see :func:`softmax_rows`)."""
    if scores.shape[axis] == 0:  # S = 0: nothing to normalise
        return np.zeros_like(scores)
    row_max = np.max(scores, axis=axis, keepdims=True)
    row_max = np.where(np.isneginf(row_max), 0.0, row_max)  # all-masked row: avoid -inf - -inf
    with np.errstate(over="ignore"):  # -1e308 - 1e308 = -inf: exp gives its exact weight 0
        exps = np.exp(scores - row_max)
    sums = np.sum(exps, axis=axis, keepdims=True)
    # Rows with nothing to attend to have sum 0: divide by 1 instead, leaving zeros.
    return exps / np.where(sums == 0.0, 1.0, sums)
