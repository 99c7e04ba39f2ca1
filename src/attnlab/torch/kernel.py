"""The attention formula in torch, once: every attnlab.torch path computes through :func:`attend`.

    attend(q, k, v, allowed, bias, scale):
        scaled  = q @ kᵀ · scale + bias          (..., T, S)
        weights = softmax(scaled where allowed)  rows with nothing allowed -> 0
        out     = weights @ v                    (..., T, Dv)

It is the torch twin of :func:`attnlab.kernel.attend`. The public functions
(:func:`attnlab.torch.scaled_dot_product_attention`, ``MultiHeadAttention``,
``SelfAttentionLayer``, the KV caches) validate their inputs once at their own
boundary (:func:`check_inputs`, from :mod:`attnlab.torch.kernel_inputs`, for q, k, v,
mask and bias) and call :func:`attend` on checked tensors; nothing below checks again.

Two paths, one answer. Without weights the call goes to PyTorch's fused
``torch.nn.functional.scaled_dot_product_attention`` (flash or memory-efficient
kernels, no (T, S) matrix in memory); with them, or for empty inputs, the
plain path runs, op for op the NumPy core's. The fused path is given exactly
what makes it equal the plain one:

- ``is_causal`` here is aligned bottom-right (query i sits at S - T + i); torch's
  is top-left. torch's flag is used only when T == S, where the two agree;
  otherwise the causal mask is built and passed explicitly.
- rows with nothing to attend to are set to 0 after the fused call, so the
  result does not depend on what a given kernel does with them.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims, which broadcast.
Mask convention: ``allowed`` is bool, **True = may attend**; additive values
go through ``bias``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .checks import check_tensor_alloc
from .kernel_inputs import (
    PLAIN_PATH_HINT,
    AttentionInputs,
    band_allowed,
    causal_allowed,
    check_inputs,
    compute_dtype,
    window_allowed,
)

#: torch's own fused attention, bound once: code that swaps the global
#: (``F.scaled_dot_product_attention = compat.scaled_dot_product_attention``, the
#: usual way to route a model through attnlab) must not make attnlab call itself.
TORCH_SDPA = F.scaled_dot_product_attention

__all__ = [
    "AttentionInputs",
    "check_inputs",
    "attend",
    "stable_softmax",
    "scaled_scores",
    "band_allowed",
    "causal_allowed",
    "window_allowed",
    "compute_dtype",
    "PLAIN_PATH_HINT",
    "CPU_FUSED_ZEROES_EMPTY_ROWS",
    "fast_fused",
]


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


#: Since PyTorch 2.5 (pytorch#133882: SDPA and its fused CPU kernels use a "safe"
#: softmax) a row with nothing to attend to comes out of the fused CPU kernel as 0,
#: output and gradients, exactly attnlab's rule; there :func:`attend` skips its own
#: fix-up (a reduction over the mask and a copy of the output: ~1 ms at B 8, H 8,
#: T 1024). Other devices and older versions keep it. tests/torch/test_overhead.py
#: checks the assumption against the installed torch.
CPU_FUSED_ZEROES_EMPTY_ROWS = _torch_version() >= (2, 5)


def stable_softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:  # (...) -> (...)
    """The NumPy core's softmax, op for op, without validation: -inf = excluded, an all
    -inf slice gives zeros (where ``torch.softmax`` gives NaN)."""
    if scores.shape[dim] == 0:  # S = 0: nothing to normalise
        return torch.zeros_like(scores)
    # The shift changes nothing mathematically, so it carries no gradient.
    row_max = scores.detach().amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), 0.0, row_max)  # all-masked row
    exps = torch.exp(scores - row_max)
    sums = exps.sum(dim=dim, keepdim=True)
    # Rows with nothing to attend to have sum 0: divide by 1 instead, leaving zeros.
    return exps / torch.where(sums == 0.0, 1.0, sums)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    softcap: float | None = None,
    dropout_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """softmax(cap(q kᵀ · scale) + bias, where allowed) v on checked tensors of one dtype and
    device.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); ``allowed`` bool and
    ``bias`` float (of q's dtype), broadcastable to (..., T, S) -> out (..., T, Dv),
    then weights (..., T, S) if ``return_weights``, then lse (..., T) if
    ``return_lse``. ``allowed`` does not include the causal rule; ``is_causal``
    adds it (bottom-right). ``softcap`` c: c·tanh(s / c) on the scaled scores,
    before bias and mask. ``dropout_p`` > 0 drops weights (callers pass 0 in eval
    mode), with ``dropout_mask`` (bool, True = kept) if given, else torch's RNG.
    A soft cap, a dropout mask or the lse take the plain path. ``sinks`` (H,), q's
    dtype and device, q (..., H, T, D): each head's sink logit joins every row's
    softmax and takes no value (the fused path gives it as one more key, of zeros,
    whose score is the sink through a float mask).
    """
    T, S = q.shape[-2], k.shape[-2]
    # torch's own is_causal masks with -inf *before* scaling: a scale <= 0 (or one that
    # rounds to 0 in q's dtype) turns the mask into NaN (-inf·0) or +inf. Build it instead.
    if is_causal and not (T == S and allowed is None and bias is None
                          and scale >= torch.finfo(q.dtype).tiny):
        causal = causal_allowed(T, S, q.device)  # (T, S)
        allowed = causal if allowed is None else (allowed & causal)  # (..., T, S)
        is_causal = False
    if (return_weights or return_lse or softcap is not None or dropout_mask is not None
            or not (q.numel() and k.numel() and v.numel())):
        # The fused kernel has no rule for empty inputs (S = 0 above all), no soft cap,
        # takes no dropout mask and gives no lse.
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        check_tensor_alloc((*batch, T, S), compute_dtype(q.dtype), "the score matrix (..., T, S)",
                           "q, k")
        return _plain(q, k, v, allowed, bias, scale, is_causal, dropout_p, return_weights,
                      softcap, dropout_mask, return_lse, sinks)
    if sinks is not None:
        return _fused_with_sinks(q, k, v, allowed, bias, scale, is_causal, dropout_p, sinks)
    return _fused(q, k, v, allowed, bias, scale, is_causal, dropout_p)


def _fused_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
    bias: torch.Tensor | None, scale: float, is_causal: bool, dropout_p: float,
    sinks: torch.Tensor,
) -> torch.Tensor:  # -> (..., T, Dv)
    """The fused kernel with sinks: one more key of zeros (score 0) and value of zeros, and a
    float mask that is the bias (-inf where not allowed) and each head's sink in that
    key's column. A row with no key left attends to its sink alone: output 0."""
    T, S = q.shape[-2], k.shape[-2]
    if is_causal:  # only reached with T == S and no mask (see attend)
        allowed = causal_allowed(T, S, q.device)  # (T, S)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    check_tensor_alloc((*batch, T, S + 1), q.dtype, "the sinks' float mask (..., H, T, S + 1)",
                       "q, k")
    q = q.expand(*batch, *q.shape[-2:])  # (..., H, T, D)
    k = k.expand(*batch, *k.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    k_ext = torch.cat([k, k.new_zeros((*batch, 1, k.shape[-1]))], dim=-2)  # (..., S + 1, D)
    v_ext = torch.cat([v, v.new_zeros((*batch, 1, v.shape[-1]))], dim=-2)  # (..., S + 1, Dv)
    scores_mask = q.new_zeros((*batch, T, S))  # (..., H, T, S)
    if bias is not None:
        scores_mask = scores_mask + bias
    if allowed is not None:
        scores_mask = scores_mask.masked_fill(~allowed, float("-inf"))
    sink_column = sinks.to(q.dtype)[:, None, None].expand(*batch, T, 1)  # (..., H, T, 1)
    attn_mask = torch.cat([scores_mask, sink_column], dim=-1)  # (..., H, T, S + 1)
    return TORCH_SDPA(q, k_ext, v_ext, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def fast_fused(q: Any, k: Any, v: Any, mask: Any, is_causal: Any) -> torch.Tensor | None:
    """The fused kernel's answer for the commonest call, or None to take the checked path.

    ``scaled_dot_product_attention(q, k, v[, mask][, is_causal=...])`` with tensors of one
    float dtype on one device, equal leading dims (no broadcasting), matching D and S,
    no empty dim, a bool mask already broadcastable without leading dims to add, and no
    other option: every check :func:`check_inputs` would make passes for such a call, so
    it goes straight to the fused kernel (a few hundred nanoseconds of Python instead of
    ~10 microseconds). Anything else returns None, and the full check runs, with its
    errors.
    """
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return None
    dtype = q.dtype
    if not (k.dtype == dtype and v.dtype == dtype and dtype in _FUSED_DTYPES):
        return None
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    n = len(q_shape)
    if not (n >= 2 and len(k_shape) == n and len(v_shape) == n
            and q_shape[:-2] == k_shape[:-2] == v_shape[:-2]
            and q_shape[-1] == k_shape[-1] and k_shape[-2] == v_shape[-2]
            and q.numel() and k.numel() and v.numel()):
        return None
    device = q.device
    if not (k.device == device and v.device == device):
        return None
    T, S = q_shape[-2], k_shape[-2]
    if is_causal is True:
        if mask is not None or T != S:
            return None
    elif is_causal is not False:
        return None
    if mask is not None:
        if not (type(mask) is torch.Tensor and mask.dtype == torch.bool
                and 2 <= mask.ndim <= n and mask.device == device):
            return None
        m_shape = mask.shape
        if m_shape[-1] not in (1, S):
            return None
        offset = n - len(m_shape)  # the mask's dims line up with (..., T) from the right
        for i in range(len(m_shape) - 1):
            if m_shape[i] != 1 and m_shape[i] != q_shape[offset + i]:
                return None
    # The same fused call the checked path makes (scale = 1/√D, as check_scale gives it).
    return _fused(q, k, v, mask, None, 1.0 / math.sqrt(q_shape[-1]), is_causal, 0.0)


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:  # -> (..., T, Dv)
    """torch's fused kernel, given exactly what makes it equal :func:`_plain`."""
    q_lead, k_lead, v_lead = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    if not q_lead == k_lead == v_lead:  # the fused kernel does not broadcast batch dims
        batch = torch.broadcast_shapes(q_lead, k_lead, v_lead)
        q = q.expand(*batch, *q.shape[-2:])  # (..., T, D), a view
        k = k.expand(*batch, *k.shape[-2:])  # (..., S, D)
        v = v.expand(*batch, *v.shape[-2:])  # (..., S, Dv)
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
    out = TORCH_SDPA(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )  # (..., T, Dv)
    if attn_mask is not None and not (CPU_FUSED_ZEROES_EMPTY_ROWS and q.device.type == "cpu"):
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
    softcap: float | None = None,
    dropout_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The plain computation, op for op the NumPy core's (float16/bfloat16 in float32)."""
    out_dtype = q.dtype
    work = compute_dtype(out_dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    T, S = q.shape[-2], k.shape[-2]
    if is_causal:  # only reached with T == S and no mask (see attend)
        allowed = causal_allowed(T, S, q.device)  # (T, S)
    scaled = scaled_scores(q, k, allowed, bias, scale, softcap=softcap)  # (..., T, S)
    if sinks is not None:  # each head's sink logit as one more column, dropped after softmax
        column = sinks.to(work)[:, None, None].expand(*scaled.shape[:-1], 1)  # (..., H, T, 1)
        scaled = torch.cat([scaled, column], dim=-1)  # (..., H, T, S + 1)
        weights = stable_softmax(scaled, dim=-1)[..., :-1]  # (..., H, T, S)
    else:
        weights = stable_softmax(scaled, dim=-1)  # (..., T, S)
    if dropout_mask is not None:
        weights = weights * dropout_mask / (1.0 - dropout_p)  # (..., T, S) the given keep-mask
    elif dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)  # (..., T, S)
    out = weights @ v  # (..., T, Dv)
    out, weights = out.to(out_dtype), weights.to(out_dtype)
    results: tuple[torch.Tensor, ...] = (out,)
    if return_weights:
        results += (weights,)
    if return_lse:
        results += (_row_lse(scaled),)  # (..., T)
    return results if len(results) > 1 else out


def scaled_scores(
    q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None, bias: torch.Tensor | None,
    scale: float, *, is_causal: bool = False, softcap: float | None = None,
) -> torch.Tensor:  # (..., T, D), (..., S, D) -> (..., T, S)
    """The scores the softmax of :func:`attend` reads, in q's dtype: cap(q kᵀ · scale) +
    bias, -inf where not allowed (``is_causal`` bottom-right). The twin of
    :func:`attnlab.kernel.scaled_scores`; no checks."""
    if is_causal:
        causal = causal_allowed(q.shape[-2], k.shape[-2], q.device)  # (T, S)
        allowed = causal if allowed is None else allowed & causal
    scaled = (q @ k.transpose(-1, -2)) * scale  # (..., T, S)
    if softcap is not None:
        scaled = torch.tanh(scaled / softcap) * softcap  # (..., T, S)
    if bias is not None:
        scaled = scaled + bias.to(scaled.dtype)  # (..., T, S)
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed, float("-inf"))  # (..., T, S)
    return scaled


def _row_lse(scaled: torch.Tensor) -> torch.Tensor:  # (..., T, S) -> (..., T)
    """log Σ exp of each row, -inf for a row with nothing to attend to (the NumPy twin's
    rule; torch.logsumexp gives -inf there too, and a zero gradient through it)."""
    if scaled.shape[-1] == 0:
        return scaled.new_full(scaled.shape[:-1], float("-inf"))
    return torch.logsumexp(scaled, dim=-1)
