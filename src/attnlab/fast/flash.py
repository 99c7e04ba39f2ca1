"""Memory-efficient ("flash") attention in NumPy: tiled, with an online softmax.

The plain path (:func:`attnlab.scaled_dot_product_attention`) builds the whole
(..., T, S) score matrix: 16 GiB for one head at T = S = 65,536 in float32.
This module computes the same result one (block_q × block_k) tile at a time,
keeping per query only a running maximum ``m``, a running sum ``l`` and an
unnormalised output ``acc`` (Milakov & Gimelshein 2018; Dao et al.,
FlashAttention, 2022, and FlashAttention-2, 2023)::

    for each key block j:                         s = q kⱼᵀ · scale + bias   (bq, bk)
        m_new = max(m, rowmax(s))
        p     = exp(s - m_new)                    masked entries -> 0
        l     = l · exp(m - m_new) + rowsum(p)
        acc   = acc · exp(m - m_new) + p vⱼ
    out = acc / l,   lse = m + log l

(Here the exponent's reference ``m`` moves only when a row's tile max leaves
±20 around it, rather than on every tile: see ``_WINDOW``. It is kept in the
scores' own units, so that scores far from it, such as -1e9 padding followed
by real keys, are never rounded against it. Without a bias the scores are
made in base 2, p = 2^(s·log2 e - m), which NumPy computes faster and more
exactly than e^s: see ``_ScoreUnits``.) Extra memory is the (..., T, Dv)
output, one copy of v and a few tiles, O(T·Dv + S·Dv + block_q·block_k) per
batch-head, instead of O(T·S). Tiles that the causal mask (or a ``mask``
whose slice is all False) removes entirely are skipped.

The work is cut into parts, one block of queries of a few batch-heads each,
that share nothing but their inputs: ``num_threads`` runs them on a pool of
threads (NumPy lets go of the GIL inside matmul and ufuncs), each with BLAS
held to one thread.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims, which broadcast.

Mask convention (the only one in attnlab): ``mask`` is boolean and
**True = may attend**; additive values go through ``bias``. ``is_causal`` is
bottom-right aligned: query i sits at absolute position S - T + i. A query
with nothing to attend to gets output 0 (never NaN) and log-sum-exp -inf.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import numpy as np

from ..backward import check_upstream, sum_to_shape
from ..errors import (
    AttnlabError,
    ShapeError,
    as_float_array,
    check_alloc,
    check_ndim,
    check_positive_int,
    shape_str,
)
from ..kernel import abs_max, check_inputs

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "FlashStats",
    "flash_attention",
    "flash_attention_backward",
    "merge_partials",
]

#: Default tile sizes, measured on CPU (benchmarks/bench_flash.py --blocks, 8 heads,
#: T = S = 4096, D = 64, 1 and 2 threads). Large enough that each tile's matmul
#: runs near BLAS speed and the Python loop costs little, small enough that one
#: head's tile of scores (1 MiB in float32) stays in a core's own cache while
#: it is made, exponentiated and multiplied by v.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512

#: A part of the work holds at most this many scores per tile (its batch-heads ×
#: block_q × block_k), unless one batch-head's tile is larger already: the
#: leading batch dims are split until a tile fits in a core's cache (1 MiB in
#: float32). Tiles of 8 heads at once (4 MiB) ran ~10% slower.
_PART_SCORES = 2**18

#: exp is taken of (score - ref), with ref a per-row reference moved only when the
#: running max leaves ±_WINDOW. Usual scores never move it, which saves a pass
#: over every tile (subtracting the max); e^20 of headroom cannot overflow a sum
#: of S terms in float32 (3.4e38) for any realistic S and |v|, and the row's
#: largest term e^(m - ref) ≥ e^-20 stays a normal float.
_WINDOW = 20.0

_LSE_DTYPE = np.dtype(np.float64)  # see flash_attention's docstring


@dataclass
class FlashStats:
    """Counts of (query block, key block) tiles, filled in when passed as ``stats=``.

    A tile covers every batch-head at once; ``skipped`` tiles were removed
    entirely, for every batch-head, by the causal mask or by an all-False
    ``mask`` slice and cost nothing. (The forward, which computes a few
    batch-heads at a time, also skips a tile for those batch-heads alone.) The
    counts add up over calls, so one object can follow a forward and a backward
    together.
    """

    computed: int = 0
    skipped: int = 0


@overload
def flash_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., block_q: int = ..., block_k: int = ...,
    return_lse: Literal[False] = ..., stats: FlashStats | None = ...,
    num_threads: int | None = ...,
) -> np.ndarray: ...
@overload
def flash_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., block_q: int = ..., block_k: int = ...,
    return_lse: Literal[True], stats: FlashStats | None = ...,
    num_threads: int | None = ...,
) -> tuple[np.ndarray, np.ndarray]: ...
def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    return_lse: bool = False,
    stats: FlashStats | None = None,
    num_threads: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention computed tile by tile, never holding the (T, S) matrix.

    Shapes:
        q    (..., T, D)      queries
        k    (..., S, D)      keys
        v    (..., S, Dv)     values
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); added to the scaled scores (-inf allowed)
        ->   out (..., T, Dv), and lse (..., T) if ``return_lse``

    Accepts exactly the inputs of :func:`attnlab.scaled_dot_product_attention`
    (same broadcasting, bottom-right ``is_causal``, dtype rules, errors) and
    returns the same numbers up to rounding. Efficient implementation equivalent
    to the following::

        scaled  = q @ kᵀ * scale + bias, -inf where not allowed    (..., T, S)
        out     = scaled_dot_product_attention(q, k, v, mask, bias=bias,
                                               is_causal=is_causal, scale=scale)
        lse     = log(Σ_S exp(scaled))                              (..., T)

    ``lse`` (log-sum-exp of each query's scaled scores; -inf for a query with
    nothing to attend to) is what is needed to combine attention over disjoint
    key sets, e.g. key shards in ring attention: see :func:`merge_partials`.
    It is also what :func:`flash_attention_backward` recomputes the weights
    from. It is always float64: with seed 000's ``-1e9`` fill, a fully "masked"
    row has lse = -1e9 + log S, whose fractional part float32 cannot hold (its
    spacing at 1e9 is 64), and the weights rebuilt from it would be S× too large.

    ``block_q`` × ``block_k`` is the tile: the most scores held at once per
    batch-head. Leading (batch, head) dims go through each tile's matmul
    together, split into parts of a few batch-heads when a tile of all of them
    would not fit in a core's cache. ``stats``, if given, counts computed and
    skipped tiles.

    ``num_threads``: None (the default) computes in the calling thread, with
    NumPy's BLAS using the threads it is set to (all cores unless limited, e.g.
    by ``OPENBLAS_NUM_THREADS`` or threadpoolctl). An integer n runs the parts
    (one block of queries of a few batch-heads each) on n threads, each with
    BLAS held to one thread, through threadpoolctl if it is installed (the
    ``bench`` extra); BLAS's setting is restored when the call returns, also
    after an error, and it is process-wide meanwhile. Without threadpoolctl
    the parts run one after another in the calling thread and BLAS's own
    threads do the parallel work. The numbers do not depend on n: the same
    parts are computed in the same way, whichever thread runs them.

    Memory beyond the output: a copy of v (with a column of ones, which gives
    the softmax sums in the same matmul) and a few tiles per thread,
    O(S·Dv + threads·block_q·block_k) per batch-head.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 3, 100, 8))  # (B, H, T, D)
    >>> k, v = rng.standard_normal((2, 3, 70, 8)), rng.standard_normal((2, 3, 70, 5))
    >>> from attnlab import scaled_dot_product_attention
    >>> out = flash_attention(q, k, v, is_causal=True, block_q=32, block_k=16)
    >>> out.shape, bool(np.allclose(out, scaled_dot_product_attention(q, k, v, is_causal=True)))
    ((2, 3, 100, 5), True)
    """
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, allowed, bias_arr = (
        inputs.q, inputs.k, inputs.v, inputs.allowed, inputs.bias
    )
    scale_value, out_dtype = inputs.scale, inputs.out_dtype
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    if num_threads is not None:
        num_threads = check_positive_int(num_threads, "num_threads")
    dtype = q_arr.dtype
    T, D, S, Dv = *q_arr.shape[-2:], k_arr.shape[-2], v_arr.shape[-1]
    batch = inputs.batch
    tiles = _Tiles(T, S, allowed, bias_arr, inputs.is_causal)
    # Broadcast batch dims can make the output far larger than any input.
    check_alloc((*batch, T, Dv + 1), dtype, "the running sums (..., T, Dv + 1)", "q, k, v")

    units = _score_units(q_arr, k_arr, scale_value, bias_arr)
    scale_typed = dtype.type(scale_value * units.per_nat)  # folded into q: scores in units
    q_full = np.broadcast_to(q_arr, (*batch, T, D))  # (..., T, D) views: parts index them
    k_t = np.broadcast_to(np.swapaxes(k_arr, -1, -2), (*batch, D, S))  # (..., D, S)
    v_arr, v_unit = _unit_columns(v_arr, S)  # out is computed in units of v_unit (Dv,)
    # v with a column of ones: p @ [v, 1] gives p v and the row sums of p in one matmul.
    v_ones = np.concatenate(
        [v_arr, np.ones((*v_arr.shape[:-1], 1), dtype=dtype)], axis=-1
    )  # (..., S, Dv + 1)
    v_ones = np.broadcast_to(v_ones, (*batch, S, Dv + 1))  # (..., S, Dv + 1) a view
    out = np.empty((*batch, T, Dv), dtype=dtype)  # (..., T, Dv)
    lse = np.empty((*batch, T), dtype=_LSE_DTYPE)  # (..., T)

    def forward_part(part: tuple[tuple[int, ...], int]) -> None:
        """One block of queries of the batch-heads ``index``: writes its rows of out and lse."""
        index, q0 = part  # index: the split leading batch dims; the rest come along whole
        q1 = min(q0 + block_q, T)
        q_blk = q_full[index][..., q0:q1, :] * scale_typed  # (..., bq, D) scale folded into q
        part_tiles = tiles.part(index, len(batch))
        acc, ref = _online_softmax(q_blk, q0, q1, k_t[index], v_ones[index], part_tiles,
                                   block_k, units, None)  # (..., bq, Dv + 1)
        row_sum = acc[..., Dv:]  # (..., bq, 1)
        # Rows with nothing to attend to have Σ p = 0 (and Σ p v = 0): divide by 1 to give 0.
        empty = row_sum == 0.0  # (..., bq, 1)
        safe_sum = np.where(empty, 1.0, row_sum).astype(dtype, copy=False)  # (..., bq, 1)
        np.divide(acc[..., :Dv], safe_sum, out=out[index][..., q0:q1, :])
        log_sum = units.log(safe_sum.astype(np.float64))  # (..., bq, 1) in score units
        if ref is not None:
            log_sum += ref
        log_sum /= units.per_nat  # back to natural units (exact for base e)
        lse[index][..., q0:q1] = np.where(empty, -np.inf, log_sum)[..., 0]

    split = _split_batch(batch, min(block_q, T) * min(block_k, S))
    parts = [(index, q0) for index in np.ndindex(*batch[:split]) for q0 in range(0, T, block_q)]
    _run_parts(forward_part, parts, num_threads)
    if stats is not None:  # tiles over all batch-heads at once, as the backward counts them
        for q0 in range(0, T, block_q):
            for k0 in range(0, S, block_k):
                tiles.blocked(q0, min(q0 + block_q, T), k0, min(k0 + block_k, S), stats)

    if v_unit is not None:
        out *= v_unit  # back from units: |out| <= max|v| per column, no overflow
    out = out.astype(out_dtype, copy=False)
    return (out, lse) if return_lse else out


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        dq    = dz k · scale,   dk = dzᵀ q · scale

    (δ = Σ_S P ⊙ dP, the softmax-backward row sum, is computed from the
    recomputed weights in a first pass over the tiles, as the plain backward
    does, not from ``out``, and divided by Σ_S P: see the comment in the code.) ``out`` is checked
    for its shape only. Rows with nothing to attend to (lse = -inf) pass no
    gradient. A row whose every score sits under a huge finite fill (-1e9,
    ``finfo.min``) has an lse whose fractional part even float64 cannot hold;
    its exact reference is recomputed from the scores.
    """
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, allowed, bias_arr = (
        inputs.q, inputs.k, inputs.v, inputs.allowed, inputs.bias
    )
    scale_value, out_dtype = inputs.scale, inputs.out_dtype
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    dtype = q_arr.dtype
    T, D, S, Dv = *q_arr.shape[-2:], k_arr.shape[-2], v_arr.shape[-1]
    batch = np.broadcast_shapes(q_arr.shape[:-2], k_arr.shape[:-2], v_arr.shape[:-2])
    tiles = _Tiles(T, S, allowed, bias_arr, inputs.is_causal)
    check_alloc((*batch, T + S, D + Dv), dtype, "the gradients dq, dk, dv", "q, k, v")
    _as_forward(out, "out", (*batch, T, Dv), "(..., T, Dv)", dtype)
    lse_arr = _as_forward(lse, "lse", (*batch, T), "(..., T)", _LSE_DTYPE, allow_neginf=True)
    dout_arr = check_upstream(dout, (*batch, T, Dv), "(..., T, Dv)", dtype)

    # The weights are rebuilt in the forward's units (the same choice from the same
    # inputs), from scores rounded exactly as the forward's were: a query that sees
    # one key then gets P = 1 up to the rounding of exp and log alone.
    units = _score_units(q_arr, k_arr, scale_value, bias_arr)
    scale_typed = dtype.type(scale_value)  # for dq and dk
    scores_scale = dtype.type(scale_value * units.per_nat)  # folded into q, as in the forward
    q_full = np.broadcast_to(q_arr, (*batch, T, D))  # (..., T, D) a view
    k_t = np.swapaxes(k_arr, -1, -2)  # (..., D, S)
    v_t = np.swapaxes(v_arr, -1, -2)  # (..., Dv, S)
    lse_high, lse_low = _split_lse(lse_arr * units.per_nat, dtype)  # (..., T, 1) each, in units
    _exact_references(lse_high, lse_low, q_full, k_t, scores_scale, tiles, block_q, block_k,
                      units)

    def tile_weights(q0: int, q1: int, k0: int, k1: int, blocked: np.ndarray | None) -> np.ndarray:
        weights = np.matmul(q_full[..., q0:q1, :] * scores_scale, k_t[..., k0:k1])  # (..., bq, bk)
        tiles.add_bias(weights, q0, q1, k0, k1)
        if blocked is not None:
            np.copyto(weights, -np.inf, where=blocked)
        with np.errstate(over="ignore"):  # -3e38 - 3e38 = -inf: weight 0, as it should be
            weights -= lse_high[..., q0:q1, :]
        weights -= lse_low[..., q0:q1, :]
        return units.exp(weights, out=weights)  # (..., bq, bk) P, recomputed

    # δ = Σ_S P ⊙ dP / Σ_S P, from the same P and dP tiles that the main pass
    # uses (a first pass over the tiles). FlashAttention-2 takes δ = rowsum(dout
    # ⊙ out) instead, equal in exact arithmetic and one pass cheaper, but it
    # carries the forward's rounding of ``out``, independent of the dP it is
    # subtracted from: float32 dq came out ~2-3x less accurate than the plain
    # backward's on some BLAS kernels. Dividing by Σ P (1 up to the rounding of
    # lse) makes δ the mean of dP under the very weights used below, so that
    # dP - δ cancels as in the plain path: a query that sees one key gets dq = 0.
    # This pass costs two of the backward's seven tile matmuls.
    weighted = np.zeros((*batch, T, 2), dtype=dtype)  # (..., T, 2) [Σ P dP, Σ P]
    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        for k0 in range(0, S, block_k):
            k1 = min(k0 + block_k, S)
            blocked = tiles.blocked(q0, q1, k0, k1, None)
            if blocked is _SKIP:
                continue
            weights = tile_weights(q0, q1, k0, k1, blocked)  # (..., bq, bk) P
            dscores = np.matmul(dout_arr[..., q0:q1, :], v_t[..., k0:k1])  # (..., bq, bk) dP
            dscores *= weights
            weighted[..., q0:q1, 0] += dscores.sum(axis=-1)  # (..., bq)
            weighted[..., q0:q1, 1] += weights.sum(axis=-1)  # (..., bq)
    total = weighted[..., 1:]  # (..., T, 1)
    delta = weighted[..., :1] / np.where(total == 0.0, 1.0, total)  # (..., T, 1)

    dq = np.zeros((*batch, T, D), dtype=dtype)  # (..., T, D), in units of dz k
    dk = np.zeros((*batch, S, D), dtype=dtype)  # (..., S, D), in units of dzᵀ q
    dv = np.zeros((*batch, S, Dv), dtype=dtype)  # (..., S, Dv)

    for k0 in range(0, S, block_k):
        k1 = min(k0 + block_k, S)
        dk_blk, dv_blk = dk[..., k0:k1, :], dv[..., k0:k1, :]  # views, accumulated in place
        for q0 in range(0, T, block_q):
            q1 = min(q0 + block_q, T)
            blocked = tiles.blocked(q0, q1, k0, k1, stats)
            if blocked is _SKIP:
                continue
            weights = tile_weights(q0, q1, k0, k1, blocked)  # (..., bq, bk) P
            dout_blk = dout_arr[..., q0:q1, :]  # (..., bq, Dv)
            dv_blk += np.matmul(np.swapaxes(weights, -1, -2), dout_blk)  # (..., bk, Dv)
            dscores = np.matmul(dout_blk, v_t[..., k0:k1])  # (..., bq, bk) dP
            dscores -= delta[..., q0:q1, :]
            dscores *= weights  # (..., bq, bk) dz
            dq[..., q0:q1, :] += np.matmul(dscores, k_arr[..., k0:k1, :])  # (..., bq, D)
            dk_blk += np.matmul(np.swapaxes(dscores, -1, -2), q_full[..., q0:q1, :])  # (..., bk, D)
    dq *= scale_typed
    dk *= scale_typed
    return (
        sum_to_shape(dq, q_arr.shape).astype(out_dtype, copy=False),
        sum_to_shape(dk, k_arr.shape).astype(out_dtype, copy=False),
        sum_to_shape(dv, v_arr.shape).astype(out_dtype, copy=False),
    )


def merge_partials(
    out1: Any, lse1: Any, out2: Any, lse2: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Combine attention over two disjoint key sets into attention over their union.

    Shapes: out1, out2 (..., T, Dv), lse1, lse2 (..., T) -> out (..., T, Dv), lse (..., T)
    (lse in float64, as :func:`flash_attention` returns it).

    If ``out1, lse1 = flash_attention(q, k[..., :S1, :], v[..., :S1, :], return_lse=True)``
    and ``out2, lse2`` the same over keys [S1:S] (masks and bias sliced alike),
    the result equals ``flash_attention(q, k, v, return_lse=True)``. Each part's
    weights were normalised by its own Σ exp = exp(lse), so::

        lse = log(exp(lse1) + exp(lse2))
        out = exp(lse1 - lse) · out1 + exp(lse2 - lse) · out2

    A side with no allowed key (lse = -inf) contributes nothing; if neither has
    one the result is out 0, lse -inf.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((4, 8))  # (T, D)
    >>> k, v = rng.standard_normal((10, 8)), rng.standard_normal((10, 3))  # (S, D), (S, Dv)
    >>> left = flash_attention(q, k[:6], v[:6], return_lse=True)
    >>> right = flash_attention(q, k[6:], v[6:], return_lse=True)
    >>> out, lse = merge_partials(*left, *right)
    >>> bool(np.allclose(out, flash_attention(q, k, v)))
    True
    """
    o1 = as_float_array(out1, "out1")
    check_ndim(o1, "out1", 2, "(..., T, Dv)")
    o2 = as_float_array(out2, "out2")
    if o2.shape != o1.shape:
        raise ShapeError(
            f"out2: expected the shape of out1 (..., T, Dv) = {shape_str(o1.shape)}, "
            f"got {shape_str(o2.shape)}"
        )
    dtype = np.result_type(o1, o2)
    l1, l2 = (
        _as_forward(lse, name, o1.shape[:-1], "(..., T)", _LSE_DTYPE, allow_neginf=True)
        for name, lse in (("lse1", lse1), ("lse2", lse2))
    )
    lse = np.logaddexp(l1, l2)  # (..., T)
    shift = np.where(lse == -np.inf, np.inf, lse)  # neither side has a key: weights exp(-inf) = 0
    weight1 = np.exp(l1 - shift)[..., None].astype(dtype)  # (..., T, 1)
    weight2 = np.exp(l2 - shift)[..., None].astype(dtype)  # (..., T, 1)
    return weight1 * o1 + weight2 * o2, lse


