"""Gradients of varlen attention: the plain backward and the flash one, its twin.

Dimension legend: B sequences, H query heads, Hkv key/value heads, T_b / S_b
sequence b's query / key length, D head dim, Dv value dim.

Both take the packed layout of :mod:`attnlab.fast.varlen` (checked by
:func:`attnlab.fast.varlen_layout.check_varlen_inputs`) and give the gradients
packed like their inputs: :func:`varlen_attention_backward` recomputes each
sequence's weights and applies :func:`attnlab.backward.sdpa_backward`'s
formula; :func:`flash_varlen_attention_backward` goes tile by tile from the
forward's log-sum-exp, with no score matrix, and is tested against it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..backward import attention_backward, check_upstream
from ..checks import check_positive_int
from ..kernel import attend, check_sinks
from .flash import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention_backward
from .flash_parts import LSE_DTYPE, as_forward
from .varlen_layout import (
    check_group_scores,
    check_varlen_inputs,
    group_views,
    grouped_view,
    packed_groups,
    sequence_allowed,
    sequences_with_keys,
)

__all__ = [
    "VarlenGrads",
    "VarlenSinkGrads",
    "flash_varlen_attention_backward",
    "varlen_attention_backward",
]


class VarlenGrads(NamedTuple):
    """Gradients of a varlen attention, packed like their inputs."""

    dq: np.ndarray  # (total_q, H, D)
    dk: np.ndarray  # (total_k, Hkv, D)
    dv: np.ndarray  # (total_k, Hkv, Dv)


class VarlenSinkGrads(NamedTuple):
    """Gradients of a varlen attention with ``sinks``: those of :class:`VarlenGrads` and the
    sink logits'."""

    dq: np.ndarray  # (total_q, H, D)
    dk: np.ndarray  # (total_k, Hkv, D)
    dv: np.ndarray  # (total_k, Hkv, Dv)
    dsinks: np.ndarray  # (H,)


