"""The backward of :func:`attnlab.fast.flash.flash_attention`: gradients from the
forward's log-sum-exp, tile by tile, with no (T, S) matrix stored.

Each block of queries rebuilds its row of weight tiles P from the scores and the
forward's lse, makes dP = dout vᵀ beside them, sums δ = Σ P ⊙ dP / Σ P from those
very tiles, then turns them into dq, dk and dv: five tile matmuls and one exp per
tile, as FlashAttention-2's backward. The plain twin is
:func:`attnlab.backward.sdpa_backward`.

Dimension legend: T query length, S key length, D head dim, Dv value dim,
bq × bk a tile; ``...`` is any number of leading batch dims.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backward import check_upstream, sum_to_shape
from ..checks import check_alloc, check_positive_int
from ..gqa import gqa_reduce
from ..kernel import check_inputs, check_sinks
from .flash_parts import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    LSE_DTYPE,
    FlashStats,
    as_forward,
    exact_references,
    run_parts,
    split_batch,
    split_lse,
    tiles_of,
)
from .flash_tiles import ScoreUnits, Tiles, score_units

__all__ = ["BACKWARD_ROW_SCORES", "flash_attention_backward"]

#: The backward keeps one block of queries' row of P and dP tiles, two (bq, S)
#: arrays per batch-head, and shortens the block below ``block_q`` where they would
#: hold more than this many scores each (4 MiB in float32): at most 128 queries at
#: S = 8192. Computing each tile's P and dP once, instead of once for δ and once
#: for the gradients, saves two of seven tile matmuls and one of two exps.
BACKWARD_ROW_SCORES = 2**20


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    stats: FlashStats | None = None,
    num_threads: int | None = None,
    window: Any = None,
    causal_alignment: str = "bottom_right",
    softcap: float | None = None,
    enable_gqa: bool = False,
    alibi_slopes: Any = None,
    sinks: Any = None,
) -> tuple[np.ndarray, ...]:
    """Gradients of :func:`flash_attention`, recomputing each tile's weights from ``lse``.

    Shapes:
        q, k, v, mask, bias   as in the forward
        out   (..., T, Dv)    the forward's output
        lse   (..., T)        the forward's log-sum-exp (``return_lse=True``)
        dout  (..., T, Dv)    ∂L/∂out
        ->    dq (..., T, D), dk (..., S, D), dv (..., S, Dv), each summed to
              its input's shape over broadcast dims (autograd's rule)

    No (T, S) matrix is stored: as in FlashAttention-2, each tile's weights are
    rebuilt from the scores and ``lse``. Equivalent to the plain backward
    :func:`attnlab.backward.sdpa_backward` (``dbias`` is not computed: bias is
    treated as a constant)::

        P     = exp(q kᵀ · scale + bias - lse), 0 where not allowed     (..., T, S)
        dP    = dout vᵀ                                                 (..., T, S)
        δ     = Σ_S P ⊙ dP                                              (..., T)
        dv    = Pᵀ dout                                                 (..., S, Dv)
        dz    = P ⊙ (dP − δ)                                            (..., T, S)
        dz    = dz ⊙ (1 − tanh²(s / softcap))     with a soft cap (s: the scaled scores)
        dq    = dz k · scale,   dk = dzᵀ q · scale
        dk, dv summed over each key/value head's H / Hkv query heads with ``enable_gqa``

    (δ = Σ_S P ⊙ dP, the softmax-backward row sum, is computed from the
    recomputed weights, as the plain backward does, not from ``out``, and divided
    by Σ_S P: see the comment in the code.) Each block of queries makes its row of
    P and dP tiles once, keeps them while δ is summed, then turns them into the
    gradients: five tile matmuls and one exp per tile, as FlashAttention-2's
    backward, at the cost of two (block_q, S) arrays per batch-head (the block of
    queries is shortened to keep each under ``BACKWARD_ROW_SCORES`` scores).
    ``out`` is checked for its shape only. Rows with nothing to attend to
    (lse = -inf) pass no gradient. With ``sinks`` (H,), ``out`` and ``lse`` are the
    forward's with the sinks (the weights rebuilt from that lse are the sink-joined
    ones, whose row sum is 1 − P_sink), δ is scaled by that row sum, and dsinks (H,)
    comes fourth::

        dsink_h = −Σ_(batch, T) P_sink · δ,     P_sink = exp(sink_h − lse)

    A row whose every score sits under a huge finite fill (-1e9, ``finfo.min``)
    has an lse whose fractional part even float64 cannot hold; its exact
    reference is recomputed from the scores.

    ``num_threads`` as in the forward: None computes in the calling thread with
    BLAS's own threads; an integer n runs the parts (a few batch-heads each, all
    their blocks of queries, so that no two threads add to the same rows of dk
    and dv) on n threads with BLAS held to one thread each. The numbers do not
    depend on n.
    """
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale, tiled=True,
                          window=window, causal_alignment=causal_alignment, softcap=softcap,
                          enable_gqa=enable_gqa, alibi_slopes=alibi_slopes)
    q_arr, k_arr, v_arr = inputs.q, inputs.k, inputs.v
    scale_value, out_dtype = inputs.scale, inputs.out_dtype
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    if num_threads is not None:
        num_threads = check_positive_int(num_threads, "num_threads")
    dtype = q_arr.dtype
    T, D, S, Dv = *q_arr.shape[-2:], k_arr.shape[-2], v_arr.shape[-1]
    batch = np.broadcast_shapes(q_arr.shape[:-2], k_arr.shape[:-2], v_arr.shape[:-2])
    for name, shape in (("dq", (*batch, T, D)), ("dk", (*batch, S, D)), ("dv", (*batch, S, Dv))):
        check_alloc(shape, dtype, f"the gradient {name}", "q, k, v")
    as_forward(out, "out", (*batch, T, Dv), "(..., T, Dv)", dtype)
    sink_logits = check_sinks(sinks, tuple(batch), LSE_DTYPE)
    lse_arr = as_forward(lse, "lse", (*batch, T), "(..., T)", LSE_DTYPE, allow_neginf=True)
    dout_arr = check_upstream(dout, (*batch, T, Dv), "(..., T, Dv)", dtype)

    # The weights are rebuilt in the forward's units (the same choice from the same
    # inputs), from scores rounded exactly as the forward's were: a query that sees
    # one key then gets P = 1 up to the rounding of exp and log alone.
    units = score_units(q_arr, k_arr, scale_value, inputs.bias)
    tiles = tiles_of(inputs, units.per_nat)
    scale_typed = dtype.type(scale_value)  # for dq and dk
    scores_scale = dtype.type(scale_value * units.per_nat)  # folded into q, as in the forward
    q_full = np.broadcast_to(q_arr, (*batch, T, D))  # (..., T, D) a view
    k_full = np.broadcast_to(k_arr, (*batch, S, D))  # (..., S, D) a view
    k_t = np.swapaxes(k_full, -1, -2)  # (..., D, S)
    v_t = np.broadcast_to(np.swapaxes(v_arr, -1, -2), (*batch, Dv, S))  # (..., Dv, S)
    lse_high, lse_low = split_lse(lse_arr * units.per_nat, dtype)  # (..., T, 1) each, in units
    exact_references(lse_high, lse_low, q_full, k_t, scores_scale, tiles, block_q, block_k,
                      units)
    # P = exp(s - high - low) = exp(s - high) · row_scale: the low part, a per-row factor,
    # is carried by the (bq, D) and (bq, Dv) operands rather than by a pass over each tile.
    row_scale = units.exp(-lse_low)  # (..., T, 1)
    # Without a soft cap, a bias or ALiBi slopes (which act on the scores before the lse
    # comes off), the lse's high part is subtracted inside the score matmul: kᵀ gets a
    # row of ones and each block of queries a column -high, so that s - high is the last
    # term of each dot product instead of a pass over every tile.
    folded = tiles.softcap is None and tiles.bias is None and tiles.alibi_slopes is None
    k_scores = k_t  # (..., D, S), or (..., D + 1, S) folded
    if folded:
        k_ones = np.empty((*k_arr.shape[:-2], D + 1, S), dtype=dtype)  # (..., D + 1, S)
        k_ones[..., :D, :] = np.swapaxes(k_arr, -1, -2)
        k_ones[..., D, :] = 1.0
        k_scores = np.broadcast_to(k_ones, (*batch, D + 1, S))
    sink_weight = None
    delta_scale = None  # (..., T, 1): δ's factor, the keys' share of each row's weight
    if sink_logits is not None:  # the keys' weights sum to 1 - P_sink, not 1
        sink_weight = np.exp(sink_logits[..., 0] - lse_arr)  # (..., H, T) P_sink
        delta_scale = (1.0 - sink_weight)[..., None].astype(dtype)  # (..., T, 1)
    delta = np.zeros((*batch, T, 1), dtype=dtype)  # (..., T, 1) δ, filled block by block

    dq = np.zeros((*batch, T, D), dtype=dtype)  # (..., T, D), in units of dz k
    dk = np.zeros((*batch, S, D), dtype=dtype)  # (..., S, D), in units of dzᵀ q
    dv = np.zeros((*batch, S, Dv), dtype=dtype)  # (..., S, Dv)

    split = split_batch(batch, min(block_q, T) * min(block_k, S))
    part_heads = math.prod(batch[split:])
    # One block of queries keeps its row of P and dP tiles: (bq, width) per batch-head, each.
    rows_q, width = _backward_rows_q(tiles, T, S, block_q, block_k, part_heads)

    def backward_part(index: tuple[int, ...]) -> None:
        """The gradients of the batch-heads ``index``: all their query blocks in turn."""
        part_tiles = tiles.part(index, len(batch))
        # Buffers for the row's P and dP tiles, reused by every block of queries: fresh
        # pages per tile cost time (as in the forward's online_softmax).
        buffers = (np.empty(part_heads * rows_q * width, dtype=dtype),
                   np.empty(part_heads * rows_q * width, dtype=dtype))
        args = (q_full[index], k_full[index], k_scores[index], v_t[index], dout_arr[index],
                lse_high[index], row_scale[index],
                None if delta_scale is None else delta_scale[index], part_tiles, units,
                scores_scale, folded)
        for q0 in range(0, T, rows_q):
            _backward_rows(*args, q0, min(q0 + rows_q, T), block_k, buffers,
                           delta[index], dq[index], dk[index], dv[index])

    parts = list(np.ndindex(*batch[:split]))
    run_parts(backward_part, parts, num_threads)
    if stats is not None:  # tiles over all batch-heads at once, as computed
        for q0 in range(0, T, rows_q):
            for k0 in range(0, S, block_k):
                tiles.blocked(q0, min(q0 + rows_q, T), k0, min(k0 + block_k, S), stats)
    dq *= scale_typed
    dk *= scale_typed
    groups = inputs.gqa_groups
    grads = (
        sum_to_shape(dq, q_arr.shape).astype(out_dtype, copy=False),
        gqa_reduce(sum_to_shape(dk, k_arr.shape), groups).astype(out_dtype, copy=False),
        gqa_reduce(sum_to_shape(dv, v_arr.shape), groups).astype(out_dtype, copy=False),
    )
    if sink_weight is None:
        return grads
    per_row = -(sink_weight * delta[..., 0])  # (..., H, T) the sink column's dz
    H = sink_weight.shape[-2]
    dsinks = per_row.reshape(-1, H, T).sum(axis=(0, 2))  # (H,)
    return (*grads, dsinks.astype(out_dtype, copy=False))


def _backward_rows(
    q: np.ndarray, k: np.ndarray, k_scores: np.ndarray, v_t: np.ndarray, dout: np.ndarray,
    lse_high: np.ndarray, row_scale: np.ndarray, delta_scale: np.ndarray | None, tiles: Tiles,
    units: ScoreUnits, scores_scale: np.floating, folded: bool, q0: int, q1: int, block_k: int,
    buffers: tuple[np.ndarray, np.ndarray], delta: np.ndarray, dq: np.ndarray,
    dk: np.ndarray, dv: np.ndarray,
) -> None:
    """One block of queries' share of the backward: writes dq's rows, adds to dk and dv.

    Shapes: q (..., T, D), k (..., S, D), k_scores (..., D, S) = kᵀ, or (..., D + 1, S)
    with a last row of ones when ``folded`` (lse_high then comes off inside the score
    matmul), v_t (..., Dv, S), dout (..., T, Dv); lse_high, row_scale, delta_scale
    (..., T, 1) (delta_scale: the keys' share of each row's weight with sinks, else
    None); ``buffers``: two flat arrays of (...)·bq·S elements or more, for the
    row's P and dP tiles; delta (..., T, 1), whose rows are written; dq (..., T, D), dk (..., S, D),
    dv (..., S, Dv), updated in place.

    A first sweep over the key tiles makes each tile's P' = exp(s - lse_high) and
    dP = dout vᵀ once, keeps them, and sums Σ P' ⊙ dP and Σ P' per row; a second
    sweep turns them into dz and the three gradients. The true weights are
    P = P' · row_scale (the lse's low part): row_scale is applied to the (bq, Dv)
    and (bq, D) operands (dout for dv, q for dk, the (bq, D) rows of dq), never to
    a tile, and cancels out of δ.
    """
    dtype = q.dtype
    dout_blk = dout[..., q0:q1, :]  # (..., bq, Dv)
    scale_rows = row_scale[..., q0:q1, :]  # (..., bq, 1)
    high = lse_high[..., q0:q1, :]  # (..., bq, 1)
    D = q.shape[-1]
    q_scores = np.empty((*q.shape[:-2], q1 - q0, k_scores.shape[-2]), dtype=dtype)
    np.multiply(q[..., q0:q1, :], scores_scale, out=q_scores[..., :D])  # (..., bq, D) in units
    empty = None  # (..., bq, 1) rows with nothing to attend to (high = +inf), folded only
    if folded:
        # (..., bq, 1): [q, -high] · [k, 1] = s - high. Not np.negative(high, out=...): NumPy
        # 2.4's unary ufuncs read a (2, 1, 1) view of a (2, 4, 1) array wrongly into an out=.
        q_scores[..., D:] = -high
        if np.isinf(high).any():  # -inf inside a matmul sets its invalid flag (inf · 0 in
            empty = np.isinf(high)  # padding): such rows get 0 there and -inf after it
            q_scores[..., D:][empty] = 0.0
    ones = np.ones((block_k, 1), dtype=dtype)  # (bk, 1): P' @ ones = Σ P' per row
    kept: list[tuple[slice, int, int, np.ndarray, np.ndarray, np.ndarray | None]] = []
    used = 0  # of the buffers, in elements
    weighted = np.zeros((*dout_blk.shape[:-1], 2), dtype=dtype)  # (..., bq, 2) [Σ P' dP, Σ P']
    # On the edge of the causal band or window, pieces of rows over the keys they reach,
    # as in the forward (Tiles.walk).
    starts = range(0, k_scores.shape[-1], block_k)
    for r0, r1, c0, c1, blocked in tiles.walk(q0, q1, starts, block_k, None):
        rows = slice(r0 - q0, r1 - q0)
        tile_shape = (*dout_blk.shape[:-2], r1 - r0, c1 - c0)  # (..., bq, bk)
        start, used = used, used + math.prod(tile_shape)
        weights = np.matmul(q_scores[..., rows, :], k_scores[..., c0:c1],
                            out=buffers[0][start:used].reshape(tile_shape))  # scores
        cap_slope = tiles.cap(weights, slope=True)  # (..., bq, bk) 1 - tanh², or None
        tiles.add_bias(weights, r0, r1, c0, c1)
        if blocked is not None:
            np.copyto(weights, -np.inf, where=blocked)
        if empty is not None:
            np.copyto(weights, -np.inf, where=empty[..., rows, :])
        if not folded:
            with np.errstate(over="ignore"):  # -3e38 - 3e38 = -inf: weight 0, as it should
                weights -= high[..., rows, :]
        units.exp(weights, out=weights)  # (..., bq, bk) P', recomputed
        dscores = np.matmul(dout_blk[..., rows, :], v_t[..., c0:c1],
                            out=buffers[1][start:used].reshape(tile_shape))  # dP
        weighted[..., rows, 0] += row_dots(weights, dscores)  # (..., bq) Σ P' ⊙ dP
        weighted[..., rows, 1:] += np.matmul(weights, ones[: c1 - c0])  # (..., bq, 1) Σ P'
        kept.append((rows, c0, c1, weights, dscores, cap_slope))
    # δ = Σ_S P ⊙ dP / Σ_S P, from the very P and dP tiles used below. FlashAttention-2
    # takes δ = rowsum(dout ⊙ out) instead, equal in exact arithmetic, but it carries
    # the forward's rounding of ``out``, independent of the dP it is subtracted from:
    # float32 dq came out ~2-3x less accurate than the plain backward's on some BLAS
    # kernels. Dividing by Σ P (1 up to the rounding of lse) makes δ the mean of dP
    # under these weights, so that dP - δ cancels as in the plain path: a query that
    # sees one key gets dq = 0 exactly.
    total = weighted[..., 1:]  # (..., bq, 1)
    row_delta = np.divide(weighted[..., :1], np.where(total == 0.0, 1.0, total),
                          out=delta[..., q0:q1, :])  # (..., bq, 1)
    if delta_scale is not None:
        row_delta *= delta_scale[..., q0:q1, :]  # Σ P ⊙ dP over keys worth 1 - P_sink
    dout_scaled = dout_blk * scale_rows  # (..., bq, Dv): P'ᵀ (row_scale · dout) = Pᵀ dout
    q_scaled = q[..., q0:q1, :] * scale_rows  # (..., bq, D): dz'ᵀ (row_scale · q) = dzᵀ q
    dq_rows = np.zeros((*dout_blk.shape[:-1], q.shape[-1]), dtype=dtype)  # (..., bq, D)
    for rows, c0, c1, weights, dscores, cap_slope in kept:
        dv[..., c0:c1, :] += np.matmul(np.swapaxes(weights, -1, -2),
                                       dout_scaled[..., rows, :])  # (..., bk, Dv)
        dscores -= row_delta[..., rows, :]
        dscores *= weights  # (..., bq, bk) dz' = dz / row_scale
        if cap_slope is not None:
            dscores *= cap_slope  # (..., bq, bk) through c·tanh(s / c)
        dq_rows[..., rows, :] += np.matmul(dscores, k[..., c0:c1, :])  # (..., bq, D)
        dk[..., c0:c1, :] += np.matmul(np.swapaxes(dscores, -1, -2),
                                       q_scaled[..., rows, :])  # (..., bk, D)
    np.multiply(dq_rows, scale_rows, out=dq[..., q0:q1, :])


def row_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_j a_ij · b_ij per row: (..., n, m), (..., n, m) -> (..., n). NumPy >= 2's vecdot
    runs ~1.7x faster than the einsum it replaces (one (512, 512) float32 tile: 33 vs 57 µs)."""
    if hasattr(np, "vecdot"):
        return np.vecdot(a, b)
    return np.einsum("...ij,...ij->...i", a, b)


def _backward_rows_q(
    tiles: Tiles, T: int, S: int, block_q: int, block_k: int, part_heads: int,
) -> tuple[int, int]:
    """The backward's block of queries and the most keys one such block's kept tiles
    span: (rows, width), with part_heads · rows · width <= BACKWARD_ROW_SCORES unless
    even one query needs more. Only the causal band or window narrows the width
    (a mask's skipped tiles are not counted on)."""

    def width(rows: int) -> int:
        if tiles.band is None:
            return S
        widest = 0
        for q0 in range(0, T, rows):
            q1 = min(q0 + rows, T)
            p0, p1 = tiles.offset + q0, tiles.offset + q1 - 1
            widest = max(widest, sum(
                min(k0 + block_k, S) - k0 for k0 in range(0, S, block_k)
                if tiles.band.reaches(p0, p1, k0, min(k0 + block_k, S) - 1) != "none"))
        return widest

    rows = max(1, min(block_q, T))
    keys = width(rows)
    while rows > 1 and part_heads * rows * keys > BACKWARD_ROW_SCORES:
        rows = max(1, min(rows // 2, BACKWARD_ROW_SCORES // max(1, part_heads * keys)))
        keys = width(rows)
    return rows, keys
