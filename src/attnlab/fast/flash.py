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
±20 around it, rather than on every tile, and without a bias the scores are
made in base 2: see :mod:`attnlab.fast.flash_tiles`.) Extra memory is the
(..., T, Dv) output, one copy of v and a few tiles, O(T·Dv + S·Dv +
block_q·block_k) per batch-head, instead of O(T·S). Tiles that the causal mask (or a ``mask``
whose slice is all False) removes entirely are skipped.

The work is cut into parts, one block of queries of a few batch-heads each,
that share nothing but their inputs: ``num_threads`` runs them on a pool of
threads (NumPy lets go of the GIL inside matmul and ufuncs), each with BLAS
held to one thread: see :mod:`attnlab.fast.flash_parts`.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims, which broadcast.

Mask convention (the only one in attnlab): ``mask`` is boolean and
**True = may attend**; additive values go through ``bias``. ``is_causal`` is
bottom-right aligned: query i sits at absolute position S - T + i (at i with
``causal_alignment="top_left"``). A query with nothing to attend to gets
output 0 (never NaN) and log-sum-exp -inf. Windows, soft-capping and ALiBi
slopes are applied tile by tile (:class:`attnlab.fast.flash_tiles.Tiles`).
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from ..checks import (
    as_float_array,
    check_alloc,
    check_flag,
    check_ndim,
    check_positive_int,
    shape_str,
)
from ..errors import ShapeError
from ..kernel import check_inputs, check_sinks
from . import flash_tiles
from .flash_backward import flash_attention_backward
from .flash_parts import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    LSE_DTYPE,
    FlashStats,
    as_forward,
    check_weighable,
    run_parts,
    split_batch,
    tiles_of,
)
from .flash_tiles import score_units, unit_columns

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "FlashStats",
    "flash_attention",
    "flash_attention_backward",
    "join_sinks",
    "merge_partials",
]



