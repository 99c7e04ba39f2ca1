"""The attention formula in torch, once: every attnlab.torch path computes through :func:`attend`.

    attend(q, k, v, allowed, bias, scale):
        scaled  = q @ kᵀ · scale + bias          (..., T, S)
        weights = softmax(scaled where allowed)  rows with nothing allowed -> 0
        out     = weights @ v                    (..., T, Dv)

It is the torch twin of :func:`attnlab.kernel.attend`. The public functions
(:func:`attnlab.torch.scaled_dot_product_attention`, ``MultiHeadAttention``,
``SelfAttentionLayer``, the KV caches) validate their inputs once at their own
boundary (:func:`check_inputs` for q, k, v, mask and bias) and call
:func:`attend` on checked tensors; nothing below checks again.

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
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..errors import (
    ShapeError,
    check_broadcastable,
    check_flag,
    check_scale,
    shape_str,
)
from ..kernel import check_alibi_range, check_softcap
from ..shapes import (
    AttentionShapes,
    Band,
    attention_band,
    check_attention_shapes,
    check_causal_alignment,
    check_score_elements,
    check_window_pair,
)
from . import debug
from .checks import as_bool_tensor, as_float_tensor, check_same_device, check_tensor_alloc
from .gqa import check_gqa_heads, repeat_kv

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

#: What to do when the plain path's score matrix would be too large.
PLAIN_PATH_HINT = "ask for no weights to use the fused kernel"

_HALF = (torch.float16, torch.bfloat16)


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


class AttentionInputs(NamedTuple):
    """Checked attention inputs: tensors of one float dtype on one device, and the options.

    (A named tuple rather than a frozen dataclass: it is built at every call, and
    costs a quarter as much.)
    """

    q: torch.Tensor  # (..., T, D)
    k: torch.Tensor  # (..., S, D)
    v: torch.Tensor  # (..., S, Dv)
    allowed: torch.Tensor | None  # bool, broadcastable to (..., T, S), without the causal rule
    bias: torch.Tensor | None  # q's dtype, broadcastable to (..., T, S); -inf allowed
    scale: float
    is_causal: bool
    shapes: AttentionShapes
    softcap: float | None = None  # c in c·tanh(scores / c); None = no cap


def check_inputs(
    q: Any, k: Any, v: Any, mask: Any = None, *, bias: Any = None, is_causal: Any = False,
    scale: Any = None, return_weights: bool = False, window: Any = None,
    causal_alignment: Any = "bottom_right", softcap: Any = None, enable_gqa: Any = False,
    alibi_slopes: Any = None,
) -> AttentionInputs:
    """Validate q, k, v, mask, bias and the options from their metadata, before any math.

    The same rules and messages as :func:`attnlab.kernel.check_inputs`, except
    for values: NaN, Inf and score overflow are checked only under
    :func:`attnlab.torch.debug_checks` (reading values waits for the device).
    Inputs are promoted to one float dtype (integers to float64).

    A window, a top-left causal rule (T ≠ S) and ALiBi's bias are folded into
    ``allowed`` and ``bias`` here; ``is_causal`` stays only for the bottom-right
    rule alone (which the fused kernel can take as a flag when T == S). With
    ``enable_gqa`` k and v come back with each key/value head repeated (autograd
    sums their gradients back).
    """
    q_t = as_float_tensor(q, "q")
    k_t = as_float_tensor(k, "k")
    v_t = as_float_tensor(v, "v")
    if check_flag(enable_gqa, "enable_gqa"):
        groups = check_gqa_heads(q_t.shape, k_t.shape, v_t.shape)
        k_t, v_t = repeat_kv(k_t, groups), repeat_kv(v_t, groups)  # (..., H, S, ·)
    shapes = check_attention_shapes(q_t.shape, k_t.shape, v_t.shape)
    check_same_device(q_t, "q", k_t, "k")
    check_same_device(q_t, "q", v_t, "v")
    score_shape = (*shapes.batch, shapes.T, shapes.S)
    if return_weights or not (q_t.numel() and k_t.numel() and v_t.numel()):
        check_score_elements(score_shape, PLAIN_PATH_HINT)  # the plain path builds it
    scale_value = check_scale(scale, shapes.D)
    is_causal = check_flag(is_causal, "is_causal")
    T, S = shapes.T, shapes.S
    cap, band, alignment = None, None, "bottom_right"
    if not (window is None and softcap is None and causal_alignment == "bottom_right"):
        # (the common call skips these checks: a few microseconds of the per-call tax)
        cap = check_softcap(softcap)
        alignment = check_causal_alignment(causal_alignment)
        band = attention_band(T, S, is_causal=is_causal,
                              window=check_window_pair(window, is_causal),
                              causal_alignment=alignment)

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

    dtype = q_t.dtype
    if not dtype == k_t.dtype == v_t.dtype:
        dtype = torch.promote_types(torch.promote_types(dtype, k_t.dtype), v_t.dtype)
        q_t, k_t, v_t = (t.to(dtype) for t in (q_t, k_t, v_t))
    if bias_t is not None and bias_t.dtype != dtype:
        bias_t = bias_t.to(dtype)
    if band is not None and band != Band(None, 0, S - T):  # more than the bottom-right rule
        in_band = band_allowed(band, T, S, q_t.device)  # (T, S)
        allowed = in_band if allowed is None else (allowed & in_band)
        is_causal = False
    if alibi_slopes is not None:
        alibi = _alibi_bias(alibi_slopes, shapes.batch, S - T if alignment == "bottom_right"
                            else 0, T, S, q_t)  # (..., T, S)
        bias_t = alibi if bias_t is None else bias_t + alibi
    return AttentionInputs(q_t, k_t, v_t, allowed, bias_t, scale_value, is_causal, shapes, cap)


def _alibi_bias(
    slopes: Any, batch: tuple[int, ...], offset: int, T: int, S: int, like: torch.Tensor
) -> torch.Tensor:  # (H,) or (B, H) -> (..., H, T, S)
    """ALiBi's -slope·|i' - j| for slopes (H,) or (B, H), as the NumPy twin's per-tile bias."""
    slopes_t = as_float_tensor(slopes, "alibi_slopes")
    if slopes_t.ndim not in (1, 2):
        raise ShapeError(
            f"alibi_slopes: expected (H,) or (B, H), got {shape_str(slopes_t.shape)}"
        )
    check_broadcastable(slopes_t.shape, batch, "alibi_slopes", "the batch dims (..., H)")
    check_same_device(like, "q", slopes_t, "alibi_slopes")
    if debug.debug_checks_enabled():  # values are read only then, naming alibi_slopes
        debug.check_finite([("alibi_slopes", slopes_t)])
        if slopes_t.numel():
            check_alibi_range(float(slopes_t.detach().abs().amax()), T, S,
                              debug.numpy_dtype(compute_dtype(like.dtype)))
    check_tensor_alloc((*slopes_t.shape, T, S), like.dtype, "the ALiBi bias (..., H, T, S)", "q, k")
    slopes_t = slopes_t.to(like.dtype)
    query_pos = torch.arange(T, device=like.device, dtype=like.dtype)[:, None] + offset
    distance = (query_pos - torch.arange(S, device=like.device, dtype=like.dtype)[None, :]).abs()
    return -slopes_t[..., None, None] * distance  # (..., H, T, S)


