"""Backward passes of the core, written out by hand: softmax and scaled dot-product attention.

Each function is the chain rule for one forward pass, in NumPy, with its formula
in the docstring. It takes the upstream gradient ``dout = ∂L/∂out`` of some
scalar loss L (the forward output's shape) and returns ∂L/∂(each input), each
with the shape of that input; an input broadcast in the forward gets its
gradient summed over the broadcast dims, as autograd does. The backward passes
of the modules (multi-head attention, LayerNorm) are in :mod:`attnlab.nn.backward`.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. Mask convention: ``mask`` is boolean, **True = may attend**;
additive values go through ``bias``. A query row with no key to attend to has
weights 0 and output 0 in the forward, so every gradient through it is exactly 0.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), np.ones((2, 5, 6))
>>> dq, dk, dv, dbias = sdpa_backward(q, k, v, np.ones((2, 3, 6)), is_causal=True)
>>> dq.shape, dk.shape, dv.shape, dbias is None
((2, 3, 4), (2, 5, 4), (2, 5, 6), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .attention import check_axis
from .checks import as_float_array, shape_str
from .errors import ShapeError
from .gqa import gqa_reduce
from .kernel import attend, check_dropout, check_inputs, check_sinks

__all__ = [
    "AttentionGrads",
    "SinkAttentionGrads",
    "attention_backward",
    "check_upstream",
    "sdpa_backward",
    "softmax_backward",
    "softmax_backward_rows",
    "sum_to_shape",
]


class AttentionGrads(NamedTuple):
    """Gradients of :func:`sdpa_backward`, each with the shape of its input."""

    dq: np.ndarray  # (..., T, D)
    dk: np.ndarray  # (..., S, D)
    dv: np.ndarray  # (..., S, Dv)
    dbias: np.ndarray | None  # bias's own shape; None when no bias was given


class SinkAttentionGrads(NamedTuple):
    """Gradients of :func:`sdpa_backward` called with ``sinks``: those of
    :class:`AttentionGrads` and the sink logits'."""

    dq: np.ndarray  # (..., T, D)
    dk: np.ndarray  # (..., S, D)
    dv: np.ndarray  # (..., S, Dv)
    dbias: np.ndarray | None  # bias's own shape; None when no bias was given
    dsinks: np.ndarray  # (H,)


# ----------------------------------------------------------------------- softmax


def softmax_backward(weights: Any, dweights: Any, axis: int = -1) -> np.ndarray:
    """Gradient of softmax at its input, given its output and the upstream gradient.

    Shapes: weights (...), dweights (...) -> dscores (...), all the same shape.

    With y = softmax(x) along ``axis`` and dy = ∂L/∂y, the Jacobian
    ∂y_i/∂x_j = y_i (δ_ij − y_j) gives::

        dx = y ⊙ (dy − Σ_j dy_j y_j)        (the sum runs along ``axis``, kept as size 1)

    Entries with y = 0 (masked, or -inf scores) get dx = 0, and so does a row that
    is entirely masked (all y = 0): no NaN.

    >>> y = np.array([0.25, 0.75])
    >>> softmax_backward(y, np.array([1.0, 0.0])).tolist()
    [0.1875, -0.1875]
    """
    y = as_float_array(weights, "weights")
    dy = as_float_array(dweights, "dweights")
    if y.shape != dy.shape:
        raise ShapeError(
            f"dweights: expected the shape of weights {shape_str(y.shape)}, "
            f"got {shape_str(dy.shape)}"
        )
    if y.ndim == 0:
        raise ShapeError("weights: expected at least 1 dimension, got a scalar")
    axis = check_axis(axis, y.ndim)
    return softmax_backward_rows(y, dy.astype(y.dtype, copy=False), axis)


