"""Scaled dot-product attention in PyTorch.

Behaves identically to :func:`attnlab.scaled_dot_product_attention` (the NumPy
core): same shapes, same mask convention, same causal alignment, same rule for
rows with nothing to attend to. Tested against it to float64 precision.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias, masked) V,   scale = 1/√D

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims.

Mask convention (the only one in attnlab): ``mask`` is a bool tensor and
**True = may attend** (the same as ``torch.nn.functional.scaled_dot_product_attention``,
and the opposite of ``torch.nn.MultiheadAttention``'s ``attn_mask``, where True
blocks). Additive values go through ``bias``. Seed 000's ``mask * -1e9``
(1 = blocked) is ``m == 0``; seed 001's ``masked_fill(mask == 0, -1e9)`` is ``m == 1``.

Two paths, one answer. Without ``return_weights`` the call goes to PyTorch's
fused ``torch.nn.functional.scaled_dot_product_attention`` (flash or
memory-efficient kernels, no (T, S) matrix in memory); with it, or for empty
inputs, the plain path below runs. The fused path is given exactly what makes
it equal the plain one:

- ``is_causal`` here is aligned bottom-right (query i sits at S - T + i); torch's
  is top-left. torch's flag is used only when T == S, where the two agree;
  otherwise the causal mask is built and passed explicitly.
- rows with nothing to attend to are set to 0 after the fused call, so the
  result does not depend on what a given kernel does with them.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch
import torch.nn.functional as F

from ..attention import check_axis
from ..errors import (
    AttnlabError,
    ShapeError,
    check_alloc,
    check_broadcastable,
    check_flag,
    check_positive_int,
    check_scale,
    shape_str,
)
from ..kernel import MAX_SCORE_ELEMENTS, check_score_range
from .checks import (
    as_bool_tensor,
    as_float_tensor,
    broadcast_batch,
    check_bias_values,
    check_finite,
    check_has_data,
    check_probability,
    check_same_device,
    compute_dtype,
)

__all__ = ["scaled_dot_product_attention", "causal_mask", "softmax", "check_tensor_score_range"]


def causal_mask(T: int, S: int | None = None, *, device: Any = None) -> torch.Tensor:  # -> (T, S)
    """Bottom-right aligned causal mask, True = may attend; behaves identically to
    :func:`attnlab.causal_mask`.

    Query i sits at absolute position S - T + i and may attend to keys
    j ≤ S - T + i. S defaults to T.

    >>> causal_mask(2, 4).int()
    tensor([[1, 1, 1, 0],
            [1, 1, 1, 1]], dtype=torch.int32)
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    check_alloc((T, S), torch.bool, "the causal mask (T, S)", sizes)
    query_pos = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) absolute positions
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    return key_pos <= query_pos  # (T, S)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:  # (...) -> (...)
    """Softmax along ``dim`` with attnlab's rule: -inf = excluded, an all -inf slice gives zeros.

    Behaves identically to :func:`attnlab.softmax` (where torch.softmax gives NaN
    for an all -inf slice). Integers are computed in float64.

    >>> softmax(torch.tensor([0.0, float("-inf")])).tolist()
    [1.0, 0.0]
    >>> softmax(torch.full((2,), float("-inf"))).tolist()
    [0.0, 0.0]
    """
    arr = as_float_tensor(x, "x")
    if arr.ndim == 0:
        raise ShapeError("x: expected at least 1 dimension, got a scalar")
    dim = check_axis(dim, arr.ndim, "dim")
    check_has_data([("x", arr)])
    if bool((torch.isnan(arr) | torch.isposinf(arr)).any()):
        raise AttnlabError("x: expected finite values or -inf, got NaN or +inf")
    return _softmax(arr, dim)


def _softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The NumPy core's softmax, op for op; no validation."""
    if scores.shape[dim] == 0:  # S = 0: nothing to normalise
        return torch.zeros_like(scores)
    # The shift changes nothing mathematically, so it carries no gradient.
    row_max = scores.detach().amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), 0.0, row_max)  # all-masked row
    exps = torch.exp(scores - row_max)
    sums = exps.sum(dim=dim, keepdim=True)
    # Rows with nothing to attend to have sum 0: divide by 1 instead, leaving zeros.
    return exps / torch.where(sums == 0.0, 1.0, sums)


@overload
def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = ..., *,
    bias: torch.Tensor | None = ..., is_causal: bool = ..., dropout_p: float = ...,
    scale: float | None = ..., return_weights: Literal[False] = ...,
) -> torch.Tensor: ...
@overload
def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = ..., *,
    bias: torch.Tensor | None = ..., is_causal: bool = ..., dropout_p: float = ...,
    scale: float | None = ..., return_weights: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...