def varlen_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window: Any = None,
    softcap: float | None = None,
) -> VarlenGrads:
    """Gradients of :func:`varlen_attention` (recomputes the forward), the plain path.

    Shapes: q, k, v, cu_seqlens as in the forward; dout (total_q, H, Dv) = ∂L/∂out
    -> dq (total_q, H, D), dk (total_k, Hkv, D), dv (total_k, Hkv, Dv).

    Per sequence, :func:`attnlab.backward.sdpa_backward`'s formula on its
    (H, T_b, S_b) weights; a key/value head shared by G query heads gets the sum
    of their gradients.
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    check_group_scores(inputs)
    q_arr, k_arr, v_arr = inputs.q, inputs.k, inputs.v
    cu_q, cu_k = inputs.cu_seqlens_q, inputs.cu_seqlens_k
    H, Hkv, Dv = inputs.num_heads, inputs.num_kv_heads, v_arr.shape[2]
    dout_arr = check_upstream(dout, (q_arr.shape[0], H, Dv), "(total_q, H, Dv)", q_arr.dtype)
    dq, dk, dv = np.zeros_like(q_arr), np.zeros_like(k_arr), np.zeros_like(v_arr)
    for T, S, rows_q, rows_k in packed_groups(cu_q, cu_k):
        if S == 0:
            continue  # no weights, no gradient
        n = len(rows_q)
        # q_g (n, Hkv, G, T, D); k_g, v_g (n, Hkv, 1, S, ·): key/value heads not copied
        q_g, k_g, v_g = group_views(q_arr, k_arr, v_arr, rows_q, rows_k)
        dout_g = grouped_view(dout_arr[rows_q], Hkv)  # (n, Hkv, G, T, Dv)
        allowed = sequence_allowed(T, S, inputs.is_causal, inputs.window)  # (T, S)
        _, weights = attend(q_g, k_g, v_g, allowed, None, inputs.scale,
                            softcap=inputs.softcap)  # (n, Hkv, G, T, S)
        cap_slope = None
        if inputs.softcap is not None:  # d/ds c·tanh(s / c) = 1 - tanh²(s / c)
            raw = (q_g @ np.swapaxes(k_g, -1, -2)) * inputs.scale / inputs.softcap
            cap_slope = 1.0 - np.square(np.tanh(raw))  # (n, Hkv, G, T, S)
        dq_g, dk_g, dv_g, _ = attention_backward(q_g, k_g, v_g, weights, dout_g, inputs.scale,
                                                 cap_slope=cap_slope)
        dq[rows_q] = dq_g.transpose(0, 3, 1, 2, 4).reshape(n, T, H, -1)  # (n, T, H, D)
        dk[rows_k] = dk_g.sum(axis=2).transpose(0, 2, 1, 3)  # (n, S, Hkv, D): heads summed
        dv[rows_k] = dv_g.sum(axis=2).transpose(0, 2, 1, 3)  # (n, S, Hkv, Dv)
    out_dtype = inputs.out_dtype
    return VarlenGrads(*(g.astype(out_dtype, copy=False) for g in (dq, dk, dv)))


def flash_varlen_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> VarlenGrads | VarlenSinkGrads:
    """Gradients of :func:`flash_varlen_attention`, tile by tile from its log-sum-exp.

    Shapes: q, k, v, cu_seqlens as in the forward; out (total_q, H, Dv) and
    lse (H, total_q) the forward's (``return_lse=True``); dout (total_q, H, Dv) =
    ∂L/∂out -> dq (total_q, H, D), dk (total_k, Hkv, D), dv (total_k, Hkv, Dv).

    Per sequence, :func:`attnlab.fast.flash.flash_attention_backward`: no score
    matrix is stored. Equivalent to :func:`varlen_attention_backward`. With ``sinks``
    (H,), the forward's: out and lse are the sink-joined ones, and the result is a
    :class:`VarlenSinkGrads` with dsinks (H,) too (each key/value head's G query heads
    then go through the flash backward apart, one sink per query head).
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    total_q, H = inputs.q.shape[:2]
    Dv = inputs.v.shape[2]
    dtype = inputs.q.dtype
    out_arr = as_forward(out, "out", (total_q, H, Dv), "(total_q, H, Dv)", dtype)
    lse_arr = as_forward(lse, "lse", (H, total_q), "(H, total_q)", LSE_DTYPE, allow_neginf=True)
    dout_arr = check_upstream(dout, (total_q, H, Dv), "(total_q, H, Dv)", dtype)
    sink_logits = check_sinks(sinks, (H,), LSE_DTYPE)  # (H, 1, 1)
    dq, dk, dv = (np.zeros_like(a) for a in (inputs.q, inputs.k, inputs.v))
    dsinks = np.zeros(H, dtype=LSE_DTYPE)  # (H,)
    Hkv = inputs.num_kv_heads
    G = H // Hkv
    for rows_q, rows_k, q_b, k_b, v_b in sequences_with_keys(inputs):  # others: no gradient
        T = rows_q.stop - rows_q.start
        out_b = grouped_view(out_arr[None, rows_q], Hkv)[0]  # (Hkv, G, T, Dv)
        dout_b = grouped_view(dout_arr[None, rows_q], Hkv)[0]  # (Hkv, G, T, Dv)
        lse_b = lse_arr[:, rows_q].reshape(Hkv, H // Hkv, T)  # (Hkv, G, T)
        if sink_logits is not None:  # one key/value head at a time: its G heads' G sinks
            for g in range(Hkv):
                heads = slice(g * G, (g + 1) * G)
                dq_g, dk_g, dv_g, ds_g = flash_attention_backward(
                    q_b[g], k_b[g], v_b[g], out_b[g], lse_b[g], dout_b[g],
                    is_causal=inputs.is_causal, scale=inputs.scale, block_q=block_q,
                    block_k=block_k, window=inputs.window_pair, softcap=inputs.softcap,
                    sinks=sink_logits[heads, 0, 0],
                )  # (G, T, D), (1, S, D), (1, S, Dv), (G,)
                dq[rows_q, heads] = dq_g.transpose(1, 0, 2)  # (T, G, D)
                dk[rows_k, g] = dk_g[0]  # (S, D)
                dv[rows_k, g] = dv_g[0]  # (S, Dv)
                dsinks[heads] += ds_g
            continue
        dq_b, dk_b, dv_b = flash_attention_backward(
            q_b, k_b, v_b, out_b, lse_b, dout_b, is_causal=inputs.is_causal,
            scale=inputs.scale, block_q=block_q, block_k=block_k, window=inputs.window_pair,
            softcap=inputs.softcap,
        )  # (Hkv, G, T, D), (Hkv, 1, S, D), (Hkv, 1, S, Dv): summed over the G query heads
        dq[rows_q] = dq_b.reshape(H, T, -1).transpose(1, 0, 2)  # (T, H, D)
        dk[rows_k] = dk_b[:, 0].transpose(1, 0, 2)  # (S, Hkv, D)
        dv[rows_k] = dv_b[:, 0].transpose(1, 0, 2)  # (S, Hkv, Dv)
    out_dtype = inputs.out_dtype
    dq, dk, dv = (g.astype(out_dtype, copy=False) for g in (dq, dk, dv))
    if sink_logits is None:
        return VarlenGrads(dq, dk, dv)
    return VarlenSinkGrads(dq, dk, dv, dsinks.astype(out_dtype, copy=False))