# ------------------------------------------------------------------------ helpers


def _unit_columns(v: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray | None]:
    """v in units that keep the running sums finite: (v / unit, unit (Dv,)), or (v, None).

    The unnormalised weights p reach e^_WINDOW, so Σ p v can exceed max|v| by a
    factor S·e^20 before the final division: v of 1e30 in float32 at S = 1000
    would overflow to inf although the output (a weighted mean of v) is finite.
    Only then is each column divided by a power of two (exact) of about its
    largest |v|, and the output multiplied back.
    """
    if v.size == 0:
        return v, None
    col_max = np.max(np.abs(v), axis=tuple(range(v.ndim - 1)))  # (Dv,)
    if float(col_max.max()) * S * math.exp(_WINDOW) < float(np.finfo(v.dtype).max) / 2:
        return v, None
    unit = np.exp2(np.floor(np.log2(np.where(col_max > 0, col_max, 1.0)))).astype(v.dtype)
    return v / unit, unit

_SKIP = np.zeros((), dtype=bool)  # sentinel: the whole tile is masked out


@dataclass(frozen=True)
class _ScoreUnits:
    """The base in which a tile's scores are exponentiated: e, or 2 with log2(e) folded into q.

    Where NumPy's exp2 runs in SIMD code (its AVX-512 loops), float32 exp2 is
    about twice as fast as exp and more exact (measured within 1 ulp over
    [-30, 10], against 2.4 ulps for exp), and exp was a tenth of the forward's
    time. Multiplying q by scale·log2(e) instead of scale gives scores
    s·log2(e), and 2^(s·log2 e - m) = e^(s - m·ln 2), so only the reference's
    units change; the lse is brought back to natural units.
    """

    exp: np.ufunc
    log: np.ufunc
    per_nat: float  # score units per natural unit: 1 for base e, log2(e) for base 2


