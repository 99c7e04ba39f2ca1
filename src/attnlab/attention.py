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

from .checks import as_float_array, check_flag, check_ndim, shape_str
from .errors import AttnlabError, ShapeError
from .kernel import (
    MAX_SCORE_ELEMENTS,
    attend,
    attend_with_lse,
    check_dropout,
    check_inputs,
    check_sinks,
)
from .masked_softmax import stable_softmax

__all__ = ["softmax", "scaled_dot_product_attention", "self_attention", "MAX_SCORE_ELEMENTS"]

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
    return stable_softmax(arr, axis)


def check_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    """Return ``axis`` as an int in [-ndim, ndim - 1], or raise naming ``name``."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
            or not -ndim <= axis < ndim:
        raise AttnlabError(f"{name}: expected an int in [{-ndim}, {ndim - 1}], got {axis!r}")
    return int(axis)


@overload
def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    dropout_p: float = ..., scale: float | None = ..., return_weights: Literal[False] = ...,
    return_lse: Literal[False] = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: Any = ..., rng: Any = ..., sinks: Any = ...,
) -> np.ndarray: ...
@overload
def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    dropout_p: float = ..., scale: float | None = ..., return_weights: Literal[True],
    return_lse: Literal[False] = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: Any = ..., rng: Any = ..., sinks: Any = ...,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    dropout_p: float = ..., scale: float | None = ..., return_weights: bool = ...,
    return_lse: Literal[True], window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: Any = ..., rng: Any = ..., sinks: Any = ...,
) -> tuple[np.ndarray, ...]: ...
def scaled_dot_product_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
    return_lse: bool = False,
    window: Any = None,
    causal_alignment: str = "bottom_right",
    softcap: float | None = None,
    enable_gqa: bool = False,
    alibi_slopes: Any = None,
    dropout_mask: Any = None,
    rng: Any = None,
    sinks: Any = None,
) -> np.ndarray | tuple[np.ndarray, ...]:
    """Scaled dot-product attention.

    Shapes:
        q    (..., T, D)      queries (..., H, T, D) with ``enable_gqa``
        k    (..., S, D)      keys    (..., Hkv, S, D) with ``enable_gqa``, H % Hkv == 0
        v    (..., S, Dv)     values
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); added to the scaled scores (-inf allowed)
        alibi_slopes  (H,) or (B, H): adds -slope·|i' - j| (FlashAttention's ``alibi_slopes``)
        dropout_mask  bool, broadcastable to (..., T, S); True = kept (or drawn from ``rng``)
        sinks (H,): attention sinks, one logit per head (q (..., H, T, D))
        ->   out (..., T, Dv), then weights (..., T, S) if ``return_weights``, then
             lse (..., T) if ``return_lse``

    The leading dims of q, k and v broadcast against each other (e.g. one k/v
    shared by several query batches).

    Formula::

        scores  = q @ kᵀ                          (..., T, S)
        scaled  = scores * scale                  scale = 1/√D by default
        scaled  = softcap · tanh(scaled / softcap)      if ``softcap``
        scaled  = scaled + bias + alibi           alibi = -slope·|i' - j|
        weights = softmax(scaled where allowed)   allowed = mask & causal & window
        lse     = log Σ_S exp(scaled where allowed)     (..., T), natural log
        with sinks: softmax and lse over [scaled, sink_h], the sink's column dropped
        weights = weights · keep / (1 - dropout_p)      if dropout
        out     = weights @ v                     (..., T, Dv)

    Positions: query i sits at i' = S - T + i (``causal_alignment="bottom_right"``,
    the default, FlashAttention's) or i' = i (``"top_left"``, torch's
    ``is_causal`` and JAX's), key j at j. ``is_causal`` allows keys j ≤ i'.
    With T == S both alignments are the usual lower-triangular mask; with T < S
    bottom-right is what cached decoding needs (the new queries are the last T
    positions); with T > S bottom-right leaves the first T - S queries nothing
    (output 0). ``window=(left, right)`` (FlashAttention's ``window_size``, -1 =
    unbounded) allows keys i' - left ≤ j ≤ i' + right; an int W means the W most
    recent keys with ``is_causal`` and W odd, centred, without (as
    :func:`attnlab.fast.sparse.sliding_window_attention`).

    A row with no key to attend to (all masked, or all bias -inf) gets weights 0,
    output 0 and lse -inf (lse = the sink's logit with ``sinks``).

    ``sinks`` (GPT-OSS's ``s_aux``, FlashAttention's ``learnable_sink``): head h's
    logit joins every row's softmax as one more column that takes no value, so a
    row's weights sum to 1 - exp(sink_h - lse) (StreamingLLM's attention sink,
    learned): Hugging Face's GPT-OSS eager attention, exactly.

    Dropout (off by default) takes ``dropout_mask`` (True = kept) or draws it
    from ``rng`` (a ``np.random.Generator`` or a seed); the kept weights are
    scaled by 1 / (1 - dropout_p), as torch's; the lse is of the weights before
    dropout.

    Dtypes: float32 stays float32, float64 stays float64, integers compute in
    float64, float16 and bfloat16 (``ml_dtypes``) compute in float32 and are
    returned in their own dtype (lse is float64).

    >>> import numpy as np
    >>> q = k = v = np.eye(2)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).round(3)
    array([[1.  , 0.  ],
           [0.33, 0.67]])
    """
    return_weights = check_flag(return_weights, "return_weights")
    return_lse = check_flag(return_lse, "return_lse")
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale,
                          window=window, causal_alignment=causal_alignment, softcap=softcap,
                          enable_gqa=enable_gqa, alibi_slopes=alibi_slopes)
    keep, keep_scale = check_dropout(dropout_p, rng, dropout_mask,
                                     (*inputs.batch, inputs.T, inputs.S))
    sink_logits = check_sinks(sinks, inputs.batch, inputs.q.dtype)
    out, weights, lse = attend_with_lse(
        inputs.q, inputs.k, inputs.v, inputs.allowed, inputs.bias, inputs.scale,
        softcap=inputs.softcap, keep=keep, keep_scale=keep_scale, lse=return_lse,
        sinks=sink_logits,
    )
    if inputs.out_dtype != out.dtype:
        out, weights = out.astype(inputs.out_dtype), weights.astype(inputs.out_dtype)
    results: tuple[np.ndarray, ...] = (out,)
    if return_weights:
        results += (weights,)
    if lse is not None:
        results += (lse,)
    return results if len(results) > 1 else out


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
    inputs = check_inputs(Q, K, V)  # checks the projected scores' range
    return attend(inputs.q, inputs.k, inputs.v, scale=inputs.scale)[0]
