"""The attention kernel: one validation step and one formula, shared by every NumPy path.

Every public attention function in attnlab (the plain path, flash, sparse,
the KV caches, multi-head attention, explain, the profile) validates its inputs
once, at its own boundary, with :func:`check_inputs`, and then computes on the
validated arrays with :func:`attend` (or, on the tiled paths, with the same
softmax rule). Nothing below the boundary checks again. The softmax itself is
the library's one, :func:`attnlab.masked_softmax.softmax_with_lse`; the checks of
each option (mask and bias, softcap, ALiBi, sinks, dropout, key padding, the
score range) live in :mod:`attnlab.kernel_options` and are re-exported here.

    attend(q, k, v, allowed, bias, scale, softcap=c):
        scaled  = q @ kᵀ · scale                 (..., T, S)
        scaled  = c · tanh(scaled / c)           with a soft cap (Gemma 2, FlashAttention)
        scaled  = scaled + bias                  bias includes ALiBi's -slope·|i' - j|
        weights = softmax(scaled where allowed)  rows with nothing allowed -> 0
        out     = weights @ v                    (..., T, Dv)

With attention sinks (``sinks``, one logit per head, GPT-OSS's ``s_aux``,
FlashAttention's ``learnable_sink``) each row's softmax runs over its scores
and the head's sink logit, and the sink's column, which has no value, is then
dropped: the weights of a row sum to 1 - exp(sink - lse), and lse includes the sink.

``allowed`` holds the mask, the causal rule and the window; both causal
alignments and every window are one band of positions (:class:`attnlab.shapes.Band`):
query i sits at i' = S - T + i (bottom-right, the default) or i' = i (top-left)
and may attend key j iff i' - left <= j <= i' + right. ``enable_gqa`` repeats
each of Hkv key/value heads for H / Hkv query heads (torch's rule,
:func:`attnlab.gqa.repeat_kv`).

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims, which broadcast.
Mask convention (the only one in attnlab): ``allowed`` / ``mask`` is boolean,
**True = may attend**; additive values go through ``bias``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import MAX_ELEMENTS, as_float_array, check_flag, check_scale
from .gqa import check_gqa_heads, gqa_reduce, repeat_kv
from .kernel_options import (
    abs_max,
    alibi_max,
    alibi_tile,
    check_alibi_range,
    check_alibi_slopes,
    check_dropout,
    check_key_padding,
    check_mask_and_bias,
    check_score_range,
    check_sinks,
    check_softcap,
    with_sinks,
)
from .masked_softmax import softmax_with_lse, stable_softmax
from .masks import band_mask
from .messages import msg
from .shapes import (
    Band,
    attention_band,
    check_attention_shapes,
    check_causal_alignment,
    check_score_elements,
    check_window_pair,
)

__all__ = [
    "AttentionInputs",
    "MAX_SCORE_ELEMENTS",
    "abs_max",
    "alibi_tile",
    "attend",
    "scaled_scores",
    "attend_with_lse",
    "alibi_max",
    "check_alibi_range",
    "check_alibi_slopes",
    "check_dropout",
    "check_softcap",
    "gqa_reduce",
    "check_inputs",
    "low_precision_dtype",
    "check_key_padding",
    "check_mask_and_bias",
    "check_score_range",
    "check_sinks",
    "stable_softmax",
    "with_sinks",
]

#: The plain path refuses to build a score matrix with more elements than this
#: (2**31 elements = 8 GiB in float32), instead of swapping the machine to death:
#: attnlab's one size limit, :data:`attnlab.checks.MAX_ELEMENTS`.
MAX_SCORE_ELEMENTS = MAX_ELEMENTS

#: What the refusal of a too large score matrix advises.
PLAIN_PATH_HINT = msg("shape.hint_flash")


@dataclass(frozen=True)
class AttentionInputs:
    """Validated attention inputs: arrays of one float dtype, checked shapes, a scale.

    ``allowed`` includes the causal mask and the window (``band``) unless the
    inputs were checked with ``tiled=True`` (the tiled paths build them per
    tile); ``is_causal`` says whether it was asked for. Likewise ``bias``
    includes the ALiBi bias of ``alibi_slopes`` unless ``tiled``. With
    ``enable_gqa``, k and v hold each key/value head repeated ``gqa_groups``
    times (:func:`gqa_reduce` sums a gradient back).
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
    band: Band | None = None  # the causal rule and the window, by position; None = none
    softcap: float | None = None  # c in c·tanh(scores / c); None = no cap
    alibi_slopes: np.ndarray | None = None  # (..., 1, 1) broadcasting to (..., T, S)
    gqa_groups: int = 1  # query heads per key/value head (enable_gqa)
    bias_shape: tuple[int, ...] | None = None  # the caller's bias shape (before ALiBi)
    offset: int = 0  # query i sits at position offset + i (S - T bottom-right, 0 top-left)

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
    scale: Any = None, tiled: bool = False, window: Any = None,
    causal_alignment: Any = "bottom_right", softcap: Any = None, enable_gqa: Any = False,
    alibi_slopes: Any = None,
) -> AttentionInputs:
    """Validate and convert the inputs of attention, before any math.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); mask (bool) and bias
    broadcastable to (..., T, S). With ``enable_gqa`` q is (..., H, T, D) and k,
    v (..., Hkv, S, ·) with H % Hkv == 0. ``alibi_slopes`` (H,) or (B, H),
    broadcasting against the batch dims (..., H). Raises
    :class:`attnlab.AttnlabError` naming the argument, what was expected and
    what was received.

    ``tiled=True`` is for paths that never build the (T, S) score matrix
    (flash): no MAX_SCORE_ELEMENTS refusal, and causality, the window and
    ALiBi are left to them (``band``, ``alibi_slopes``).
    """
    low_precision = low_precision_dtype(q, k, v)
    q_arr = as_float_array(q, "q")
    k_arr = as_float_array(k, "k")
    v_arr = as_float_array(v, "v")
    enable_gqa = check_flag(enable_gqa, "enable_gqa")
    groups = 1
    if enable_gqa:
        groups = check_gqa_heads(q_arr.shape, k_arr.shape, v_arr.shape)
        k_arr, v_arr = repeat_kv(k_arr, groups), repeat_kv(v_arr, groups)  # (..., H, S, ·)
    shapes = check_attention_shapes(q_arr.shape, k_arr.shape, v_arr.shape)
    batch, T, S, D = shapes.batch, shapes.T, shapes.S, shapes.D
    score_shape = (*batch, T, S)
    if not tiled:
        check_score_elements(score_shape, PLAIN_PATH_HINT, limit=MAX_SCORE_ELEMENTS)
    dtype = np.result_type(q_arr, k_arr, v_arr)
    q_arr, k_arr, v_arr = (a.astype(dtype, copy=False) for a in (q_arr, k_arr, v_arr))

    scale_value = check_scale(scale, D)
    cap = check_softcap(softcap)
    alignment = check_causal_alignment(causal_alignment)
    is_causal = check_flag(is_causal, "is_causal")
    band = attention_band(T, S, is_causal=is_causal, window=check_window_pair(window, is_causal),
                          causal_alignment=alignment)
    allowed, bias_arr, is_causal = check_mask_and_bias(
        mask, bias, is_causal, score_shape, dtype, tiled=True
    )
    bias_shape = None if bias_arr is None else tuple(bias_arr.shape)
    slopes = check_alibi_slopes(alibi_slopes, batch, dtype, T, S)
    check_score_range(
        abs_max(q_arr), abs_max(k_arr), D, scale_value, dtype,
        bias_max=(float(np.max(bias_arr)) if bias_arr is not None and bias_arr.size else 0.0)
        + alibi_max(slopes, T, S),
    )
    offset = S - T if alignment == "bottom_right" else 0
    if not tiled:
        if band is not None:
            window_allowed = band_mask(band, T, S)  # (T, S)
            allowed = window_allowed if allowed is None else (allowed & window_allowed)
        if slopes is not None:
            alibi = alibi_tile(slopes, offset, 0, T, 0, S)  # (..., T, S)
            bias_arr = alibi if bias_arr is None else bias_arr + alibi

    out_dtype = low_precision if low_precision is not None else dtype
    return AttentionInputs(q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, is_causal,
                           out_dtype, tuple(batch), band, cap, slopes, groups, bias_shape,
                           offset)