_BASE_E = _ScoreUnits(np.exp, np.log, 1.0)
_BASE_2 = _ScoreUnits(np.exp2, np.log2, 1.0 / math.log(2.0))


def _score_units(
    q: np.ndarray, k: np.ndarray, scale: float, bias: np.ndarray | None
) -> _ScoreUnits:
    """Base 2 where NumPy's exp2 is fast, unless a bias is given or 1.44x larger scores
    could overflow.

    A bias is given in natural units: scaling it per tile would cost a pass, and
    a huge fill (-1e9) rounded at base 2's spacing would move the lse away from
    the plain path's. check_inputs bounds the natural scores only.
    """
    if bias is not None or not _exp2_is_vectorised(q.dtype):
        return _BASE_E
    limit = float(np.finfo(q.dtype).max) / 2
    q_max = abs_max(q) * abs(scale) * _BASE_2.per_nat
    if q_max * abs_max(k) * q.shape[-1] < limit and q_max < limit:
        return _BASE_2
    return _BASE_E


@functools.cache
def _exp2_is_vectorised(dtype: np.dtype) -> bool:
    """Whether NumPy runs exp2 on ``dtype`` in SIMD code on this CPU (NumPy >= 2 can say).

    Its SIMD exp2 needs AVX-512; elsewhere float32 exp2 is a scalar loop, about
    2x slower than exp (which has AVX2 code), and base 2 would cost time.
    """
    try:
        from numpy.lib.introspect import opt_func_info
    except ImportError:  # NumPy < 2.0
        return False
    loops = opt_func_info(func_name="^exp2$", signature=f"^{np.dtype(dtype).name}$")
    return any(
        not target["current"].startswith("baseline") for target in loops.get("exp2", {}).values()
    )


