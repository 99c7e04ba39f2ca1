"""Backward passes written out by hand: softmax, attention, multi-head attention, LayerNorm.

Each function here is the chain rule for one forward pass of the core, in NumPy,
with its formula in the docstring. Every one takes the upstream gradient
``dout = ∂L/∂out`` of some scalar loss L (same shape as the forward's output) and
returns ∂L/∂(each input), each with the shape of that input. An input that was
broadcast in the forward gets its gradient summed over the broadcast dims, as
autograd does.

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length, D head dim, Dv value dim, E model width (Ekv for the context).

Mask convention (the only one in attnlab): ``mask`` is boolean, **True = may
attend**; additive values go through ``bias``. A query row with no key to attend
to has weights 0 and output 0 in the forward, so every gradient through that row
is exactly 0 (never NaN).

The forwards are recomputed inside each backward (there is no cache to keep in
sync). They are checked against central finite differences and against torch
autograd in ``tests/test_grad*.py``.

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

from ..attention import _prepare, check_axis, scaled_dot_product_attention
from ..errors import AttnlabError, ShapeError, as_float_array, shape_str
from .layers import LayerNorm, layer_norm_stats
from .multihead import MultiHeadAttention, merge_heads, split_heads

__all__ = [
    "AttentionGrads",
    "LayerNormGrads",
    "MultiHeadGrads",
    "layer_norm_backward",
    "mha_backward",
    "sdpa_backward",
    "softmax_backward",
]


class AttentionGrads(NamedTuple):
    """Gradients of :func:`sdpa_backward`, each with the shape of its input."""

    dq: np.ndarray  # (..., T, D)
    dk: np.ndarray  # (..., S, D)
    dv: np.ndarray  # (..., S, Dv)
    dbias: np.ndarray | None  # bias's own shape; None when no bias was given


class LayerNormGrads(NamedTuple):
    """Gradients of :func:`layer_norm_backward`."""

    dx: np.ndarray  # (..., E)
    dgamma: np.ndarray  # (E,)
    dbeta: np.ndarray  # (E,)


class MultiHeadGrads(NamedTuple):
    """Gradients of :func:`mha_backward`.

    ``params`` has one entry per parameter that is set on the module, with the
    same names and shapes as ``MultiHeadAttention.parameters()``. For
    self-attention (``context=None``) ``dx`` includes the paths through the keys
    and values, and ``dcontext`` is None.
    """

    dx: np.ndarray  # (B, T, E) or (T, E)
    dcontext: np.ndarray | None  # (B, S, Ekv) or (S, Ekv)
    params: dict[str, np.ndarray]
    dbias: np.ndarray | None  # the attention bias's own shape


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
    return _softmax_backward(y, dy.astype(y.dtype, copy=False), axis)


def _softmax_backward(y: np.ndarray, dy: np.ndarray, axis: int = -1) -> np.ndarray:
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
    scale: float | None = None,
) -> AttentionGrads:
    """Gradients of :func:`attnlab.scaled_dot_product_attention` (recomputes the forward).

    Shapes:
        q    (..., T, D)      k (..., S, D)      v (..., S, Dv)
        dout (..., T, Dv)     ∂L/∂out, the shape of the forward's output
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); -inf allowed
        ->   dq (..., T, D), dk (..., S, D), dv (..., S, Dv), dbias (bias's shape) or None

    ``mask``, ``bias``, ``is_causal`` (bottom-right aligned) and ``scale``
    (default 1/√D) mean exactly what they mean in the forward.

    Formula, per batch element, with P the attention weights (T, S)::

        forward:  z = q kᵀ · scale + bias,  masked -> -inf      (T, S)
                  P = softmax(z)                                (T, S)
                  out = P v                                     (T, Dv)
        backward: dv = Pᵀ dout                                  (S, Dv)
                  dP = dout vᵀ                                  (T, S)
                  dz = P ⊙ (dP − Σ_S dP ⊙ P)                    (T, S)  softmax backward
                  dbias = dz                                    (T, S)
                  dq = dz k · scale                             (T, D)
                  dk = dzᵀ q · scale                            (S, D)

    Masked entries and fully-masked rows have P = 0, hence dz = 0: they pass no
    gradient to q, k or bias, and v gets none from them.
    """
    q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, out_dtype = _prepare(
        q, k, v, mask, bias, is_causal, scale
    )
    # The core forward, on the validated arrays, gives the weights P (is_causal is in `allowed`).
    _, weights = scaled_dot_product_attention(
        q_arr, k_arr, v_arr, allowed, bias=bias_arr, scale=scale_value, return_weights=True
    )  # (..., T, S)
    T, Dv = q_arr.shape[-2], v_arr.shape[-1]
    dout_arr = _upstream(dout, (*weights.shape[:-2], T, Dv), "(..., T, Dv)", weights.dtype)
    dq, dk, dv, dscaled = _sdpa_backward(q_arr, k_arr, v_arr, weights, dout_arr, scale_value)
    return AttentionGrads(
        _sum_to_shape(dq, q_arr.shape).astype(out_dtype, copy=False),
        _sum_to_shape(dk, k_arr.shape).astype(out_dtype, copy=False),
        _sum_to_shape(dv, v_arr.shape).astype(out_dtype, copy=False),
        None if bias_arr is None
        else _sum_to_shape(dscaled, bias_arr.shape).astype(out_dtype, copy=False),
    )


def _sdpa_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, weights: np.ndarray, dout: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The formula of :func:`sdpa_backward`, on broadcast (unreduced) shapes; also returns dz."""
    dv = np.swapaxes(weights, -1, -2) @ dout  # (..., S, Dv)
    dweights = dout @ np.swapaxes(v, -1, -2)  # (..., T, S)
    dscaled = _softmax_backward(weights, dweights)  # (..., T, S)
    dscores = dscaled * np.asarray(scale, dtype=dscaled.dtype)  # (..., T, S)
    dq = dscores @ k  # (..., T, D)
    dk = np.swapaxes(dscores, -1, -2) @ q  # (..., S, D)
    return dq, dk, dv, dscaled


# ------------------------------------------------------------- multi-head attention


def mha_backward(
    mha: MultiHeadAttention,
    x: Any,
    dout: Any,
    context: Any = None,
    mask: Any = None,
    *,
    key_padding: Any = None,
    bias: Any = None,
    is_causal: bool = False,
) -> MultiHeadGrads:
    """Gradients of ``mha(x, context, mask, ...)`` for every parameter and input.

    Shapes:
        x           (B, T, E) or (T, E)
        dout        (B, T, E_out) or (T, E_out): ∂L/∂out
        context     (B, S, Ekv) or (S, Ekv); None = self-attention
        mask        bool, broadcastable to (B, H, T, S); True = may attend
        key_padding bool (B, S); True = a real token
        bias        float, broadcastable to (B, H, T, S)
        ->          MultiHeadGrads(dx, dcontext, params, dbias)

    Formula (G = H / Hkv query heads share each key/value head; sums over the
    leading dims B, T or B, S are implied in every parameter gradient)::

        forward:  Q = x Wq + bq,  K = c Wk + bk,  V = c Wv + bv       split into heads
                  K̃, Ṽ = repeat(K, G), repeat(V, G) over the head axis  (B, H, S, ·)
                  heads = sdpa(Q, K̃, Ṽ)                                 (B, H, T, Dv)
                  M = merge(heads);  out = M Wo + bo                    (B, T, E_out)
        backward: dbo = Σ dout;   dWo = Mᵀ dout;   dM = dout Woᵀ
                  dQ, dK̃, dṼ, dbias = sdpa_backward(..., split(dM))
                  dK_g = Σ_{h in group g} dK̃_h,  dV_g likewise            GQA
                  dWq = xᵀ dQ,  dbq = Σ dQ    (dQ merged to (B, T, H*D)); K, V with c
                  dx = dQ Wqᵀ;   dc = dK Wkᵀ + dV Wvᵀ;   self-attention: dx += dc

    ``dbk`` is always 0 up to rounding: bk adds q·bk to every score of a row,
    and softmax ignores a constant shift.
    """
    if not isinstance(mha, MultiHeadAttention):
        raise AttnlabError(
            f"mha: expected an attnlab.MultiHeadAttention, got {type(mha).__name__}"
        )
    if mha.rope is not None or mha.alibi:
        raise AttnlabError(
            "mha: the backward pass covers multi-head attention without rope/alibi, "
            "expected rope=None and alibi=False"
        )
    x_arr, ctx, mask = mha.prepare_inputs(x, context, mask, key_padding)
    H, Hkv = mha.num_heads, mha.num_kv_heads or mha.num_heads
    group = H // Hkv
    q, k, v = mha.project(x_arr, ctx)  # (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
    k_rep, v_rep = mha.expand_kv(k), mha.expand_kv(v)  # (B, H, S, D), (B, H, S, Dv)
    q_arr, k_arr, v_arr, allowed, bias_arr, scale_value, _ = _prepare(
        q, k_rep, v_rep, mask, bias, is_causal, None
    )
    heads, weights = scaled_dot_product_attention(
        q_arr, k_arr, v_arr, allowed, bias=bias_arr, scale=scale_value, return_weights=True
    )  # (B, H, T, Dv), (B, H, T, S)
    merged = merge_heads(heads)  # (B, T, H*Dv)
    dout_arr = _upstream(
        dout, (*merged.shape[:-1], mha.Wo.shape[1]), "(B, T, E_out)", merged.dtype
    )

    params: dict[str, np.ndarray] = {}
    params["Wo"] = _weight_grad(merged, dout_arr)  # (H*Dv, E_out)
    if mha.bo is not None:
        params["bo"] = _bias_grad(dout_arr)  # (E_out,)
    dheads = split_heads(dout_arr @ mha.Wo.T, H)  # (B, H, T, Dv)

    dq, dk_rep, dv_rep, dscaled = _sdpa_backward(
        q_arr, k_arr, v_arr, weights, dheads, scale_value
    )  # (B, H, T, D), (B, H, S, D), (B, H, S, Dv), (B, H, T, S)
    dk = _sum_groups(dk_rep, Hkv, group)  # (B, Hkv, S, D)
    dv = _sum_groups(dv_rep, Hkv, group)  # (B, Hkv, S, Dv)

    dx = np.zeros_like(x_arr)
    dctx = np.zeros_like(ctx)
    for name, grad_heads, inputs, dinputs in (
        ("q", dq, x_arr, dx), ("k", dk, ctx, dctx), ("v", dv, ctx, dctx)
    ):
        dproj = merge_heads(grad_heads)  # (B, T or S, heads*dim)
        params[f"W{name}"] = _weight_grad(inputs, dproj)  # (E or Ekv, heads*dim)
        if getattr(mha, f"b{name}") is not None:
            params[f"b{name}"] = _bias_grad(dproj)  # (heads*dim,)
        dinputs += dproj @ getattr(mha, f"W{name}").T  # (B, T or S, E or Ekv)

    order = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
    params = {name: params[name] for name in order if name in params}
    dbias = None if bias_arr is None else _sum_to_shape(dscaled, bias_arr.shape)
    if context is None:  # self-attention: x feeds the keys and values too
        return MultiHeadGrads(dx + dctx, None, params, dbias)
    return MultiHeadGrads(dx, dctx, params, dbias)


def _sum_groups(grad: np.ndarray, kv_heads: int, group: int) -> np.ndarray:
    """GQA: undo ``np.repeat(kv, group, axis=-3)`` by summing each group of query heads."""
    if group == 1:
        return grad
    *lead, _, S, dim = grad.shape
    grouped = grad.reshape(*lead, kv_heads, group, S, dim)  # (B, Hkv, G, S, dim)
    return grouped.sum(axis=-3)  # (B, Hkv, S, dim)


def _weight_grad(inputs: np.ndarray, dproj: np.ndarray) -> np.ndarray:
    """∂L/∂W for y = inputs @ W, summed over leading dims: (..., in), (..., out) -> (in, out)."""
    flat_in = inputs.reshape(-1, inputs.shape[-1])  # (N, in)
    flat_out = dproj.reshape(-1, dproj.shape[-1])  # (N, out)
    return flat_in.T @ flat_out  # (in, out)


def _bias_grad(dproj: np.ndarray) -> np.ndarray:
    return dproj.reshape(-1, dproj.shape[-1]).sum(axis=0)  # (out,)


# ---------------------------------------------------------------------- LayerNorm


def layer_norm_backward(norm: LayerNorm, x: Any, dout: Any) -> LayerNormGrads:
    """Gradients of ``norm(x)`` for :class:`attnlab.LayerNorm` (biased variance).

    Shapes: x (..., E), dout (..., E) -> dx (..., E), dgamma (E,), dbeta (E,)

    Formula, per row of E features (means over the E features; sums over rows)::

        forward:  μ = mean(x),  σ = √(mean((x − μ)²) + eps),  x̂ = (x − μ) / σ
                  y = x̂ ⊙ γ + β
        backward: dβ = Σ_rows dy
                  dγ = Σ_rows dy ⊙ x̂
                  dx̂ = dy ⊙ γ
                  dx = (dx̂ − mean(dx̂) − x̂ ⊙ mean(dx̂ ⊙ x̂)) / σ

    The two subtracted means are the paths through μ and through σ.

    >>> ln = LayerNorm(3)
    >>> grads = layer_norm_backward(ln, [[1.0, 2.0, 4.0]], [[1.0, 1.0, 1.0]])
    >>> bool(np.abs(grads.dx).max() < 1e-12), grads.dbeta.tolist()
    (True, [1.0, 1.0, 1.0])
    """
    if not isinstance(norm, LayerNorm):
        raise AttnlabError(f"norm: expected an attnlab.LayerNorm, got {type(norm).__name__}")
    x_arr = as_float_array(x, "x")
    if x_arr.ndim < 1 or x_arr.shape[-1] != norm.d_model:
        raise ShapeError(f"x: expected (..., {norm.d_model}), got {shape_str(x_arr.shape)}")
    dy = _upstream(dout, x_arr.shape, "(..., E)", x_arr.dtype)
    centred, std, rescale = layer_norm_stats(x_arr, norm.eps)  # (..., E), (..., 1), (..., 1)
    inv_scaled = 1.0 / std  # (..., 1)
    normed = centred * inv_scaled  # (..., E)
    inv_std = inv_scaled / rescale  # (..., 1) 1/√(var + eps); rescale is 1 unless |x| is huge
    dnormed = dy * norm.gamma  # (..., E)
    dx = inv_std * (
        dnormed
        - dnormed.mean(axis=-1, keepdims=True)
        - normed * np.mean(dnormed * normed, axis=-1, keepdims=True)
    )  # (..., E)
    dgamma = (dy * normed).reshape(-1, norm.d_model).sum(axis=0)  # (E,)
    dbeta = dy.reshape(-1, norm.d_model).sum(axis=0)  # (E,)
    return LayerNormGrads(dx.astype(x_arr.dtype, copy=False), dgamma, dbeta)


# ------------------------------------------------------------------------ helpers


def _upstream(dout: Any, shape: Sequence[int], layout: str, dtype: np.dtype) -> np.ndarray:
    """Validate ``dout`` = ∂L/∂out: exactly the forward output's shape, finite."""
    arr = as_float_array(dout, "dout")
    if arr.shape != tuple(shape):
        raise ShapeError(
            f"dout: expected the output's shape {layout} = {shape_str(shape)}, "
            f"got {shape_str(arr.shape)}"
        )
    return arr.astype(dtype, copy=False)


def _sum_to_shape(grad: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Reduce a gradient over the dims its input was broadcast along (autograd's rule)."""
    shape = tuple(shape)
    extra = grad.ndim - len(shape)
    reduced = grad.sum(axis=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and reduced.shape[i] != 1)
    if stretched:
        reduced = reduced.sum(axis=stretched, keepdims=True)
    return reduced
