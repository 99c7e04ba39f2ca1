"""Backward passes of the modules, written out by hand: multi-head attention and LayerNorm.

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
>>> from attnlab import LayerNorm
>>> norm = LayerNorm(4)
>>> layer_norm_backward(norm, np.arange(8.0).reshape(2, 4), np.ones((2, 4))).dx.shape
(2, 4)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..backward import attention_backward, check_upstream, sum_to_shape
from ..errors import AttnlabError, ShapeError, as_float_array, shape_str
from ..kernel import attend, check_inputs
from .layers import LayerNorm, layer_norm_stats
from .multihead import MultiHeadAttention, merge_heads, split_heads

__all__ = [
    "LayerNormGrads",
    "MultiHeadGrads",
    "layer_norm_backward",
    "mha_backward",
]


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
    checked = check_inputs(q, k_rep, v_rep, mask, bias=bias, is_causal=is_causal)
    q_arr, k_arr, v_arr, bias_arr, scale_value = (
        checked.q, checked.k, checked.v, checked.bias, checked.scale
    )
    heads, weights = attend(
        q_arr, k_arr, v_arr, checked.allowed, bias_arr, scale_value
    )  # (B, H, T, Dv), (B, H, T, S)
    merged = merge_heads(heads)  # (B, T, H*Dv)
    dout_arr = check_upstream(
        dout, (*merged.shape[:-1], mha.Wo.shape[1]), "(B, T, E_out)", merged.dtype
    )

    params: dict[str, np.ndarray] = {}
    params["Wo"] = _weight_grad(merged, dout_arr)  # (H*Dv, E_out)
    if mha.bo is not None:
        params["bo"] = _bias_grad(dout_arr)  # (E_out,)
    dheads = split_heads(dout_arr @ mha.Wo.T, H)  # (B, H, T, Dv)

    dq, dk_rep, dv_rep, dscaled = attention_backward(
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
    dbias = None if bias_arr is None else sum_to_shape(dscaled, bias_arr.shape)
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
    dy = check_upstream(dout, x_arr.shape, "(..., E)", x_arr.dtype)
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