def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention; behaves identically to
    :func:`attnlab.scaled_dot_product_attention`.

    Shapes:
        q    (..., T, D)      queries
        k    (..., S, D)      keys
        v    (..., S, Dv)     values
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); added to the scaled scores (-inf allowed)
        ->   out (..., T, Dv), and weights (..., T, S) if ``return_weights``

    Leading dims of q, k and v broadcast against each other.

    Efficient implementation equivalent to the following (the plain path, which
    runs when ``return_weights`` is set)::

        scores  = q @ k.transpose(-1, -2)              # (..., T, S)
        scaled  = scores * scale + bias                # scale = 1/√D by default
        allowed = mask & causal_mask(T, S)             # bottom-right causal
        weights = softmax(scaled.masked_fill(~allowed, -inf))   # all -inf row -> 0
        weights = dropout(weights, dropout_p)
        out     = weights @ v                          # (..., T, Dv)

    ``dropout_p`` is applied whenever it is > 0 (as in torch's function; modules
    pass 0 in eval mode). The returned weights are the ones multiplied with v,
    after dropout.

    A row with no key to attend to gets weights 0 and output 0.

    Dtypes: inputs are promoted to a common float dtype; integers compute in
    float64; float16 and bfloat16 go to the fused kernel as they are and are
    computed in float32 on the plain path, returned in their own dtype.

    >>> q = k = v = torch.eye(2, dtype=torch.float64)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).round(decimals=3)
    tensor([[1.0000, 0.0000],
            [0.3300, 0.6700]], dtype=torch.float64)
    """
    return_weights = check_flag(return_weights, "return_weights")
    q_t, k_t, v_t, allowed, bias_t, scale_value = _prepare(
        q, k, v, mask, bias, is_causal, scale, return_weights
    )
    p = check_probability(dropout_p, "dropout_p")
    return attend(
        q_t, k_t, v_t, allowed, bias_t, scale_value,
        is_causal=check_flag(is_causal, "is_causal"), dropout_p=p, return_weights=return_weights,
    )


def _prepare(
    q: Any, k: Any, v: Any, mask: Any, bias: Any, is_causal: Any, scale: Any, return_weights: bool
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, float
]:
    """Validate and convert everything, before any math; the same checks as the NumPy core."""
    q_t = as_float_tensor(q, "q")
    k_t = as_float_tensor(k, "k")
    v_t = as_float_tensor(v, "v")
    for name, t, layout in (("q", q_t, "(..., T, D)"), ("k", k_t, "(..., S, D)"),
                            ("v", v_t, "(..., S, Dv)")):
        if t.ndim < 2:
            raise ShapeError(f"{name}: expected {layout}, got {shape_str(t.shape)}")
    check_same_device(q_t, "q", k_t, "k")
    check_same_device(q_t, "q", v_t, "v")
    T, D = q_t.shape[-2:]
    S = k_t.shape[-2]
    if k_t.shape[-1] != D:
        raise ShapeError(
            f"k: expected (..., S, {D}) to match q's last dim {D}, got {shape_str(k_t.shape)}"
        )
    if v_t.shape[-2] != S:
        raise ShapeError(
            f"v: expected (..., {S}, Dv) to match k's length S = {S}, got {shape_str(v_t.shape)}"
        )
    batch = broadcast_batch(q_t, k_t, v_t)
    score_shape = (*batch, T, S)
    if return_weights or not _fused_ok(q_t, k_t, v_t, score_shape):
        check_score_size(score_shape)

    scale_value = check_scale(scale, D)
    check_flag(is_causal, "is_causal")

    allowed: torch.Tensor | None = None
    if mask is not None:
        allowed = as_bool_tensor(mask, "mask")
        check_broadcastable(allowed.shape, score_shape, "mask", "(..., T, S)")
        check_same_device(q_t, "q", allowed, "mask")
    bias_t: torch.Tensor | None = None
    if bias is not None:
        bias_t = as_float_tensor(bias, "bias")
        check_broadcastable(bias_t.shape, score_shape, "bias", "(..., T, S)")
        check_same_device(q_t, "q", bias_t, "bias")
        check_bias_values(bias_t)
    check_finite([("q", q_t), ("k", k_t), ("v", v_t)])

    dtype = torch.promote_types(torch.promote_types(q_t.dtype, k_t.dtype), v_t.dtype)
    q_t, k_t, v_t = (t.to(dtype) for t in (q_t, k_t, v_t))
    if bias_t is not None:
        bias_t = bias_t.to(dtype)
    return q_t, k_t, v_t, allowed, bias_t, scale_value


def check_score_size(score_shape: tuple[int, ...]) -> None:
    n_scores = 1
    for size in score_shape:
        n_scores *= int(size)
    if n_scores > MAX_SCORE_ELEMENTS:
        raise AttnlabError(
            f"q, k: the score matrix {shape_str(score_shape)} would hold {n_scores:,} elements, "
            f"more than the plain path's limit of {MAX_SCORE_ELEMENTS:,} "
            "(attnlab.attention.MAX_SCORE_ELEMENTS); ask for no weights to use the fused kernel"
        )


def _fused_ok(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_shape: tuple[int, ...]
) -> bool:
    """Whether torch's fused kernel is used: every size non-zero (it has no rule for S = 0)."""
    return all(int(n) > 0 for n in (*score_shape, q.shape[-1], v.shape[-1]))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    *,
    is_causal: bool,
    dropout_p: float,
    return_weights: bool,
    k_max: torch.Tensor | None = None,
    range_checked: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention on validated inputs (same dtype and device): the dispatcher between the paths.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv), allowed bool and bias
    float broadcastable to (..., T, S) -> (..., T, Dv) [, weights (..., T, S)].
    ``allowed`` does not include the causal mask; ``is_causal`` adds it.
    ``k_max`` (0-d) is max|k| if the caller keeps track of it (a KV cache), else computed.
    ``range_checked``: the caller already ran :func:`check_tensor_score_range` (a KV
    cache does, before appending anything).
    """
    if not range_checked:
        check_tensor_score_range(q, k, bias, scale, k_max)
    T, S = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    # torch's own is_causal masks with -inf *before* scaling: a scale <= 0 (or one that
    # rounds to 0 in q's dtype) turns the mask into NaN (-inf·0) or +inf. Build it instead.
    flag_ok = T == S and allowed is None and bias is None and scale >= torch.finfo(q.dtype).tiny
    if is_causal and not flag_ok:
        causal = causal_mask(T, S, device=q.device)  # (T, S)
        allowed = causal if allowed is None else (allowed & causal)  # (..., T, S)
        is_causal = False
    if return_weights or not _fused_ok(q, k, v, (*batch, T, S)):
        return _plain(q, k, v, allowed, bias, scale, is_causal, dropout_p, return_weights)
    return _fused(q, k, v, allowed, bias, scale, is_causal, dropout_p, batch)


def check_tensor_score_range(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float,
    k_max: torch.Tensor | None,
) -> None:
    """The NumPy core's :func:`attnlab.attention.check_score_range`: refuse q, k whose
    scaled scores could overflow (to inf, then NaN); one host sync for the maxima."""
    if not q.numel() or not k.numel():
        return
    with torch.no_grad():
        maxima = [q.detach().abs().amax(), k.detach().abs().amax() if k_max is None else k_max]
        if bias is not None and bias.numel():
            maxima.append(bias.detach().amax())
        values = torch.stack([m.to(torch.float64) for m in maxima]).tolist()
    q_max, k_max_value = values[0], values[1]
    bias_max = values[2] if len(values) > 2 else 0.0
    dtype = compute_dtype(torch.promote_types(q.dtype, k.dtype))
    check_score_range(q_max, k_max_value, q.shape[-1], scale, _NUMPY_DTYPES[dtype],
                      bias_max=bias_max)


_NUMPY_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    is_causal: bool,
    dropout_p: float,
    batch: torch.Size,
) -> torch.Tensor:  # -> (..., T, Dv)
    """torch's fused kernel, given exactly what makes it equal :func:`_plain`."""
    T, S = q.shape[-2], k.shape[-2]
    q = q.expand(*batch, T, q.shape[-1])  # (..., T, D), a view
    k = k.expand(*batch, S, k.shape[-1])  # (..., S, D)
    v = v.expand(*batch, S, v.shape[-1])  # (..., S, Dv)
    attn_mask: torch.Tensor | None
    if bias is None:
        attn_mask = allowed  # bool: torch's convention is also True = take part
    elif allowed is None:
        attn_mask = bias
    else:
        attn_mask = bias.masked_fill(~allowed, float("-inf"))  # (..., T, S)
    if attn_mask is not None and attn_mask.ndim < 2:
        # A (S,) or () mask broadcasts to (..., T, S) like any other, but the fused
        # kernel reads its dim -2: give it one.
        attn_mask = attn_mask.reshape((1,) * (2 - attn_mask.ndim) + tuple(attn_mask.shape))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )  # (..., T, Dv)
    if attn_mask is not None:
        # Rows with nothing to attend to: 0, whatever the kernel made of them.
        if attn_mask.dtype == torch.bool:
            has_key = attn_mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        else:
            has_key = (attn_mask != float("-inf")).any(dim=-1, keepdim=True)  # (..., T, 1)
        out = out.masked_fill(~has_key, 0.0)  # (..., T, Dv); no host sync to ask first
    return out


def _plain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    is_causal: bool,
    dropout_p: float,
    return_weights: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The plain computation, op for op the NumPy core's (float16/bfloat16 in float32)."""
    out_dtype = q.dtype
    work = compute_dtype(out_dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    T, S = q.shape[-2], k.shape[-2]
    if is_causal:  # only reached with T == S and no mask (see attend)
        allowed = causal_mask(T, S, device=q.device)  # (T, S)
    scores = q @ k.transpose(-1, -2)  # (..., T, S)
    scaled = scores * scale  # (..., T, S)
    if bias is not None:
        scaled = scaled + bias.to(work)  # (..., T, S)
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed, float("-inf"))  # (..., T, S)
    weights = _softmax(scaled, dim=-1)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)  # (..., T, S)
    out = weights @ v  # (..., T, Dv)
    out, weights = out.to(out_dtype), weights.to(out_dtype)
    return (out, weights) if return_weights else out