def band_allowed(band: Band, T: int, S: int, device: Any = None) -> torch.Tensor:  # -> (T, S)
    """The checked band's mask (causal rule and window by position), True = may attend; the
    twin of :func:`attnlab.masks.band_mask`."""
    check_tensor_alloc((T, S), torch.bool, "the window mask (T, S)", "q, k")
    query_pos = torch.arange(T, device=device)[:, None] + band.offset  # (T, 1)
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    allowed = torch.ones((T, S), dtype=torch.bool, device=device)
    if band.right is not None:
        allowed = allowed & (key_pos <= query_pos + band.right)
    if band.left is not None:
        allowed = allowed & (key_pos >= query_pos - band.left)
    return allowed  # (T, S)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32 on the plain path (as the NumPy core does)."""
    return torch.float32 if dtype in _HALF else dtype


def causal_allowed(T: int, S: int, device: Any = None) -> torch.Tensor:  # -> (T, S)
    """The bottom-right causal rule, True = may attend: query i, at S - T + i, sees
    keys j <= S - T + i."""
    check_tensor_alloc((T, S), torch.bool, "the causal mask (T, S)", "q, k")
    query_pos = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) absolute positions
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    return key_pos <= query_pos  # (T, S)


def window_allowed(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | tuple[int, int],
    is_causal: bool, global_pos: Sequence[int] = (),
) -> torch.Tensor:  # (T,), (S,) -> (T, S)
    """The sliding-window rule on positions, as :func:`attnlab.fast.sparse.sliding_window_mask`.

    ``is_causal``: the W most recent keys, itself included (p - W < j <= p); else
    the query and (W - 1) / 2 keys on each side. A checked pair (left, right) of
    ints: p - left <= j <= p + right. ``global_pos``: keys every query sees and
    queries that see every key (still cut at j <= p when causal).
    """
    check_tensor_alloc((len(query_pos), len(key_pos)), torch.int64, "the window offsets (T, S)",
                "q, k")
    offset = key_pos[None, :] - query_pos[:, None]  # (T, S): key position - query position
    if isinstance(window, tuple):
        left, right = window
        allowed = (offset >= -left) & (offset <= right)  # (T, S)
    elif is_causal:
        allowed = (offset <= 0) & (offset > -window)  # (T, S)
    else:
        allowed = offset.abs() <= (window - 1) // 2  # (T, S)
    if global_pos:
        chosen = torch.tensor(global_pos, dtype=key_pos.dtype, device=key_pos.device)  # (G,)
        allowed = allowed | torch.isin(key_pos, chosen)[None, :]  # everyone sees them
        allowed = allowed | torch.isin(query_pos, chosen)[:, None]  # they see everyone
        if is_causal:
            allowed = allowed & (offset <= 0)
    return allowed  # (T, S)


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
