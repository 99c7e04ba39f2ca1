"""The tiles of :func:`attnlab.fast.flash.flash_attention` and its online softmax.

A query block passes over the key tiles keeping, per query, a reference ``ref``
for the exponent and the unnormalised sums ``acc = [Σ p v, Σ p]`` with
p = exp(score - ref). The reference moves only when a row's tile max leaves
±20 around it (see ``WINDOW``), rather than on every tile; it is kept in the
scores' own units, so that scores far from it, such as -1e9 padding followed by
real keys, are never rounded against it. Without a bias the scores are made in
base 2, p = 2^(s·log2 e - m), which NumPy computes faster and more exactly than
e^s: see ``ScoreUnits``.

:class:`Tiles` gives each tile's blocked entries and bias without ever building
a (T, S) array, and tells which tiles the causal mask or an all-False ``mask``
slice removes entirely (``SKIP``).

Dimension legend: T query length, S key length, D head dim, Dv value dim,
bq × bk a tile; ``...`` is any number of leading batch dims.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..kernel import abs_max, alibi_tile
from ..masks import band_mask
from ..shapes import Band

#: exp is taken of (score - ref), with ref a per-row reference moved only when the
#: running max leaves ±WINDOW. Usual scores never move it, which saves a pass
#: over every tile (subtracting the max); e^20 of headroom cannot overflow a sum
#: of S terms in float32 (3.4e38) for any realistic S and |v|, and the row's
#: largest term e^(m - ref) ≥ e^-20 stays a normal float.
WINDOW = 20.0

SKIP = np.zeros((), dtype=bool)  # sentinel: the whole tile is masked out

#: At most this many band masks are kept per call (a causal band needs one per tile
#: shape on the diagonal; a window's two edges a few more).
_BAND_CACHE_SIZE = 32

#: Rows per piece of a tile on the edge of the causal band or window (see Tiles.pieces):
#: each piece spans only the keys its rows reach. Smaller pieces skip more masked
#: entries but make smaller, slower matmuls.
PIECE_ROWS = 128


class TileCounter(Protocol):
    """Counts of computed and skipped tiles, such as :class:`attnlab.fast.flash.FlashStats`."""

    computed: int
    skipped: int


@dataclass(frozen=True)
class ScoreUnits:
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


_BASE_E = ScoreUnits(np.exp, np.log, 1.0)
_BASE_2 = ScoreUnits(np.exp2, np.log2, 1.0 / math.log(2.0))


def score_units(
    q: np.ndarray, k: np.ndarray, scale: float, bias: object | None
) -> ScoreUnits:
    """Base 2 where NumPy's exp2 is fast, unless a bias is given or 1.44x larger scores
    could overflow.

    A bias is given in natural units: scaling it per tile would cost a pass, and
    a huge fill (-1e9) rounded at base 2's spacing would move the lse away from
    the plain path's. (A soft cap and ALiBi slopes are scaled once, in
    :class:`Tiles`.) check_inputs bounds the natural scores only.
    """
    if bias is not None or not exp2_is_vectorised(q.dtype):
        return _BASE_E
    limit = float(np.finfo(q.dtype).max) / 2
    q_max = abs_max(q) * abs(scale) * _BASE_2.per_nat
    if q_max * abs_max(k) * q.shape[-1] < limit and q_max < limit:
        return _BASE_2
    return _BASE_E


@functools.cache
def exp2_is_vectorised(dtype: np.dtype) -> bool:
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


def online_softmax(
    q_blk: np.ndarray, q0: int, q1: int, k_t: np.ndarray, v_ones: np.ndarray, tiles: Tiles,
    block_k: int, units: ScoreUnits, stats: TileCounter | None,
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
    e^WINDOW. So a tile is first tried without its max (a pass fewer over it);
    if a row sum says the reference must move, the tile is made again and goes
    the long way. Either way the numbers are those of the long way.
    """
    most = math.exp(WINDOW)  # the largest tile row sum that proves no score left the window
    tile_batch = np.broadcast_shapes(q_blk.shape[:-2], k_t.shape[:-2])
    # One buffer for every tile's scores: a fresh one per tile cost ~10% (new pages, cold cache).
    scratch = np.empty(math.prod(tile_batch) * q_blk.shape[-2] * block_k, dtype=q_blk.dtype)
    ref: np.ndarray | None = None  # (..., bq, 1)
    rows_shape = (*tile_batch, q1 - q0)
    has_mass = np.zeros((*rows_shape, 1), dtype=bool)  # (..., bq, 1) Σ p > 0 so far
    all_have_mass = False
    acc = np.zeros((*rows_shape, v_ones.shape[-1]), dtype=q_blk.dtype)  # (..., bq, Dv + 1)
    starts = range(0, k_t.shape[-1], block_k)
    if tiles.alibi_slopes is not None:
        # ALiBi's bias falls with distance: from the nearest keys (the last, under a causal
        # band) the first tile already holds each row's max, and the reference never has
        # to move up past the window (which makes a tile again the long way).
        starts = starts[::-1]
    # A tile on the edge of the causal band or window comes in pieces of rows, each over
    # the keys its rows can reach: the part that every row masks is not made.
    for r0, r1, c0, c1, blocked in tiles.walk(q0, q1, starts, block_k, stats):
        rows = slice(r0 - q0, r1 - q0)
        v_tile = v_ones[..., c0:c1, :]  # (..., bk, Dv + 1)
        tile_shape = (*tile_batch, r1 - r0, c1 - c0)
        scores_out = scratch[: math.prod(tile_shape)].reshape(tile_shape)  # (..., bq, bk)
        acc_rows = acc[..., rows, :]  # (..., bq, Dv + 1) a view
        ref_rows = None if ref is None else ref[..., rows, :]  # (..., bq, 1)
        if all_have_mass or (r1 - r0 < q1 - q0 and bool(has_mass[..., rows, :].all())):
            scores = _tile_scores(q_blk[..., rows, :], k_t, tiles, r0, r1, c0, c1, blocked,
                                  scores_out)
            # A score past the window may overflow exp to inf, and inf · 0 in the
            # matmul to NaN: the check below sends such a tile the long way.
            with np.errstate(over="ignore", invalid="ignore"):
                if ref_rows is not None:
                    scores -= ref_rows
                units.exp(scores, out=scores)  # (..., bq, bk) unnormalised weights p
                tile_acc = np.matmul(scores, v_tile)  # (..., bq, Dv + 1)
            if tile_acc[..., -1].max() <= most:  # NaN compares False: the long way
                acc_rows += tile_acc
                continue
        scores = _tile_scores(q_blk[..., rows, :], k_t, tiles, r0, r1, c0, c1, blocked,
                              scores_out)
        tile_max = scores.max(axis=-1, keepdims=True)  # (..., bq, 1)
        new_rows = _move_reference(tile_max, ref_rows, has_mass[..., rows, :], acc_rows,
                                   units)
        if new_rows is not ref_rows:  # moved: new_rows is a fresh array
            if ref is None:
                ref = np.zeros((*rows_shape, 1), dtype=tile_max.dtype)
            ref[..., rows, :] = new_rows
            ref_rows = ref[..., rows, :]
        if ref_rows is not None:
            with np.errstate(over="ignore"):  # -3e38 - 3e38 = -inf: weight 0, as it should be
                scores -= ref_rows
        units.exp(scores, out=scores)  # (..., bq, bk) unnormalised weights p
        acc_rows += np.matmul(scores, v_tile)  # (..., bq, Dv + 1)
        has_mass[..., rows, :] |= tile_max != -np.inf
        all_have_mass = bool(has_mass.all())
    return acc, ref


