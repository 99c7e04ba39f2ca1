"""What :mod:`attnlab.fast.flash`'s forward and backward share: tile sizes, counts,
the tiles of checked inputs, parts and threads, and the backward's helpers.

The forward's work is cut into parts, one block of queries of a few batch-heads
each, that share nothing but their inputs: ``num_threads`` runs them on a pool
of threads (NumPy lets go of the GIL inside matmul and ufuncs), each with BLAS
held to one thread. The backward rebuilds each tile's weights from the
forward's float64 log-sum-exp, split here into two parts in the scores' dtype,
and recomputes it exactly for rows under a huge finite fill.

Dimension legend: T query length, S key length, D head dim, Dv value dim,
bq × bk a tile; ``...`` is any number of leading batch dims.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..checks import as_float_array, shape_str
from ..errors import AttnlabError, ShapeError
from ..kernel import AttentionInputs
from ..messages import msg
from . import flash_tiles
from .flash_tiles import ScoreUnits, Tiles

#: A part of the work holds at most this many scores per tile (its batch-heads ×
#: block_q × block_k), unless one batch-head's tile is larger already: the
#: leading batch dims are split until a tile fits in a core's cache (1 MiB in
#: float32). Tiles of 8 heads at once (4 MiB) ran ~10% slower.
PART_SCORES = 2**18

#: Default tile sizes, measured on CPU (benchmarks/bench_flash.py --blocks, 8 heads,
#: T = S = 4096, D = 64, 1 and 2 threads). Large enough that each tile's matmul
#: runs near BLAS speed and the Python loop costs little, small enough that one
#: head's tile of scores (1 MiB in float32) stays in a core's own cache while
#: it is made, exponentiated and multiplied by v.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512

#: The forward's log-sum-exp is kept in float64 whatever the inputs' dtype: see
#: :func:`attnlab.fast.flash.flash_attention`.
LSE_DTYPE = np.dtype(np.float64)

_Result = TypeVar("_Result")


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


def tiles_of(inputs: AttentionInputs, per_nat: float) -> Tiles:
    """The tiles of checked (``tiled=True``) inputs: their mask, bias, band, cap and ALiBi,
    the cap and the slopes in the scores' units (``per_nat`` per natural unit)."""
    return Tiles(inputs.T, inputs.S, inputs.allowed, inputs.bias, inputs.band,
                 offset=inputs.offset, softcap=inputs.softcap,
                 alibi_slopes=inputs.alibi_slopes, per_nat=per_nat)


def split_batch(batch: tuple[int, ...], tile: int) -> int:
    """How many leading batch dims to split into parts: the fewest that fit a part's tile.

    ``tile`` is one batch-head's tile (block_q × block_k, clipped to T and S). A
    part covers the batch dims after the split ones, and their tile together
    must hold at most PART_SCORES, unless even one batch-head's does not.
    """
    for split in range(len(batch)):
        if math.prod(batch[split:]) * tile <= PART_SCORES:
            return split
    return len(batch)


def run_parts(
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


def check_weighable(lse1: np.ndarray, lse2: np.ndarray, dtype: np.dtype) -> None:
    """Refuse to merge rows whose two float64 lse (..., T) cannot weigh the parts.

    Each side weighs exp(lse_i - lse). Beyond |lse| = _LSE_EXACT_LIMIT (a huge
    finite fill over the whole row: lse = fill + log n rounds to the fill) the
    rounding of each lse, one ulp, moves the weights by up to ulp / 4; where
    that exceeds the outputs' own precision (4 eps of ``dtype``) and the sides
    are close enough for both to count (|lse1 - lse2| < 64), the merged row
    would be off (out1 + out2 at finfo.min), so it is refused.
    """
    both = np.isfinite(lse1) & np.isfinite(lse2)  # (..., T)
    top = np.where(both, np.maximum(np.abs(lse1), np.abs(lse2)), 0.0)  # (..., T)
    with np.errstate(over="ignore", invalid="ignore"):  # spacing(finfo.max) is inf: refused
        unknown = (both & (top > _LSE_EXACT_LIMIT) & (np.abs(lse1 - lse2) < 64.0)
                   & (np.spacing(top) > 4 * np.finfo(dtype).eps))  # (..., T)
    if unknown.any():
        row = tuple(int(i) for i in np.argwhere(unknown)[0])
        raise AttnlabError(msg("flash.merge_unweighable", lse1=f"{lse1[row]:.6g}",
                               lse2=f"{lse2[row]:.6g}", row=row))


def split_lse(lse: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
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


def exact_references(
    high: np.ndarray, low: np.ndarray, q_full: np.ndarray, k_t: np.ndarray,
    scale: np.floating, tiles: Tiles, block_q: int, block_k: int, units: ScoreUnits,
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
        acc, ref = flash_tiles.online_softmax(
            q_full[..., q0:q1, :] * scale, q0, q1, k_t, ones, tiles, block_k, units, None
        )
        row_sum = acc[..., -1:]  # (..., bq, 1)
        empty = row_sum == 0.0
        with np.errstate(divide="ignore"):
            high[..., q0:q1, :] = np.where(empty, np.inf, 0.0 if ref is None else ref)
            low[..., q0:q1, :] = np.where(empty, 0.0, units.log(np.where(empty, 1.0, row_sum)))


def as_forward(
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


