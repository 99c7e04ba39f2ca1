"""A virtual ring in NumPy: W ranks of ring attention in one process, every step recorded.

This is the plain twin of :func:`attnlab.distributed.ring_attention`: the same
layouts, the same blocks per step (:func:`~attnlab.distributed.layouts.ring_blocks`),
the same merge of partial results by log-sum-exp, computed with attnlab's flash
primitives (:func:`attnlab.fast.flash.flash_attention` with ``return_lse=True``
for each block, :func:`attnlab.fast.flash.merge_partials` to combine them)::

    for each rank r:                        q_r, k_r, v_r = shard(q | k | v, rank=r)
        out_r, lse_r = 0, -inf                                   (..., T/W, Dv), (..., T/W)
        for step s = 0 … W−1:               src = (r − s) mod W: the K/V rank r holds now
            for each block of ring_blocks(r, src):               causal tiles skipped
                o, l = flash_attention(q_r[rows], k_src[cols], v_src[cols], return_lse=True)
                out_r, lse_r = merge_partials(out_r, lse_r, o, l)
            (then K/V move one rank on: r sends to r + 1, receives from r − 1)
    out = unshard([out_0, …, out_{W−1}])

The result is :class:`Simulation`: the unsharded output and log-sum-exp, and a
:class:`RingReport` of what each rank holds, receives, computes (score pairs,
FLOPs, flash tiles) and merges at every step. ``attnlab.report.ring`` prints
it in English and Chinese and draws it (ranks × steps, the work in each cell).

Dimension legend: B batch, H heads (Hkv key/value heads), T sequence length,
D head dim, Dv value dim, W world size. Mask convention: ``key_padding`` is
bool (B, T), **True = a real token** (may be attended to).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import (
    as_array,
    as_float_array,
    check_flag,
    check_positive_int,
    check_scale,
    shape_str,
)
from ..errors import ShapeError
from ..fast.flash import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    FlashStats,
    flash_attention,
    merge_partials,
)
from ..gqa import repeat_kv
from .layouts import Layout, check_layout, check_length, positions, ring_blocks, shard, unshard

__all__ = ["RingReport", "Simulation", "StepRecord", "simulate"]


@dataclass(frozen=True)
class StepRecord:
    """What one rank does in one ring step.

    ``kv_from``: whose K/V shard it computes with; ``receives_from`` / ``sends_to``:
    the ranks it exchanges K/V with at the end of the step (None at the last step,
    where nothing moves); ``blocks``: the (rows, cols, diagonal) blocks computed,
    in local coordinates; ``pairs``: (query, key) scores computed per batch-head;
    ``flops``: 2·pairs·(D + Dv) per batch-head times the batch-heads;
    ``tiles`` / ``tiles_skipped``: flash tiles computed and skipped inside the
    blocks; ``merged``: whether a partial result was merged into the rank's output.
    """

    rank: int
    step: int
    kv_from: int
    receives_from: int | None
    sends_to: int | None
    blocks: tuple[tuple[tuple[int, int], tuple[int, int], bool], ...]
    pairs: int
    flops: int
    tiles: int
    tiles_skipped: int
    merged: bool


@dataclass(frozen=True)
class RingReport:
    """The record of a virtual ring: ``steps[r][s]`` is rank r's :class:`StepRecord` at step s."""

    world_size: int
    layout: Layout
    is_causal: bool
    T: int
    batch_heads: int
    kv_heads_per_q_head: int  # H / Hkv: K/V bytes sent are 1 / this of q's heads' worth
    head_dim: int
    value_dim: int
    positions: tuple[tuple[int, ...], ...]  # positions[r]: the positions rank r holds
    steps: tuple[tuple[StepRecord, ...], ...]
    kv_bytes: int  # bytes of one K/V shard (with its key padding), sent once per step
    notes: tuple[str, ...] = field(default=())

    def work(self) -> np.ndarray:
        """(W, W) int: score pairs per batch-head computed by rank r at step s."""
        return np.array([[rec.pairs for rec in row] for row in self.steps], dtype=np.int64)

    def flops_per_rank(self) -> np.ndarray:
        """(W,) int: FLOPs of each rank over all steps."""
        return np.array([sum(rec.flops for rec in row) for row in self.steps], dtype=np.int64)

    def imbalance(self) -> float:
        """max / min of the ranks' FLOPs: 1 is perfect balance (inf if a rank does nothing)."""
        flops = self.flops_per_rank()
        return float(flops.max() / flops.min()) if flops.min() > 0 else float("inf")

    def sent_bytes_per_rank(self) -> int:
        """K/V bytes each rank sends in the forward: W − 1 shards."""
        return (self.world_size - 1) * self.kv_bytes