@overload
def flash_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., block_q: int = ..., block_k: int = ...,
    return_lse: Literal[False] = ..., stats: FlashStats | None = ...,
    num_threads: int | None = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    sinks: Any = ...,
) -> np.ndarray: ...
@overload
def flash_attention(
    q: Any, k: Any, v: Any, mask: Any = ..., *, bias: Any = ..., is_causal: bool = ...,
    scale: float | None = ..., block_q: int = ..., block_k: int = ...,
    return_lse: Literal[True], stats: FlashStats | None = ...,
    num_threads: int | None = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    sinks: Any = ...,
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
    window: Any = None,
    causal_alignment: str = "bottom_right",
    softcap: float | None = None,
    enable_gqa: bool = False,
    alibi_slopes: Any = None,
    sinks: Any = None,
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
    (same broadcasting, ``is_causal`` and ``causal_alignment``, ``window=(left,
    right)``, ``softcap``, ``enable_gqa``, ``alibi_slopes``, dtype rules, errors;
    not dropout) and returns the same numbers up to rounding. Tiles wholly
    outside the causal band or the window are skipped; ALiBi's bias is made per
    tile, never (T, S). Efficient implementation equivalent
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

    ``sinks`` (H,), attention sinks (see :func:`attnlab.scaled_dot_product_attention`),
    are joined after the tiles, exactly, by the merge rule of :func:`merge_partials`
    with a key set whose lse is the sink and whose output is 0::

        lse_sink = logaddexp(lse, sink_h),   out_sink = exp(lse - lse_sink) · out

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
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale, tiled=True,
                          window=window, causal_alignment=causal_alignment, softcap=softcap,
                          enable_gqa=enable_gqa, alibi_slopes=alibi_slopes)
    q_arr, k_arr, v_arr = inputs.q, inputs.k, inputs.v
    scale_value, out_dtype = inputs.scale, inputs.out_dtype
    sink_logits = check_sinks(sinks, inputs.batch, LSE_DTYPE)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    return_lse = check_flag(return_lse, "return_lse")
    if num_threads is not None:
        num_threads = check_positive_int(num_threads, "num_threads")
    dtype = q_arr.dtype
    T, D, S, Dv = *q_arr.shape[-2:], k_arr.shape[-2], v_arr.shape[-1]
    batch = inputs.batch
    # Broadcast batch dims can make the output far larger than any input.
    check_alloc((*batch, T, Dv), dtype, "the output (..., T, Dv)", "q, k, v")

    units = score_units(q_arr, k_arr, scale_value, inputs.bias)
    tiles = tiles_of(inputs, units.per_nat)
    scale_typed = dtype.type(scale_value * units.per_nat)  # folded into q: scores in units
    q_full = np.broadcast_to(q_arr, (*batch, T, D))  # (..., T, D) views: parts index them
    k_t = np.broadcast_to(np.swapaxes(k_arr, -1, -2), (*batch, D, S))  # (..., D, S)
    v_arr, v_unit = unit_columns(v_arr, S)  # out is computed in units of v_unit (Dv,)
    # v with a column of ones: p @ [v, 1] gives p v and the row sums of p in one matmul.
    v_ones = np.concatenate(
        [v_arr, np.ones((*v_arr.shape[:-1], 1), dtype=dtype)], axis=-1
    )  # (..., S, Dv + 1)
    v_ones = np.broadcast_to(v_ones, (*batch, S, Dv + 1))  # (..., S, Dv + 1) a view
    out = np.empty((*batch, T, Dv), dtype=dtype)  # (..., T, Dv)
    lse = np.empty((*batch, T), dtype=LSE_DTYPE)  # (..., T)

    def forward_part(part: tuple[tuple[int, ...], int]) -> None:
        """One block of queries of the batch-heads ``index``: writes its rows of out and lse."""
        index, q0 = part  # index: the split leading batch dims; the rest come along whole
        q1 = min(q0 + block_q, T)
        q_blk = q_full[index][..., q0:q1, :] * scale_typed  # (..., bq, D) scale folded into q
        part_tiles = tiles.part(index, len(batch))
        acc, ref = flash_tiles.online_softmax(q_blk, q0, q1, k_t[index], v_ones[index], part_tiles,
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

    split = split_batch(batch, min(block_q, T) * min(block_k, S))
    parts = [(index, q0) for index in np.ndindex(*batch[:split]) for q0 in range(0, T, block_q)]
    run_parts(forward_part, parts, num_threads)
    if stats is not None:  # tiles over all batch-heads at once, as the backward counts them
        for q0 in range(0, T, block_q):
            for k0 in range(0, S, block_k):
                tiles.blocked(q0, min(q0 + block_q, T), k0, min(k0 + block_k, S), stats)

    if v_unit is not None:
        out *= v_unit  # back from units: |out| <= max|v| per column, no overflow
    if sink_logits is not None:
        out, lse = join_sinks(out, lse, sink_logits)
    out = out.astype(out_dtype, copy=False)
    return (out, lse) if return_lse else out


def join_sinks(
    out: np.ndarray, lse: np.ndarray, sinks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the keys, joined with each head's sink (a key set of lse sink_h and
    output 0): (..., H, T, Dv), (..., H, T), (H, 1, 1) -> out, lse with the sinks."""
    joined = np.logaddexp(lse, sinks[..., 0])  # (..., H, T), float64
    kept = np.exp(lse - joined)  # (..., H, T): 0 for a row with no key (lse = -inf)
    return out * kept[..., None].astype(out.dtype), joined


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
    one the result is out 0, lse -inf. A huge finite fill (``finfo.min``, -1e30)
    over a whole row makes both sides' lse the fill: float64 has rounded away
    the log of each side's key count that weighs them, so such a row is refused
    (a boolean mask keeps it exact) rather than merged wrong.

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
        as_forward(lse, name, o1.shape[:-1], "(..., T)", LSE_DTYPE, allow_neginf=True)
        for name, lse in (("lse1", lse1), ("lse2", lse2))
    )
    check_weighable(l1, l2, dtype)
    lse = np.logaddexp(l1, l2)  # (..., T)
    shift = np.where(lse == -np.inf, np.inf, lse)  # neither side has a key: weights exp(-inf) = 0
    weight1 = np.exp(l1 - shift)[..., None].astype(dtype)  # (..., T, 1)
    weight2 = np.exp(l2 - shift)[..., None].astype(dtype)  # (..., T, 1)
    return weight1 * o1 + weight2 * o2, lse