def low_precision_dtype(*arrays: Any) -> np.dtype | None:
    """float16 (or bfloat16, ml_dtypes') when every input has it: computed in float32 and
    returned in it, as torch does on CPU; else None."""
    dtypes = {getattr(a, "dtype", None) for a in arrays}
    if len(dtypes) == 1:
        (only,) = dtypes
        if only == np.float16 or getattr(only, "name", None) == "bfloat16":
            return np.dtype(only)
    return None


def attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None, scale: float = 1.0, *, softcap: float | None = None,
    keep: np.ndarray | None = None, keep_scale: float = 1.0, sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(cap(q kᵀ · scale) + bias, where allowed) v, on already validated arrays.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); allowed (bool, True =
    may attend), bias and keep (bool, True = kept by dropout) broadcastable to
    (..., T, S) -> out (..., T, Dv), weights (..., T, S). ``softcap`` c makes
    the scaled scores c·tanh(s / c) before the bias and the mask. With ``keep``
    the weights are multiplied by keep · keep_scale (dropout) before v; the
    returned weights are those. ``sinks`` (H, 1, 1), from :func:`check_sinks`: each
    head's sink logit joins every row's softmax and takes no value. No checks: call
    it below a boundary that ran :func:`check_inputs` (or an equivalent check of its
    own arguments).
    """
    out, weights, _ = attend_with_lse(q, k, v, allowed, bias, scale, softcap=softcap, keep=keep,
                                      keep_scale=keep_scale, lse=False, sinks=sinks)
    return out, weights


def attend_with_lse(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None, scale: float = 1.0, *, softcap: float | None = None,
    keep: np.ndarray | None = None, keep_scale: float = 1.0, lse: bool = True,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`attend`, and the log-sum-exp (..., T) of each row's scores (float64, natural
    log, -inf for a row with nothing to attend to, as flash's; the sink included), before
    dropout."""
    scaled = scaled_scores(q, k, allowed, bias, scale, softcap=softcap,
                           keep=keep)  # (..., T, S)
    if sinks is not None:
        joined, row_lse = softmax_with_lse(with_sinks(scaled, sinks), in_place=True, lse=lse)
        weights = joined[..., :-1]  # (..., T, S): the sink's column takes no value
    else:
        weights, row_lse = softmax_with_lse(scaled, in_place=True, lse=lse)  # (..., T, S), (..., T)
    if keep is not None:
        weights *= keep
        weights *= np.asarray(keep_scale, dtype=weights.dtype)  # (..., T, S) after dropout
    return weights @ v, weights, row_lse  # (..., T, Dv), (..., T, S), (..., T)


