"""Backward passes of the modules, written out by hand: multi-head attention, LayerNorm,
GELU, the feed-forward layer and a whole encoder block (with per-head gates).

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

import copy
import math
from typing import Any, NamedTuple

import numpy as np

from ..backward import attention_backward, check_upstream, sum_to_shape
from ..checks import as_float_array, shape_str
from ..errors import AttnlabError, ShapeError
from ..gqa import gqa_reduce
from ..kernel import attend, check_inputs
from ..special import erf
from .layers import EncoderBlock, FeedForward, LayerNorm, SelfAttentionLayer, gelu, layer_norm_stats
from .multihead import MultiHeadAttention, linear, merge_heads, split_heads

__all__ = [
    "BlockGrads",
    "FeedForwardGrads",
    "LayerNormGrads",
    "MultiHeadGrads",
    "block_backward",
    "feed_forward_backward",
    "gelu_backward",
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
    checked = check_inputs(q, k_rep, v_rep, mask, bias=bias, is_causal=is_causal,
                           scale=mha.scale)
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
    dk = gqa_reduce(dk_rep, group)  # (B, Hkv, S, D)
    dv = gqa_reduce(dv_rep, group)  # (B, Hkv, S, Dv)

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


# ----------------------------------------------------------- GELU and feed-forward


def gelu_backward(x: np.ndarray, dout: np.ndarray, approximate: str = "none") -> np.ndarray:
    """Gradient of :func:`attnlab.nn.layers.gelu` at x: (...), (...) -> (...).

    Formula (Φ, φ the standard normal's distribution and density)::

        exact: d/dx x·Φ(x) = Φ(x) + x·φ(x)
        tanh:  with u = √(2/π)(x + 0.044715 x³), y = ½x(1 + tanh u):
               dy/dx = ½(1 + tanh u) + ½x(1 − tanh² u)·√(2/π)(1 + 3·0.044715 x²)
    """
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x))
    if approximate != "none":
        raise AttnlabError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1.0 + erf(x64 / math.sqrt(2.0)))  # Φ(x)
    pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)  # φ(x)
    return (dout * (cdf + x64 * pdf)).astype(np.result_type(x, dout), copy=False)


_ACTIVATION_GRADS = {
    "relu": lambda pre, d: d * (pre > 0),
    "gelu": lambda pre, d: gelu_backward(pre, d),
    "gelu_tanh": lambda pre, d: gelu_backward(pre, d, "tanh"),
}


class FeedForwardGrads(NamedTuple):
    """Gradients of :func:`feed_forward_backward`."""

    dx: np.ndarray  # (..., E)
    params: dict[str, np.ndarray]  # W1 (E, F), b1 (F,), W2 (F, E), b2 (E,)


def feed_forward_backward(ffn: FeedForward, x: np.ndarray, dout: np.ndarray) -> FeedForwardGrads:
    """Gradients of ``ffn(x) = act(x W1 + b1) W2 + b2``: x (..., E), dout (..., E).

    Formula::

        pre = x W1 + b1;  hidden = act(pre)
        dW2 = hiddenᵀ dout;  db2 = Σ dout;  dhidden = dout W2ᵀ
        dpre = act'(pre) ⊙ dhidden
        dW1 = xᵀ dpre;  db1 = Σ dpre;  dx = dpre W1ᵀ
    """
    if not isinstance(ffn, FeedForward):
        raise AttnlabError(f"ffn: expected an attnlab FeedForward, got {type(ffn).__name__}")
    pre = linear(x, ffn.W1, ffn.b1)  # (..., F)
    hidden = _ACTIVATIONS_FORWARD[ffn.activation](pre)  # (..., F)
    dhidden = dout @ ffn.W2.T  # (..., F)
    dpre = _ACTIVATION_GRADS[ffn.activation](pre, dhidden)  # (..., F)
    params = {"W1": _weight_grad(x, dpre), "b1": _bias_grad(dpre),
              "W2": _weight_grad(hidden, dout), "b2": _bias_grad(dout)}
    return FeedForwardGrads(dpre @ ffn.W1.T, params)


_ACTIVATIONS_FORWARD = {"relu": lambda x: np.maximum(x, 0.0), "gelu": gelu,
                        "gelu_tanh": lambda x: gelu(x, "tanh")}


# ------------------------------------------------------------------ encoder block


class BlockGrads(NamedTuple):
    """Gradients of :func:`block_backward`.

    ``params`` names: ``attn.Wq`` … ``attn.bo`` (as ``MultiHeadAttention.parameters()``),
    ``norm1.gamma``, ``norm1.beta``, and for an :class:`EncoderBlock` ``ffn.W1`` …
    ``ffn.b2``, ``norm2.gamma``, ``norm2.beta``. ``dgates`` (H,) is ∂L/∂ξ for a gate
    ξ_h multiplying head h's output (before Wo) at every item and position, at ξ = 1
    unless ``head_gates`` says otherwise.
    """

    dx: np.ndarray  # (B, T, E)
    params: dict[str, np.ndarray]
    dgates: np.ndarray  # (H,)


def block_backward(
    block: SelfAttentionLayer, x: Any, dout: Any, mask: Any = None, *,
    head_gates: Any = None,
) -> BlockGrads:
    """Gradients of ``block(x, mask=mask)`` for an :class:`EncoderBlock` or
    :class:`SelfAttentionLayer` (post- or pre-LN) in evaluation mode.

    Shapes: x (B, T, E), dout (B, T, E), mask bool broadcastable to (B, H, T, T)
    (True = may attend), head_gates (H,) (default all 1) -> BlockGrads.

    Formula (post-LN; ξ the head gates, G = diag(ξ repeated Dv times))::

        forward:  a = MHA_ξ(x) = concat(ξ_h · head_h) Wo + bo = concat(head) (G Wo) + bo
                  h = LN1(x + a);   y = LN2(h + FFN(h))
        backward: dz2 = LN2'(h + FFN(h)) dy;  dh = dz2 + FFN'(h) dz2
                  dz1 = LN1'(x + a) dh
                  dx  = dz1 + MHA'(x) dz1   (mha_backward with Wo' = G Wo)
                  dξ_h = Σ_{rows r of head h} Σ_c dWo'[r, c] · Wo[r, c]
                  dWo = G dWo'

    pre-LN: h = x + MHA_ξ(LN1(x)); y = h + FFN(LN2(h)), differentiated the same way.
    A gate scales its head's rows of Wo, so the gradient of a gate is read off the
    gradient of Wo'; the head's own output never needs a separate backward.
    """
    if not isinstance(block, SelfAttentionLayer):
        raise AttnlabError(f"block: expected an attnlab EncoderBlock or SelfAttentionLayer, "
                           f"got {type(block).__name__}")
    if block.training and block.dropout.p > 0:
        raise AttnlabError("block: the backward pass covers evaluation mode, expected "
                           "block.eval() (dropout off)")
    mha = block.attn
    H, Dv = mha.num_heads, mha.value_head_dim
    x_arr, _, _, _, _ = mha.check_call(x, None, mask)
    if x_arr.ndim != 3:
        raise ShapeError(f"x: expected (B, T, E), got {shape_str(x_arr.shape)}")
    dy = check_upstream(dout, x_arr.shape, "(B, T, E)", x_arr.dtype)
    gates = np.ones(H) if head_gates is None else as_float_array(head_gates, "head_gates")
    if gates.shape != (H,):
        raise ShapeError(f"head_gates: expected ({H},) (one per head), got "
                         f"{shape_str(gates.shape)}")
    gated = copy.copy(mha)
    gated.Wo = mha.Wo * np.repeat(gates, Dv)[:, None].astype(mha.Wo.dtype)  # (H*Dv, E)
    ffn, norm2 = (block.ffn, block.norm2) if isinstance(block, EncoderBlock) else (None, None)
    params: dict[str, np.ndarray] = {}
    if block.norm == "post":
        attended = gated.forward(x_arr, x_arr, _allowed(gated, x_arr, mask))[0]  # (B, T, E)
        h_in = x_arr + attended  # (B, T, E)
        h = block.norm1.forward(h_in)  # (B, T, E)
        dh = dy
        if ffn is not None and norm2 is not None:
            z2 = h + ffn.forward(h)  # (B, T, E)
            ln2 = layer_norm_backward(norm2, z2, dy)
            ff = feed_forward_backward(ffn, h, ln2.dx)
            dh = ln2.dx + ff.dx
        ln1 = layer_norm_backward(block.norm1, h_in, dh)
        attn = mha_backward(gated, x_arr, ln1.dx, mask=mask)
        dx = ln1.dx + attn.dx
    else:
        normed = block.norm1.forward(x_arr)  # (B, T, E)
        h = x_arr + gated.forward(normed, normed, _allowed(gated, normed, mask))[0]
        dh = dy
        if ffn is not None and norm2 is not None:
            f_in = norm2.forward(h)  # (B, T, E)
            ff = feed_forward_backward(ffn, f_in, dy)
            ln2 = layer_norm_backward(norm2, h, ff.dx)
            dh = dy + ln2.dx
        attn = mha_backward(gated, normed, dh, mask=mask)
        ln1 = layer_norm_backward(block.norm1, x_arr, attn.dx)
        dx = dh + ln1.dx
    dwo_gated = attn.params["Wo"]  # (H*Dv, E): ∂L/∂Wo'
    dgates = (dwo_gated * mha.Wo).reshape(H, Dv, -1).sum(axis=(1, 2))  # (H,)
    for name, grad in attn.params.items():
        params[f"attn.{name}"] = grad
    params["attn.Wo"] = dwo_gated * np.repeat(gates, Dv)[:, None]  # Wo' = G Wo
    params["norm1.gamma"], params["norm1.beta"] = ln1.dgamma, ln1.dbeta
    if ffn is not None:
        for name, grad in ff.params.items():
            params[f"ffn.{name}"] = grad
        params["norm2.gamma"], params["norm2.beta"] = ln2.dgamma, ln2.dbeta
    return BlockGrads(dx, params, dgates)


def _allowed(mha: MultiHeadAttention, x: np.ndarray, mask: Any) -> np.ndarray | None:
    return mha.check_call(x, None, mask)[2]