def _online_softmax(
    q_blk: np.ndarray, q0: int, q1: int, k_t: np.ndarray, v_ones: np.ndarray, tiles: _Tiles,
    block_k: int, units: _ScoreUnits, stats: FlashStats | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """One query block's pass over the key tiles: the unnormalised sums and their reference.

    Shapes: q_blk (..., bq, D), scale already folded in; k_t (..., D, S);
    v_ones (..., S, Dv + 1), v with a column of ones -> acc (..., bq, Dv + 1) =
    [Σ p v, Σ p] with p = exp(score - ref) in ``units``, and ref (..., bq, 1)
    (None = all 0), in the same units.

    ref is kept in the scores' own (absolute) units and scores are shifted once,
    after their max is taken, so that a reference far from a row's real scores
    (-1e9 under a padded tile) costs no precision.

    Once every row has mass, the reference can only move up, and only for a row
    with a score more than the window above it, whose Σ p then exceeds
    e^_WINDOW. So a tile is first tried without its max (a pass fewer over it);
    if a row sum says the reference must move, the tile is made again and goes
    the long way. Either way the numbers are those of the long way.
    """
    most = math.exp(_WINDOW)  # the largest tile row sum that proves no score left the window
    tile_batch = np.broadcast_shapes(q_blk.shape[:-2], k_t.shape[:-2])
    # One buffer for every tile's scores: a fresh one per tile cost ~10% (new pages, cold cache).
    scratch = np.empty(math.prod(tile_batch) * q_blk.shape[-2] * block_k, dtype=q_blk.dtype)
    ref: np.ndarray | None = None  # (..., bq, 1)
    rows = (*tile_batch, q1 - q0)
    has_mass = np.zeros((*rows, 1), dtype=bool)  # (..., bq, 1) Σ p > 0 so far
    all_have_mass = False
    acc = np.zeros((*rows, v_ones.shape[-1]), dtype=q_blk.dtype)  # (..., bq, Dv + 1)
    for k0 in range(0, k_t.shape[-1], block_k):
        k1 = min(k0 + block_k, k_t.shape[-1])
        blocked = tiles.blocked(q0, q1, k0, k1, stats)
        if blocked is _SKIP:
            continue
        v_tile = v_ones[..., k0:k1, :]  # (..., bk, Dv + 1)
        tile_shape = (*tile_batch, q1 - q0, k1 - k0)
        scores_out = scratch[: math.prod(tile_shape)].reshape(tile_shape)  # (..., bq, bk)
        if all_have_mass:
            scores = _tile_scores(q_blk, k_t, tiles, q0, q1, k0, k1, blocked, scores_out)
            # A score past the window may overflow exp to inf, and inf · 0 in the
            # matmul to NaN: the check below sends such a tile the long way.
            with np.errstate(over="ignore", invalid="ignore"):
                if ref is not None:
                    scores -= ref
                units.exp(scores, out=scores)  # (..., bq, bk) unnormalised weights p
                tile_acc = np.matmul(scores, v_tile)  # (..., bq, Dv + 1)
            if tile_acc[..., -1].max() <= most:  # NaN compares False: the long way
                acc += tile_acc
                continue
        scores = _tile_scores(q_blk, k_t, tiles, q0, q1, k0, k1, blocked, scores_out)
        tile_max = scores.max(axis=-1, keepdims=True)  # (..., bq, 1)
        ref = _move_reference(tile_max, ref, has_mass, acc, units)
        if ref is not None:
            with np.errstate(over="ignore"):  # -3e38 - 3e38 = -inf: weight 0, as it should be
                scores -= ref
        units.exp(scores, out=scores)  # (..., bq, bk) unnormalised weights p
        acc += np.matmul(scores, v_tile)  # (..., bq, Dv + 1)
        has_mass |= tile_max != -np.inf
        all_have_mass = bool(has_mass.all())
    return acc, ref


def _tile_scores(
    q_blk: np.ndarray, k_t: np.ndarray, tiles: _Tiles, q0: int, q1: int, k0: int, k1: int,
    blocked: np.ndarray | None, out: np.ndarray,
) -> np.ndarray:
    """A tile's scores, with its bias added and its blocked entries at -inf, in ``out``.

    Shapes: q_blk (..., bq, D), k_t (..., D, S) -> out (..., bq, bk).
    """
    scores = np.matmul(q_blk, k_t[..., k0:k1], out=out)  # (..., bq, bk)
    tiles.add_bias(scores, q0, q1, k0, k1)
    if blocked is not None:
        np.copyto(scores, -np.inf, where=blocked)
    return scores


def _move_reference(
    tile_max: np.ndarray, ref: np.ndarray | None, has_mass: np.ndarray, acc: np.ndarray,
    units: _ScoreUnits,
) -> np.ndarray | None:
    """The rows' exponent reference after a tile whose row maxima are ``tile_max``.

    Shapes: tile_max, ref, has_mass (..., bq, 1); acc (..., bq, Dv + 1), rescaled
    in place. A row's reference moves onto its tile max when that max lies more
    than the window above it (the sums would overflow), or when the row has no mass
    yet and the max lies more than the window below it (every weight would
    underflow, e.g. a tile under seed 000's -1e9 fill). Moving up from ``old`` to
    ``new`` multiplies the sums by exp(old - new) ≤ 1 (in the scores' base),
    computed in float64 so that a difference of 1e9 gives an exact 0; moving
    down happens only without mass, where the sums are 0 and stay 0. Returns the
    new reference (None = all 0).
    """
    window = _WINDOW * units.per_nat  # e^_WINDOW of headroom in either base
    old = 0.0 if ref is None else ref
    with np.errstate(invalid="ignore"):  # -inf - -inf for rows with nothing yet: not moved
        gap = tile_max - old  # (..., bq, 1)
        moved = (gap > window) | ((gap < -window) & ~has_mass & (tile_max != -np.inf))
    if not moved.any():
        return ref
    new = np.where(moved, tile_max, old).astype(tile_max.dtype)  # (..., bq, 1)
    shift = np.minimum(np.asarray(old, np.float64) - new.astype(np.float64), 0.0)
    shrink = units.exp(shift)  # (..., bq, 1)
    acc *= shrink.astype(acc.dtype)  # rows that did not move: exp(0) = 1
    return new


# ------------------------------------------------------------------ parts, threads

_Result = TypeVar("_Result")


def _split_batch(batch: tuple[int, ...], tile: int) -> int:
    """How many leading batch dims to split into parts: the fewest that fit a part's tile.

    ``tile`` is one batch-head's tile (block_q × block_k, clipped to T and S). A
    part covers the batch dims after the split ones, and their tile together
    must hold at most _PART_SCORES, unless even one batch-head's does not.
    """
    for split in range(len(batch)):
        if math.prod(batch[split:]) * tile <= _PART_SCORES:
            return split
    return len(batch)


def _run_parts(
    work: Callable[[Any], _Result], parts: Sequence[Any], num_threads: int | None
) -> list[_Result]:
    """``[work(part) for part in parts]``, on ``num_threads`` threads with BLAS held to one.

    None: in the calling thread, BLAS untouched. The parts must write to
    disjoint memory; results come back in the order of ``parts``.
    """
    if num_threads is None:
        return [work(part) for part in parts]
    with _blas_held_to_one_thread() as held:
        if not held or num_threads == 1 or len(parts) < 2:
            return [work(part) for part in parts]
        with ThreadPoolExecutor(max_workers=min(num_threads, len(parts))) as pool:
            return list(pool.map(work, parts))


@contextmanager
def _blas_held_to_one_thread() -> Iterator[bool]:
    """Inside the block NumPy's BLAS uses one thread, restored on exit; False if not possible.

    threadpoolctl is optional (the core depends on NumPy alone): without it
    nothing is changed, and the block is told so.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield False
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield True


#: A row whose |lse| exceeds this came from a huge finite fill (-1e9, finfo.min)
#: over all its keys: float64 then rounds away part of log Σ exp, so
#: flash_attention_backward recomputes such a row's reference from its scores.
#: Real scores never get near it (softmax saturates long before).
_LSE_EXACT_LIMIT = 2.0**20


def _split_lse(lse: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The float64 lse (..., T) as high + low parts in ``dtype``, each (..., T, 1).

    Subtracting high then low from a tile of scores keeps the lse's fractional
    part without a float64 pass over the tile. A row with lse = -inf (nothing
    to attend to) gets high = +inf, low = 0: exp(s - inf) = 0, never -inf - -inf.
    """
    shift = np.where(lse == -np.inf, np.inf, lse)[..., None]  # (..., T, 1)
    high = shift.astype(dtype)  # (..., T, 1)
    with np.errstate(invalid="ignore"):  # inf - inf in the empty rows, set to 0 below
        low = (shift - high).astype(dtype)  # (..., T, 1)
    low[np.isinf(shift)] = 0.0
    return high, low


def _exact_references(
    high: np.ndarray, low: np.ndarray, q_full: np.ndarray, k_t: np.ndarray,
    scale: np.floating, tiles: _Tiles, block_q: int, block_k: int, units: _ScoreUnits,
) -> None:
    """Recompute (high, low) = (ref, log Σ exp(s - ref)) for query blocks with a huge lse.

    Shapes: high, low (..., T, 1), updated in place; q_full (..., T, D); k_t (..., D, S).
    Everything in ``units``, ``scale`` included.
    Only blocks holding a row with finite |lse| > _LSE_EXACT_LIMIT are redone,
    with the forward's own online softmax (sums only).
    """
    T, S = q_full.shape[-2], k_t.shape[-1]
    huge = np.isfinite(high) & (np.abs(high) > _LSE_EXACT_LIMIT)  # (..., T, 1)
    if not huge.any():
        return
    dtype = high.dtype
    ones = np.ones((S, 1), dtype=dtype)  # (S, 1): p @ ones gives Σ p
    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        if not huge[..., q0:q1, :].any():
            continue
        acc, ref = _online_softmax(
            q_full[..., q0:q1, :] * scale, q0, q1, k_t, ones, tiles, block_k, units, None
        )
        row_sum = acc[..., -1:]  # (..., bq, 1)
        empty = row_sum == 0.0
        with np.errstate(divide="ignore"):
            high[..., q0:q1, :] = np.where(empty, np.inf, 0.0 if ref is None else ref)
            low[..., q0:q1, :] = np.where(empty, 0.0, units.log(np.where(empty, 1.0, row_sum)))


class _Tiles:
    """Where each tile's mask and bias come from, without ever building a (T, S) array.

    The causal mask is made per tile from positions; ``mask`` and ``bias`` are
    sliced per tile along the T and S axes they really have (size-1 axes
    broadcast and are not sliced).
    """

    def __init__(
        self, T: int, S: int, allowed: np.ndarray | None, bias: np.ndarray | None,
        is_causal: bool,
    ) -> None:
        self.allowed = None if allowed is None else _at_least_2d(allowed)
        self.bias = None if bias is None else _at_least_2d(bias)
        self.is_causal = is_causal
        self.offset = S - T  # query i sits at absolute position S - T + i

    def part(self, index: tuple[int, ...], n_batch: int) -> _Tiles:
        """The tiles of the batch-heads at ``index``, the first of ``n_batch`` batch dims."""
        if not index:
            return self
        part = copy.copy(self)
        part.allowed = _batch_part(self.allowed, index, n_batch)
        part.bias = _batch_part(self.bias, index, n_batch)
        return part

    def blocked(
        self, q0: int, q1: int, k0: int, k1: int, stats: FlashStats | None
    ) -> np.ndarray | None:
        """The tile's blocked entries (True = masked out), None if none, or _SKIP if all."""
        blocked: np.ndarray | None = None
        if self.is_causal:
            if k0 > self.offset + q1 - 1:  # even the tile's last query sees no key in it
                return _count(stats, _SKIP)
            if k1 - 1 > self.offset + q0:  # some keys lie after the first query: a diagonal tile
                query_pos = np.arange(q0, q1)[:, None] + self.offset  # (bq, 1)
                blocked = np.arange(k0, k1)[None, :] > query_pos  # (bq, bk)
        if self.allowed is not None:
            allowed = _tile(self.allowed, q0, q1, k0, k1)  # (..., bq | 1, bk | 1)
            if not allowed.all():
                if not allowed.any():
                    return _count(stats, _SKIP)
                blocked = ~allowed if blocked is None else (blocked | ~allowed)
                if blocked.all():  # causal and mask together leave nothing
                    return _count(stats, _SKIP)
        return _count(stats, blocked)

    def add_bias(self, scores: np.ndarray, q0: int, q1: int, k0: int, k1: int) -> None:
        if self.bias is not None:
            # A huge negative score plus finfo.min overflows to -inf: that key is
            # blocked, exactly as on the plain path (documented there).
            with np.errstate(over="ignore"):
                scores += _tile(self.bias, q0, q1, k0, k1)  # (..., bq, bk)


def _count(stats: FlashStats | None, blocked: np.ndarray | None) -> np.ndarray | None:
    if stats is not None:
        if blocked is _SKIP:
            stats.skipped += 1
        else:
            stats.computed += 1
    return blocked


def _batch_part(
    arr: np.ndarray | None, index: tuple[int, ...], n_batch: int
) -> np.ndarray | None:
    """arr (..., T | 1, S | 1) at the first len(index) of n_batch batch dims, as a view.

    arr's leading dims line up with the last of the batch dims (broadcasting),
    and a size-1 dim stays shared: it is indexed at 0, never repeated.
    """
    if arr is None:
        return None
    lead = arr.shape[:-2]
    missing = n_batch - len(lead)  # batch dim j is arr's dim j - missing
    at = tuple(
        0 if lead[j - missing] == 1 else index[j] for j in range(max(missing, 0), len(index))
    )
    return arr[at]


def _at_least_2d(arr: np.ndarray) -> np.ndarray:
    """Prepend size-1 axes so that the last two axes are (T or 1, S or 1)."""
    return arr.reshape((1,) * (2 - arr.ndim) + arr.shape) if arr.ndim < 2 else arr


def _tile(arr: np.ndarray, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    rows = slice(q0, q1) if arr.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if arr.shape[-1] != 1 else slice(None)
    return arr[..., rows, cols]


def _as_forward(
    arr: Any, name: str, shape: tuple[int, ...], layout: str, dtype: np.dtype,
    *, allow_neginf: bool = False,
) -> np.ndarray:
    """Validate a forward result handed back (out, lse): exact shape, finite (or -inf) values."""
    converted = as_float_array(arr, name, allow_nonfinite=allow_neginf)
    if allow_neginf and (np.isnan(converted).any() or np.isposinf(converted).any()):
        raise AttnlabError(f"{name}: expected finite values or -inf, got NaN or +inf")
    if converted.shape != shape:
        raise ShapeError(
            f"{name}: expected the forward's {layout} = {shape_str(shape)}, "
            f"got {shape_str(converted.shape)}"
        )
    return converted.astype(dtype, copy=False)