def scaled_scores(
    q: np.ndarray, k: np.ndarray, allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None, scale: float = 1.0, *, softcap: float | None = None,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """The scores the softmax of :func:`attend` reads: cap(q kᵀ · scale) + bias, -inf where
    not allowed; a new array. Shapes: q (..., T, D), k (..., S, D) -> (..., T, S)
    (broadcast with allowed, bias and keep). No checks."""
    scaled = q @ np.swapaxes(k, -1, -2)  # (..., T, S) scores
    scaled *= np.asarray(scale, dtype=scaled.dtype)  # in place: one pass, no copy
    if softcap is not None:
        cap = np.asarray(softcap, dtype=scaled.dtype)
        scaled /= cap
        np.tanh(scaled, out=scaled)
        scaled *= cap  # (..., T, S) c·tanh(s / c)
    extra = [a.shape for a in (bias, allowed, keep) if a is not None]
    if extra and np.broadcast_shapes(scaled.shape, *extra) != scaled.shape:
        # A mask/bias with more batch dims than q and k: materialise the broadcast.
        scaled = np.array(np.broadcast_to(scaled, np.broadcast_shapes(scaled.shape, *extra)))
    if bias is not None:
        with np.errstate(over="ignore"):  # score + finfo.min past the float range: -inf, blocked
            scaled += bias  # (..., T, S)
    if allowed is not None:
        np.copyto(scaled, -np.inf, where=~allowed)  # (..., T, S) blocked -> -inf
    return scaled
