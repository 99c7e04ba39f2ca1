"""Variable-length batches without padding in PyTorch; behaves identically to
:func:`attnlab.fast.varlen.varlen_attention`.

Packed layout (FlashAttention's ``flash_attn_varlen_func``)::

    q (total_q, H, D)    k (total_k, Hkv, D)    v (total_k, Hkv, Dv)
    cu_seqlens_q, cu_seqlens_k (B + 1,) int: start at 0, never decrease, end at the totals
    max_seqlen_q, max_seqlen_k: at least the longest sequence
    -> out (total_q, H, Dv)

Attention never crosses a sequence boundary: each sequence attends alone
(``is_causal``, ``window`` and ``softcap`` per sequence, bottom-right
aligned), query head h reading key/value head h // (H / Hkv). Gradients flow
to q, k and v through autograd.

The sequences of one (T_b, S_b) are gathered into one batch and go through
:func:`attnlab.torch.kernel.attend` (torch's fused kernel, unless a soft cap
asks for the plain path); the results are scattered back into the packed rows.
``cu_seqlens`` are read on the host (as ``max_seqlen`` must be) to group the
sequences.

Dimension legend: B sequences, H query heads, Hkv key/value heads, T_b / S_b
sequence b's query / key length, D head dim, Dv value dim.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from ..checks import check_flag, check_scale
from ..fast.varlen import check_sequences, check_varlen_shapes
from ..fast.varlen_layout import packed_groups
from ..kernel import check_softcap
from ..shapes import attention_band, check_window_pair
from . import debug
from .checks import as_float_tensor, check_same_device, check_sinks_tensor
from .kernel import attend, band_allowed

__all__ = ["varlen_attention"]


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> torch.Tensor:
    """Attention over a packed batch of sequences of different lengths, without padding;
    behaves identically to :func:`attnlab.fast.varlen.varlen_attention`.

    Shapes:
        q  (total_q, H, D)     k (total_k, Hkv, D)     v (total_k, Hkv, Dv)
        cu_seqlens_q, cu_seqlens_k (B + 1,) int (a tensor, an array or a list)
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence
        -> out (total_q, H, Dv)

    Equivalent to the following, and differentiable like it::

        for b in range(B):
            rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
            rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
            out[rows_q] = scaled_dot_product_attention(
                q[rows_q].transpose(0, 1),
                k[rows_k].repeat_interleave(H // Hkv, 1).transpose(0, 1),
                v[rows_k].repeat_interleave(H // Hkv, 1).transpose(0, 1),
                is_causal=is_causal, window=window, softcap=softcap,
                sinks=sinks).transpose(0, 1)

    >>> cu = torch.tensor([0, 3, 8])
    >>> q = k = v = torch.randn(8, 2, 4)
    >>> varlen_attention(q, k, v, cu, cu, 5, 5, is_causal=True).shape
    torch.Size([8, 2, 4])
    """
    q_t, k_t, v_t = (as_float_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    check_varlen_shapes(q_t.shape, k_t.shape, v_t.shape)
    check_same_device(q_t, "q", k_t, "k")
    check_same_device(q_t, "q", v_t, "v")
    cu_q, cu_k = check_sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 q_t.shape[0], k_t.shape[0])
    D = int(q_t.shape[2])
    is_causal = check_flag(is_causal, "is_causal")
    pair = check_window_pair(window, is_causal)
    cap = check_softcap(softcap)
    scale_value = check_scale(scale, D)
    dtype = torch.promote_types(torch.promote_types(q_t.dtype, k_t.dtype), v_t.dtype)
    q_t, k_t, v_t = (t.to(dtype) for t in (q_t, k_t, v_t))
    sink_t = check_sinks_tensor(sinks, q_t.shape[1:2], q_t)  # (H,)
    if sink_t is not None:
        sink_t = sink_t.to(dtype)
    if debug.debug_checks_enabled():
        debug.check_finite([("q", q_t), ("k", k_t), ("v", v_t)])
        debug.check_tensor_score_range(q_t, k_t, None, scale_value)
    return _attend_packed(q_t, k_t, v_t, cu_q, cu_k, scale_value, is_causal, pair, cap, sink_t)


def _attend_packed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: np.ndarray, cu_k: np.ndarray,
    scale: float, is_causal: bool, window: tuple[int | None, int | None] | None,
    softcap: float | None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # (total_q, H, D), (total_k, Hkv, D), (total_k, Hkv, Dv) -> (total_q, H, Dv)
    total_q, H, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    G = H // Hkv
    pieces: list[torch.Tensor] = []
    rows: list[np.ndarray] = []
    for T, S, rows_q, rows_k in packed_groups(cu_q, cu_k):
        n = len(rows_q)
        index_q = torch.from_numpy(rows_q.reshape(-1)).to(q.device)
        index_k = torch.from_numpy(rows_k.reshape(-1)).to(q.device)
        q_g = q.index_select(0, index_q).reshape(n, T, Hkv, G, D).permute(0, 2, 3, 1, 4)
        k_g = k.index_select(0, index_k).reshape(n, S, Hkv, D).transpose(1, 2)[:, :, None]
        v_g = v.index_select(0, index_k).reshape(n, S, Hkv, Dv).transpose(1, 2)[:, :, None]
        allowed = None
        band = attention_band(T, S, is_causal=is_causal, window=window,
                              causal_alignment="bottom_right")
        if window is not None and band is not None:  # else is_causal alone: the fused kernel's
            allowed = band_allowed(band, T, S, q.device)  # (T, S)
        if sinks is not None:  # the kernel takes one sink per head of q: (n, H, ·, ·)
            q_h = q_g.reshape(n, H, T, D)  # head h = g·G + j
            k_h = k_g.expand(n, Hkv, G, S, D).reshape(n, H, S, D)
            v_h = v_g.expand(n, Hkv, G, S, Dv).reshape(n, H, S, Dv)
            out_h = cast(torch.Tensor, attend(q_h, k_h, v_h, allowed, None, scale,
                                              is_causal=is_causal and allowed is None,
                                              softcap=softcap, sinks=sinks))  # (n, H, T, Dv)
            out_g = out_h.reshape(n, Hkv, G, T, Dv)
        else:
            # (n, Hkv, G, T, D) against (n, Hkv, 1, S, ·): the key/value heads are not copied.
            out_g = cast(torch.Tensor, attend(q_g, k_g, v_g, allowed, None, scale,
                                              is_causal=is_causal and allowed is None,
                                              softcap=softcap))  # (n, Hkv, G, T, Dv)
        pieces.append(out_g.permute(0, 3, 1, 2, 4).reshape(n * T, H, Dv))  # (n·T, H, Dv)
        rows.append(rows_q.reshape(-1))
    out = q.new_zeros((total_q, H, Dv))  # (total_q, H, Dv); rows of empty sequences stay 0
    if pieces:
        index = torch.from_numpy(np.concatenate(rows)).to(q.device)
        out = out.index_copy(0, index, torch.cat(pieces))  # differentiable in the pieces
    return out