def softmax_backward_rows(y: np.ndarray, dy: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`softmax_backward` without checks: dx = y ⊙ (dy − Σ dy ⊙ y) along ``axis``."""
    return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


# ------------------------------------------------------------ dot-product attention


def sdpa_backward(
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: Any = None,
    causal_alignment: str = "bottom_right",
    softcap: float | None = None,
    enable_gqa: bool = False,
    alibi_slopes: Any = None,
    dropout_mask: Any = None,
    rng: Any = None,
    sinks: Any = None,
) -> AttentionGrads | SinkAttentionGrads:
    """Gradients of :func:`attnlab.scaled_dot_product_attention` (recomputes the forward).

    Shapes:
        q    (..., T, D)      k (..., S, D)      v (..., S, Dv)
        dout (..., T, Dv)     ∂L/∂out, the shape of the forward's output
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); -inf allowed
        ->   dq (..., T, D), dk (..., S, D), dv (..., S, Dv), dbias (bias's shape) or None

    Every option (``mask``, ``bias``, ``is_causal``, ``causal_alignment``,
    ``window``, ``softcap``, ``enable_gqa``, ``alibi_slopes``, dropout and
    ``scale``) means exactly what it means in the forward; dropout needs the
    same ``dropout_mask`` (or the same seed in ``rng``) as the forward. ALiBi's
    slopes are constants (no gradient); with ``enable_gqa`` dk and dv are summed
    over the H / Hkv query heads of each key/value head.

    Formula, per batch element, with P the attention weights (T, S)::

        forward:  z = q kᵀ · scale + bias,  masked -> -inf      (T, S)
                  (z = c·tanh(q kᵀ · scale / c) + bias with a soft cap c)
                  P = softmax(z)                                (T, S)
                  out = (P ⊙ keep / (1 − p)) v                  (T, Dv)  keep = 1 without dropout
        backward: dv = (P ⊙ keep / (1 − p))ᵀ dout               (S, Dv)
                  dP = (dout vᵀ) ⊙ keep / (1 − p)               (T, S)
                  dz = P ⊙ (dP − Σ_S dP ⊙ P)                    (T, S)  softmax backward
                  dbias = dz                                    (T, S)
                  ds = dz ⊙ (1 − tanh²(q kᵀ · scale / c))       (T, S)  with a soft cap
                  dq = ds k · scale                             (T, D)
                  dk = dsᵀ q · scale                            (S, D)

    Masked entries and fully-masked rows have P = 0, hence dz = 0: they pass no
    gradient to q, k or bias, and v gets none from them.

    With ``sinks`` (H,) the weights P are those of the softmax over [z, sink_h]
    without the sink's column, and the result is a :class:`SinkAttentionGrads`
    whose ``dsinks`` (H,) is the sink column's dz (its dP is 0: it takes no value)::

        dsink_h = −Σ_(batch, T) P_sink · Σ_S dP ⊙ P,    P_sink = 1 − Σ_S P
    """
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale,
                          window=window, causal_alignment=causal_alignment, softcap=softcap,
                          enable_gqa=enable_gqa, alibi_slopes=alibi_slopes)
    q_arr, k_arr, v_arr, bias_arr = inputs.q, inputs.k, inputs.v, inputs.bias
    scale_value, out_dtype = inputs.scale, inputs.out_dtype
    keep, keep_scale = check_dropout(dropout_p, rng, dropout_mask,
                                     (*inputs.batch, inputs.T, inputs.S))
    sink_logits = check_sinks(sinks, inputs.batch, q_arr.dtype)
    # The kernel's forward gives the weights P (causal and window are in `allowed`).
    _, weights = attend(q_arr, k_arr, v_arr, inputs.allowed, bias_arr, scale_value,
                        softcap=inputs.softcap, sinks=sink_logits)  # (..., T, S)
    T, Dv = q_arr.shape[-2], v_arr.shape[-1]
    dout_arr = check_upstream(dout, (*weights.shape[:-2], T, Dv), "(..., T, Dv)", weights.dtype)
    cap_slope = None
    if inputs.softcap is not None:
        raw = (q_arr @ np.swapaxes(k_arr, -1, -2)) * scale_value / inputs.softcap  # (..., T, S)
        cap_slope = 1.0 - np.square(np.tanh(raw))  # (..., T, S) d/ds c·tanh(s / c)
    dq, dk, dv, dscaled = attention_backward(q_arr, k_arr, v_arr, weights, dout_arr, scale_value,
                                             keep=keep, keep_scale=keep_scale,
                                             cap_slope=cap_slope)
    groups = inputs.gqa_groups
    grads = AttentionGrads(
        sum_to_shape(dq, q_arr.shape).astype(out_dtype, copy=False),
        gqa_reduce(sum_to_shape(dk, k_arr.shape), groups).astype(out_dtype, copy=False),
        gqa_reduce(sum_to_shape(dv, v_arr.shape), groups).astype(out_dtype, copy=False),
        None if inputs.bias_shape is None
        else sum_to_shape(dscaled, inputs.bias_shape).astype(out_dtype, copy=False),
    )
    if sink_logits is None:
        return grads
    dweights = dout_arr @ np.swapaxes(v_arr, -1, -2)  # (..., T, S) dP
    if keep is not None:
        dweights = dweights * keep * keep_scale
    delta = np.sum(dweights * weights, axis=-1)  # (..., T)
    sink_weight = 1.0 - np.sum(weights, axis=-1)  # (..., T) P_sink
    per_row = -(sink_weight * delta)  # (..., H, T)
    H = sink_logits.shape[0]
    dsinks = per_row.reshape(-1, H, per_row.shape[-1]).sum(axis=(0, 2))  # (H,)
    return SinkAttentionGrads(*grads, dsinks.astype(out_dtype, copy=False))


def attention_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, weights: np.ndarray, dout: np.ndarray,
    scale: float, *, keep: np.ndarray | None = None, keep_scale: float = 1.0,
    cap_slope: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The formula of :func:`sdpa_backward` on validated arrays and the forward's weights.

    Shapes as in :func:`sdpa_backward`, on broadcast (unreduced) shapes; also returns dz
    (..., T, S). ``weights`` are before dropout; ``keep`` (bool, broadcastable to
    (..., T, S)) and ``keep_scale`` are the dropout, ``cap_slope`` (..., T, S) the
    soft cap's derivative 1 − tanh². No checks: for callers that validated their inputs.
    """
    dropped = weights if keep is None else weights * keep * keep_scale  # (..., T, S)
    dv = np.swapaxes(dropped, -1, -2) @ dout  # (..., S, Dv)
    dweights = dout @ np.swapaxes(v, -1, -2)  # (..., T, S)
    if keep is not None:
        dweights = dweights * keep * keep_scale  # (..., T, S) through the dropout
    dscaled = softmax_backward_rows(weights, dweights)  # (..., T, S)
    dcapped = dscaled if cap_slope is None else dscaled * cap_slope  # (..., T, S)
    dscores = dcapped * np.asarray(scale, dtype=dscaled.dtype)  # (..., T, S)
    dq = dscores @ k  # (..., T, D)
    dk = np.swapaxes(dscores, -1, -2) @ q  # (..., S, D)
    return dq, dk, dv, dscaled


# ------------------------------------------------------------------------ helpers


def check_upstream(
    dout: Any, shape: Sequence[int], layout: str, dtype: np.dtype
) -> np.ndarray:
    """Validate ``dout`` = ∂L/∂out: exactly the forward output's shape, finite."""
    arr = as_float_array(dout, "dout")
    if arr.shape != tuple(shape):
        raise ShapeError(
            f"dout: expected the output's shape {layout} = {shape_str(shape)}, "
            f"got {shape_str(arr.shape)}"
        )
    return arr.astype(dtype, copy=False)


def sum_to_shape(grad: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Reduce a gradient over the dims its input was broadcast along (autograd's rule)."""
    shape = tuple(shape)
    extra = grad.ndim - len(shape)
    reduced = grad.sum(axis=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and reduced.shape[i] != 1)
    if stretched:
        reduced = reduced.sum(axis=stretched, keepdims=True)
    return reduced
