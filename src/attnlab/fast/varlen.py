"""Variable-length batches without padding: FlashAttention's "varlen" layout, plain and tiled.

A batch of B sequences of different lengths is packed along one token axis,
with no padding, and ``cu_seqlens`` (cumulative sequence lengths) say where
each sequence starts::

    q (total_q, H, D)    k (total_k, Hkv, D)    v (total_k, Hkv, Dv)
    cu_seqlens_q (B + 1,) int: sequence b's queries are rows cu_seqlens_q[b] : cu_seqlens_q[b + 1]
    cu_seqlens_k (B + 1,) int: its keys and values are rows cu_seqlens_k[b] : cu_seqlens_k[b + 1]
    max_seqlen_q, max_seqlen_k: at least the longest query / key sequence
    -> out (total_q, H, Dv)

(the layout of FlashAttention's ``flash_attn_varlen_func``: cu_seqlens start at
0, never decrease, and end at total_q / total_k.) Attention never crosses a
sequence boundary: the result is the plain attention of each sequence alone,
the computation below (which the tests run as the reference)::

    for b in range(B):
        rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])     # T_b queries
        rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])     # S_b keys
        out[rows_q] = scaled_dot_product_attention(              # (H, T_b, Dv) -> (T_b, H, Dv)
            q[rows_q].transpose(1, 0, 2),
            repeat(k[rows_k], H // Hkv, axis=1).transpose(1, 0, 2),
            repeat(v[rows_k], H // Hkv, axis=1).transpose(1, 0, 2),
            is_causal=is_causal).transpose(1, 0, 2)

``is_causal`` applies per sequence, bottom-right aligned as everywhere in
attnlab: query i of sequence b sits at position S_b - T_b + i and sees that
sequence's keys 0 .. S_b - T_b + i. So do ``window`` (an int W, or
FlashAttention's ``window_size=(left, right)``, -1 = unbounded) and
``softcap`` (c·tanh(scores / c)), as in ``flash_attn_varlen_func``. Query
head h reads key/value head h // (H / Hkv) (GQA, as FlashAttention's varlen
accepts). A sequence with no
keys, or a causal query that sees none, gets output 0 (lse -inf; the sink's logit
with ``sinks`` (H,), one logit per query head that joins each row's softmax and
takes no value, as in :func:`attnlab.scaled_dot_product_attention`).

- :func:`varlen_attention` is the plain path: per sequence it builds the
  (H, T_b, S_b) score matrix, never a (total_q, total_k) one; sequences of the
  same lengths go through one batched product.
- :func:`flash_varlen_attention` computes each sequence tile by tile with
  :func:`attnlab.fast.flash.flash_attention`: memory O(total·Dv + tiles), no
  score matrix at all; :func:`flash_varlen_attention_backward` gives the gradients.
- :func:`varlen_attention_backward` is the plain backward, the twin of the flash one.

The forward passes are here; the backward passes are
:mod:`attnlab.fast.varlen_backward`, and the packed layout (cu_seqlens, the
checks, grouping sequences of equal lengths) is :mod:`attnlab.fast.varlen_layout`.
Every public name of the three is importable from here.

Dimension legend: B sequences, H query heads, Hkv key/value heads, T_b / S_b
sequence b's query / key length, D head dim, Dv value dim.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from ..checks import check_flag, check_positive_int
from ..kernel import attend, check_sinks
from .flash import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention, join_sinks
from .flash_parts import LSE_DTYPE
from .varlen_backward import (
    VarlenGrads,
    VarlenSinkGrads,
    flash_varlen_attention_backward,
    varlen_attention_backward,
)
from .varlen_layout import (
    VarlenInputs,
    check_cu_seqlens,
    check_group_scores,
    check_max_seqlen,
    check_sequences,
    check_varlen_inputs,
    check_varlen_shapes,
    cu_seqlens_from_lengths,
    group_views,
    length_groups,
    packed_groups,
    sequence_allowed,
    sequences_with_keys,
)

__all__ = [
    "VarlenGrads",
    "VarlenInputs",
    "VarlenSinkGrads",
    "attend_packed",
    "check_cu_seqlens",
    "check_max_seqlen",
    "check_sequences",
    "check_varlen_shapes",
    "check_varlen_inputs",
    "cu_seqlens_from_lengths",
    "flash_varlen_attention",
    "flash_varlen_attention_backward",
    "length_groups",
    "sequence_allowed",
    "varlen_attention",
    "varlen_attention_backward",
]


def attend_packed(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray, scale: float, is_causal: bool, out: np.ndarray | None = None,
    *, window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Plain attention of every packed sequence alone, on validated arrays; no checks.

    Shapes: q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), cu_seqlens
    (B + 1,) int64, sinks (H, 1, 1) from :func:`attnlab.kernel.check_sinks` or None
    -> out (total_q, H, Dv) (written into ``out`` if given). The
    sequences of one (T_b, S_b) are gathered into one batched
    :func:`attnlab.kernel.attend`: scores (n, Hkv, H / Hkv, T_b, S_b) per group.
    """
    total_q, H, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    if out is None:
        out = np.empty((total_q, H, Dv), dtype=q.dtype)  # (total_q, H, Dv)
    group_sinks = None if sinks is None else sinks.reshape(Hkv, H // Hkv, 1, 1)  # head g·G + j
    for T, S, rows_q, rows_k in packed_groups(cu_seqlens_q, cu_seqlens_k):
        if S == 0:  # nothing to attend to (a sink takes no value): output 0, as the plain path
            out[rows_q] = 0.0
            continue
        # q_g (n, Hkv, G, T, D); k_g, v_g (n, Hkv, 1, S, ·): key/value heads not copied
        q_g, k_g, v_g = group_views(q, k, v, rows_q, rows_k)
        allowed = sequence_allowed(T, S, is_causal, window)  # (T, S)
        result, _ = attend(q_g, k_g, v_g, allowed, None, scale, softcap=softcap,
                           sinks=group_sinks)  # (n, Hkv, G, T, Dv)
        out[rows_q] = result.transpose(0, 3, 1, 2, 4).reshape(len(rows_q), T, H, Dv)
    return out


def varlen_attention(
    q: Any,
    k: Any,
    v: Any,
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
) -> np.ndarray:
    """Attention over a packed batch of sequences of different lengths, without padding.

    Shapes:
        q  (total_q, H, D)     k (total_k, Hkv, D)     v (total_k, Hkv, Dv)
        cu_seqlens_q, cu_seqlens_k (B + 1,) int: start at 0, never decrease,
            end at total_q / total_k
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence
        -> out (total_q, H, Dv)

    Equals :func:`attnlab.scaled_dot_product_attention` run on each sequence
    alone (see the module docstring); ``is_causal``, ``window`` (an int W or
    FlashAttention's (left, right), -1 = unbounded), ``softcap`` and ``sinks`` (H,),
    one logit per query head, apply per sequence, bottom-right aligned. The plain
    path: each sequence's (H, T_b, S_b) scores are built whole (sequences of equal
    lengths in one batched product), never a (total_q, total_k) matrix. Dtypes as in
    scaled_dot_product_attention (float16 computes in float32 and comes back as float16).

    >>> rng = np.random.default_rng(0)
    >>> cu = cu_seqlens_from_lengths([3, 5])  # two sequences, 8 tokens
    >>> q, k, v = rng.standard_normal((3, 8, 2, 4))  # (total, H, D) each
    >>> out = varlen_attention(q, k, v, cu, cu, 5, 5, is_causal=True)
    >>> from attnlab import scaled_dot_product_attention as sdpa
    >>> alone = sdpa(*(x[3:].transpose(1, 0, 2) for x in (q, k, v)), is_causal=True)
    >>> out.shape, bool(np.allclose(out[3:], alone.transpose(1, 0, 2)))
    ((8, 2, 4), True)
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    sink_logits = check_sinks(sinks, (inputs.num_heads,), inputs.q.dtype)  # (H, 1, 1)
    check_group_scores(inputs)
    out = attend_packed(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                        inputs.scale, inputs.is_causal, window=inputs.window,
                        softcap=inputs.softcap, sinks=sink_logits)  # (total_q, H, Dv)
    return out.astype(inputs.out_dtype, copy=False)


@overload
def flash_varlen_attention(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
    max_seqlen_k: int, *, is_causal: bool = ..., scale: float | None = ..., block_q: int = ...,
    block_k: int = ..., return_lse: Literal[False] = ..., window: Any = ...,
    softcap: float | None = ..., sinks: Any = ...,
) -> np.ndarray: ...
@overload
def flash_varlen_attention(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
    max_seqlen_k: int, *, is_causal: bool = ..., scale: float | None = ..., block_q: int = ...,
    block_k: int = ..., return_lse: Literal[True], window: Any = ...,
    softcap: float | None = ..., sinks: Any = ...,
) -> tuple[np.ndarray, np.ndarray]: ...
def flash_varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    return_lse: bool = False,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """:func:`varlen_attention` computed tile by tile: no score matrix, O(total) memory.

    Shapes: as :func:`varlen_attention` -> out (total_q, H, Dv), and lse (H, total_q)
    float64 if ``return_lse`` (FlashAttention's varlen layout: heads first).

    Each sequence goes through :func:`attnlab.fast.flash.flash_attention` on views
    of the packed arrays (its heads as the batch dims, the key/value heads
    broadcast over their query heads, never copied): the most held at once is
    the output, one sequence's copy of v and a few block_q × block_k tiles.
    Efficient implementation equivalent to :func:`varlen_attention` (the same
    ``is_causal``, ``window`` and ``softcap``; flash skips the tiles outside a
    sequence's band), with the log-sum-exp of each query's scores (-inf for a
    query with nothing to attend to), which :func:`flash_varlen_attention_backward`
    needs. With ``sinks`` (H,) each sequence's output and lse are joined with the
    sinks as :func:`attnlab.fast.flash.flash_attention` joins them (lse = the sink's
    logit for a query with no key); pass the same sinks to the backward.
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    return_lse = check_flag(return_lse, "return_lse")
    total_q, H = inputs.q.shape[:2]
    Dv = inputs.v.shape[2]
    sink_logits = check_sinks(sinks, (H,), LSE_DTYPE)  # (H, 1, 1)
    out = np.zeros((total_q, H, Dv), dtype=inputs.q.dtype)  # (total_q, H, Dv)
    lse = np.full((H, total_q), -np.inf, dtype=LSE_DTYPE)  # (H, total_q)
    if sink_logits is not None:  # a query with no key: all its weight on the sink
        lse[:] = sink_logits[:, :, 0]
    group_sinks = None if sink_logits is None else sink_logits.reshape(
        inputs.num_kv_heads, H // inputs.num_kv_heads, 1, 1)  # (Hkv, G, 1, 1), head g·G + j
    for rows_q, _, q_b, k_b, v_b in sequences_with_keys(inputs):  # others: out 0, lse -inf
        T = rows_q.stop - rows_q.start
        out_b, lse_b = flash_attention(q_b, k_b, v_b, is_causal=inputs.is_causal,
                                       scale=inputs.scale, block_q=block_q, block_k=block_k,
                                       return_lse=True, window=inputs.window_pair,
                                       softcap=inputs.softcap)  # (Hkv, G, T, Dv), (Hkv, G, T)
        if group_sinks is not None:
            out_b, lse_b = join_sinks(out_b, lse_b, group_sinks)
        out[rows_q] = out_b.reshape(H, T, Dv).transpose(1, 0, 2)  # (T, H, Dv)
        lse[:, rows_q] = lse_b.reshape(H, T)
    out = out.astype(inputs.out_dtype, copy=False)
    return (out, lse) if return_lse else out
