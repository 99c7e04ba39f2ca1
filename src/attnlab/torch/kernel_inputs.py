"""The checks of torch attention's inputs, once: :func:`check_inputs` and the masks it builds.

Every public torch path (:func:`attnlab.torch.scaled_dot_product_attention`,
``MultiHeadAttention``, the KV caches, compat) checks q, k, v, the mask, the
bias and the options here, at its own boundary, with the rules and messages of
:func:`attnlab.kernel.check_inputs`, and hands the checked tensors to
:func:`attnlab.torch.kernel.attend`. The allowed-position masks (the causal rule,
a window, a band) are built here too: the checks fold them into ``allowed``.

Dimension legend: B batch, H heads, Hkv key/value heads, T query length, S key
length, D head dim, Dv value dim. ``...`` is any number of leading batch dims.
Mask convention: ``allowed`` is bool, **True = may attend**; additive values go
through ``bias``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ..checks import check_broadcastable, check_flag, check_scale, shape_str
from ..errors import ShapeError
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

__all__ = [
    "AttentionInputs",
    "PLAIN_PATH_HINT",
    "band_allowed",
    "causal_allowed",
    "check_inputs",
    "compute_dtype",
    "window_allowed",
]

#: What to do when the plain path's score matrix would be too large.
PLAIN_PATH_HINT = "ask for no weights to use the fused kernel"

_HALF = (torch.float16, torch.bfloat16)


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