@dataclass(frozen=True)
class Simulation:
    """The virtual ring's result: out (..., T, Dv) and lse (..., T) unsharded, and its report."""

    out: np.ndarray
    lse: np.ndarray
    report: RingReport


def _key_mask(key_padding: np.ndarray | None, cols: slice, q_ndim: int) -> np.ndarray | None:
    """A (B, 1, …, 1, n) mask from the visiting shard's key padding (B, n), or None."""
    if key_padding is None:
        return None
    index = (slice(None),) + (None,) * (q_ndim - 2) + (cols,)
    return key_padding[index]  # (B, 1, ..., 1, n_cols)


def simulate(
    q: Any,
    k: Any,
    v: Any,
    *,
    world_size: int,
    layout: Layout = "zigzag",
    is_causal: bool = False,
    key_padding: Any = None,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> Simulation:
    """Ring attention over ``world_size`` virtual ranks, in one process, every step recorded.

    Shapes:
        q            (B, H, T, D)     the full sequence (it is sharded here)
        k            (B, Hkv, T, D)   Hkv divides H (grouped-query attention: query
                                      head h reads key/value head h // (H / Hkv))
        v            (B, Hkv, T, Dv)
        key_padding  bool (B, T), True = a real token; None = all real
        ->           Simulation(out (B, H, T, Dv), lse (B, H, T), report)

    Equals single-process attention (``flash_attention(q, k, v, mask, is_causal=...,
    return_lse=True)`` with the key padding as mask) up to rounding: the ring only
    changes the order in which key blocks are summed. T must be a multiple of W
    (2W for zigzag): pad to :func:`~attnlab.distributed.padded_length` and mark
    the padding in ``key_padding``. ``block_q`` / ``block_k``: the flash tiles
    inside each block. A query with nothing to attend to gets out 0, lse -inf.

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 16, 4)) for _ in range(3))  # (B, H, T, D)
    >>> sim = simulate(q, k, v, world_size=4, layout="zigzag", is_causal=True)
    >>> bool(np.allclose(sim.out, flash_attention(q, k, v, is_causal=True)))
    True
    >>> sim.report.imbalance()
    1.0
    """
    world_size = check_positive_int(world_size, "world_size")
    layout = check_layout(layout)
    is_causal = check_flag(is_causal, "is_causal")
    q_arr = as_float_array(q, "q")
    k_arr = as_float_array(k, "k")
    v_arr = as_float_array(v, "v")
    if q_arr.ndim != 4 or k_arr.ndim != 4 or v_arr.ndim != 4:
        raise ShapeError(f"q, k, v: expected (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, Dv), "
                         f"got {shape_str(q_arr.shape)}, {shape_str(k_arr.shape)}, "
                         f"{shape_str(v_arr.shape)}")
    B, H, T, D = q_arr.shape
    Hkv, Dv = k_arr.shape[1], v_arr.shape[-1]
    if k_arr.shape != (B, Hkv, T, D) or v_arr.shape[:-1] != (B, Hkv, T):
        raise ShapeError(f"k, v: expected (B, Hkv, T, D) = (B={B}, Hkv, T={T}, D={D}) and "
                         f"(B, Hkv, T, Dv) (self-attention: keys are the same sequence), "
                         f"got {shape_str(k_arr.shape)}, {shape_str(v_arr.shape)}")
    if Hkv == 0 or H % Hkv:
        raise ShapeError(f"k: expected key/value heads Hkv dividing the query heads H = {H}, "
                         f"got Hkv = {Hkv}")
    scale_value = check_scale(scale, D)
    n = check_length(T, world_size, layout)
    padding: np.ndarray | None = None
    if key_padding is not None:
        padding = as_array(key_padding, "key_padding")
        if padding.dtype != np.bool_ or padding.shape != (B, T):
            raise ShapeError(f"key_padding: expected bool (B, T) = {shape_str((B, T))} "
                             f"(True = a real token), got {padding.dtype} "
                             f"{shape_str(padding.shape)}")
    group = H // Hkv
    dtype = np.result_type(q_arr, k_arr, v_arr)
    # Grouped-query attention: each query head reads its group's K/V head (only the
    # Hkv heads would travel between real ranks; here they are expanded once).
    k_full = repeat_kv(k_arr, group).astype(dtype)  # (B, H, T, D)
    v_full = repeat_kv(v_arr, group).astype(dtype)  # (B, H, T, Dv)

    def rank_shard(x: np.ndarray, r: int, dim: int = -2) -> np.ndarray:
        return shard(x, rank=r, world_size=world_size, layout=layout, dim=dim)

    q_shards = [rank_shard(q_arr.astype(dtype), r) for r in range(world_size)]  # (B, H, n, D)
    kv_shards = [(rank_shard(k_full, r), rank_shard(v_full, r),
                  None if padding is None else rank_shard(padding, r, dim=-1))
                 for r in range(world_size)]
    outs, lses, records = [], [], []
    for r in range(world_size):
        out = np.zeros((B, H, n, Dv), dtype=dtype)  # (B, H, n, Dv)
        lse = np.full((B, H, n), -np.inf)  # (B, H, n) float64, as flash returns it
        row = []
        for step in range(world_size):
            src = (r - step) % world_size
            k_src, v_src, kp_src = kv_shards[src]
            blocks = ring_blocks(r, src, n, world_size=world_size, layout=layout,
                                 is_causal=is_causal)
            stats = FlashStats()
            for blk in blocks:
                part_out, part_lse = flash_attention(
                    q_shards[r][..., blk.rows, :], k_src[..., blk.cols, :],
                    v_src[..., blk.cols, :], _key_mask(kp_src, blk.cols, 4),
                    is_causal=blk.diagonal, scale=scale_value, block_q=block_q,
                    block_k=block_k, return_lse=True, stats=stats,
                )  # (B, H, rows, Dv), (B, H, rows)
                merged_out, merged_lse = merge_partials(
                    out[..., blk.rows, :], lse[..., blk.rows], part_out, part_lse)
                out[..., blk.rows, :] = merged_out
                lse[..., blk.rows] = merged_lse
            pairs = sum(blk.pairs() for blk in blocks)
            last = step == world_size - 1
            row.append(StepRecord(
                rank=r, step=step, kv_from=src,
                receives_from=None if last else (r - 1) % world_size,
                sends_to=None if last else (r + 1) % world_size,
                blocks=tuple(((b.rows.start, b.rows.stop), (b.cols.start, b.cols.stop),
                              b.diagonal) for b in blocks),
                pairs=pairs, flops=2 * pairs * (D + Dv) * B * H,
                tiles=stats.computed, tiles_skipped=stats.skipped, merged=bool(blocks),
            ))
        outs.append(out)
        lses.append(lse)
        records.append(tuple(row))
    kv_bytes = B * Hkv * n * (D + Dv) * dtype.itemsize + (0 if padding is None else B * n)
    report = RingReport(
        world_size=world_size, layout=layout, is_causal=is_causal, T=T, batch_heads=B * H,
        kv_heads_per_q_head=group, head_dim=D, value_dim=Dv,
        positions=tuple(tuple(int(p) for p in positions(T, rank=r, world_size=world_size,
                                                          layout=layout))
                        for r in range(world_size)),
        steps=tuple(records), kv_bytes=int(kv_bytes),
    )
    return Simulation(unshard(outs, layout=layout), unshard(lses, layout=layout, dim=-1), report)