def _tile_scores(
    q_blk: np.ndarray, k_t: np.ndarray, tiles: Tiles, q0: int, q1: int, k0: int, k1: int,
    blocked: np.ndarray | None, out: np.ndarray,
) -> np.ndarray:
    """A tile's scores, soft-capped, with its bias added and its blocked entries at -inf.

    Shapes: q_blk (..., bq, D), k_t (..., D, S) -> out (..., bq, bk).
    """
    scores = np.matmul(q_blk, k_t[..., k0:k1], out=out)  # (..., bq, bk)
    tiles.cap(scores)
    tiles.add_bias(scores, q0, q1, k0, k1)
    if blocked is not None:
        np.copyto(scores, -np.inf, where=blocked)
    return scores


def _move_reference(
    tile_max: np.ndarray, ref: np.ndarray | None, has_mass: np.ndarray, acc: np.ndarray,
    units: ScoreUnits,
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
    window = WINDOW * units.per_nat  # e^WINDOW of headroom in either base
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



def unit_columns(v: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray | None]:
    """v in units that keep the running sums finite: (v / unit, unit (Dv,)), or (v, None).

    The unnormalised weights p reach e^WINDOW, so Σ p v can exceed max|v| by a
    factor S·e^20 before the final division: v of 1e30 in float32 at S = 1000
    would overflow to inf although the output (a weighted mean of v) is finite.
    Only then is each column divided by a power of two (exact) of about its
    largest |v|, and the output multiplied back.
    """
    if v.size == 0:
        return v, None
    col_max = np.max(np.abs(v), axis=tuple(range(v.ndim - 1)))  # (Dv,)
    if float(col_max.max()) * S * math.exp(WINDOW) < float(np.finfo(v.dtype).max) / 2:
        return v, None
    unit = np.exp2(np.floor(np.log2(np.where(col_max > 0, col_max, 1.0)))).astype(v.dtype)
    return v / unit, unit


class Tiles:
    """Where each tile's mask and bias come from, without ever building a (T, S) array.

    The causal rule and the window (one :class:`attnlab.shapes.Band`) are made
    per tile from positions, and so is ALiBi's bias -slope·|i' - j|; ``mask``
    and ``bias`` are sliced per tile along the T and S axes they really have
    (size-1 axes broadcast and are not sliced). ``softcap`` c turns a tile's
    scaled scores (natural units) into c·tanh(s / c) before the bias.
    """

    def __init__(
        self, T: int, S: int, allowed: np.ndarray | None, bias: np.ndarray | None,
        band: Band | None, *, offset: int | None = None, softcap: float | None = None,
        alibi_slopes: np.ndarray | None = None, per_nat: float = 1.0,
    ) -> None:
        self.allowed = None if allowed is None else _at_least_2d(allowed)
        self.bias = None if bias is None else _at_least_2d(bias)
        self.band = band
        self.S = S
        # In the scores' units (ScoreUnits.per_nat per natural unit): c·tanh(s / c) and
        # -slope·|i' - j| scale with the scores, so base 2 needs no extra pass.
        self.softcap = None if softcap is None else softcap * per_nat
        self.alibi_slopes = None if alibi_slopes is None else alibi_slopes * per_nat  # (..., 1, 1)
        # Query i sits at absolute position offset + i (S - T bottom-right, 0 top-left).
        self.offset = (S - T if band is None else band.offset) if offset is None else offset
        # The band's tile masks by (diagonal, bq, bk), shared with the parts (see part()).
        self._band_cache: dict[tuple[int, int, int], np.ndarray] = {}

    def part(self, index: tuple[int, ...], n_batch: int) -> Tiles:
        """The tiles of the batch-heads at ``index``, the first of ``n_batch`` batch dims."""
        if not index:
            return self
        part = copy.copy(self)
        part.allowed = _batch_part(self.allowed, index, n_batch)
        part.bias = _batch_part(self.bias, index, n_batch)
        part.alibi_slopes = _batch_part(self.alibi_slopes, index, n_batch)
        return part

    def blocked(
        self, q0: int, q1: int, k0: int, k1: int, stats: TileCounter | None
    ) -> np.ndarray | None:
        """The tile's blocked entries (True = masked out), None if none, or SKIP if all."""
        blocked: np.ndarray | None = None
        if self.band is not None:
            reach = self.band.reaches(self.offset + q0, self.offset + q1 - 1, k0, k1 - 1)
            if reach == "none":  # wholly outside the causal band or the window
                return _count(stats, SKIP)
            if reach == "some":  # a diagonal or window-edge tile
                blocked = self._band_blocked(q0, q1, k0, k1)  # (bq, bk)
        if self.allowed is not None:
            allowed = _tile(self.allowed, q0, q1, k0, k1)  # (..., bq | 1, bk | 1)
            if not allowed.all():
                if not allowed.any():
                    return _count(stats, SKIP)
                blocked = ~allowed if blocked is None else (blocked | ~allowed)
                if blocked.all():  # the band and mask together leave nothing
                    return _count(stats, SKIP)
        return _count(stats, blocked)

    def _band_blocked(self, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
        """The band's blocked entries of a tile, (bq, bk), read-only. They depend only on
        the tile's shape and its diagonal (q0 - k0), which the tiles of every
        batch-head and of every block on the same diagonal share: each is made once."""
        assert self.band is not None
        key = (self.band.offset + q0 - k0, q1 - q0, k1 - k0)
        found = self._band_cache.get(key)
        if found is None:
            found = ~band_mask(self.band, q1 - q0, k1 - k0, q0, k0)  # (bq, bk)
            found.flags.writeable = False
            if len(self._band_cache) < _BAND_CACHE_SIZE:
                self._band_cache[key] = found
        return found

    def walk(self, q0: int, q1: int, starts: Iterable[int], block_k: int,
             stats: TileCounter | None) -> Iterator[tuple[int, int, int, int, np.ndarray | None]]:
        """The pieces (:meth:`pieces`) of the key tiles at ``starts`` that queries q0:q1
        reach; a tile the band or the mask removes is skipped (counted in ``stats``)."""
        for k0 in starts:
            k1 = min(k0 + block_k, self.S)
            tile_blocked = self.blocked(q0, q1, k0, k1, stats)
            if tile_blocked is not SKIP:
                yield from self.pieces(q0, q1, k0, k1, tile_blocked)

    def pieces(
        self, q0: int, q1: int, k0: int, k1: int, blocked: np.ndarray | None,
    ) -> list[tuple[int, int, int, int, np.ndarray | None]]:
        """A tile as (r0, r1, c0, c1, blocked) pieces that together hold every entry the
        band allows: the tile itself, or, on the edge of the causal band or window, its
        rows in blocks of PIECE_ROWS, each over the keys those rows can reach.

        ``blocked`` is the tile's (from :meth:`blocked`, not SKIP). On a causal diagonal
        tile of 512 × 512 the pieces hold 62.5% of its entries.
        """
        band = self.band
        if (band is None or blocked is None or q1 - q0 <= PIECE_ROWS
                or band.reaches(self.offset + q0, self.offset + q1 - 1, k0, k1 - 1) != "some"):
            return [(q0, q1, k0, k1, blocked)]
        pieces = []
        for r0 in range(q0, q1, PIECE_ROWS):
            r1 = min(r0 + PIECE_ROWS, q1)
            first, last = self.offset + r0, self.offset + r1 - 1  # the rows' positions
            c0 = k0 if band.left is None else max(k0, first - band.left)
            c1 = k1 if band.right is None else min(k1, last + band.right + 1)
            if c1 <= c0:
                continue
            piece = self.blocked(r0, r1, c0, c1, None)
            if piece is not SKIP:
                pieces.append((r0, r1, c0, c1, piece))
        return pieces

    def cap(self, scores: np.ndarray, *, slope: bool = False) -> np.ndarray | None:
        """Soft-cap a tile's scaled scores in place; with ``slope`` returns d cap / d s =
        1 - tanh² (same shape) for the backward, else (and without a cap) None."""
        if self.softcap is None:
            return None
        cap = scores.dtype.type(self.softcap)
        scores /= cap
        np.tanh(scores, out=scores)
        derivative = 1.0 - np.square(scores) if slope else None  # (..., bq, bk)
        scores *= cap
        return derivative

    def add_bias(self, scores: np.ndarray, q0: int, q1: int, k0: int, k1: int) -> None:
        if self.bias is not None:
            # A huge negative score plus finfo.min overflows to -inf: that key is
            # blocked, exactly as on the plain path (documented there).
            with np.errstate(over="ignore"):
                scores += _tile(self.bias, q0, q1, k0, k1)  # (..., bq, bk)
        if self.alibi_slopes is not None:
            self._add_alibi(scores, q0, q1, k0, k1)

    def _add_alibi(self, scores: np.ndarray, q0: int, q1: int, k0: int, k1: int) -> None:
        """scores -= slope·|i' - j|, one batch-head at a time: the exact integer distances
        once per tile, then two passes per batch-head over a (bq, bk) temporary, rather
        than a fresh (..., bq, bk) bias per tile."""
        assert self.alibi_slopes is not None
        if not scores.flags.c_contiguous:  # never the tiles made here; the general way
            scores += alibi_tile(self.alibi_slopes, self.offset, q0, q1, k0, k1)
            return
        query_pos = np.arange(q0, q1, dtype=scores.dtype) + scores.dtype.type(self.offset)
        distance = np.subtract.outer(query_pos, np.arange(k0, k1, dtype=scores.dtype))
        np.abs(distance, out=distance)  # (bq, bk) |i' - j|, exact integers
        slopes = np.broadcast_to(self.alibi_slopes, (*scores.shape[:-2], 1, 1))  # (..., 1, 1)
        rows = scores.reshape(-1, *scores.shape[-2:])  # (n, bq, bk), a view
        term = np.empty_like(distance)  # (bq, bk)
        for row, slope in zip(rows, slopes.reshape(-1), strict=True):
            np.multiply(distance, slope, out=term)  # slope·|i' - j|
            row -= term


def _count(stats: TileCounter | None, blocked: np.ndarray | None) -> np.ndarray | None:
    if stats is not None:
        if blocked is SKIP:
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
