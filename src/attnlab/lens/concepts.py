"""The data behind the concept pictures: flash attention's tiles, the KV cache filling,
positional encodings, sparse and low-rank patterns. Results are data (arrays in small
dataclasses); :mod:`attnlab.report.concepts` draws them.

Each walk replays what a fast path does, step by step, on a small example, and is
tested against that fast path: :func:`flash_walk` (flash attention's plain twin,
:mod:`attnlab.fast.flash_walk`, re-exported here) against
:func:`attnlab.flash_attention` on every prefix of the keys, :func:`kv_cache_walk`
against :class:`attnlab.KVCache` / :class:`attnlab.SlidingWindowKVCache` and full
causal attention, the low-rank effective weights against the methods themselves
(they *are* the methods, applied to V = I).

Dimension legend: T query length, S key length, D head dim, Dv value dim, E model
width, W window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..checks import check_positive_int
from ..fast.block_sparse import block_sparse_mask
from ..fast.flash_walk import FlashStep, FlashWalk, flash_walk
from ..fast.kv_cache import KVCache, SlidingWindowKVCache
from ..fast.lowrank import linformer_attention, linformer_projection, nystrom_attention
from ..fast.sparse import sliding_window_mask
from ..kernel import attend
from ..positional import sinusoidal_encoding
from ..positional_relative import apply_rope, rope_angles

__all__ = ["FlashStep", "FlashWalk", "KVStep", "KVCacheWalk", "PositionPatterns",
           "SparsePatterns", "flash_walk", "kv_cache_walk", "position_patterns",
           "sparse_patterns", "example_qkv"]


def example_qkv(T: int = 8, D: int = 4, *, seed: int = 0,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal q, k, v of one head: (T, D) each, from ``seed``."""
    T, D = check_positive_int(T, "T"), check_positive_int(D, "D")
    rng = np.random.default_rng(check_positive_int(seed, "seed", allow_zero=True))
    q, k, v = (rng.standard_normal((T, D)) for _ in range(3))
    return q, k, v


# ------------------------------------------------------------------------- KV cache


@dataclass
class KVStep:
    """Decoding step t: the positions the cache holds after it, slot by slot (-1 =
    empty), and the new query's weights over the keys it sees (in position order)."""

    position: int
    slots: np.ndarray  # (capacity,) int: the position held in each slot, -1 if empty
    seen: np.ndarray  # (n,) int: the key positions the new query attends to
    weights: np.ndarray  # (n,)
    output: np.ndarray  # (Dv,) from the cache's own attend


@dataclass
class KVCacheWalk:
    window: int | None
    steps: list[KVStep] = field(default_factory=list)


def kv_cache_walk(q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                  window: int | None = None) -> KVCacheWalk:
    """Decode T tokens one at a time through a KV cache (a rolling window of W if given).

    Shapes: q, k (T, D), v (T, Dv). Step t appends token t's k and v and attends from
    its query over what the cache holds: positions 0..t (full cache) or the last W
    (rolling buffer, position p in slot p mod W). Outputs come from the caches
    themselves; the weights shown are softmax(q_t kᵀ / √D) over the keys seen.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T, D = q.shape
    if window is not None:
        window = check_positive_int(window, "window")
    cache: KVCache | SlidingWindowKVCache
    if window is None:
        cache = KVCache(1, 1, D, v.shape[1], max_len=T)
        capacity = T
    else:
        cache = SlidingWindowKVCache(1, 1, D, v.shape[1], window=window)
        capacity = window
    walk = KVCacheWalk(window=window)
    for t in range(T):
        out = cache.attend(q[None, None, t:t + 1], k[None, None, t:t + 1],
                           v[None, None, t:t + 1])  # (1, 1, 1, Dv)
        seen = np.arange(max(0, t - window + 1) if window else 0, t + 1)
        slots = np.full(capacity, -1)
        for p in seen if window else range(t + 1):
            slots[p % capacity if window else p] = p
        _, weights = attend(q[t:t + 1], k[seen], v[seen], None, None,
                            1.0 / np.sqrt(D))  # (1, n)
        walk.steps.append(KVStep(t, slots, seen, weights[0], out[0, 0, 0]))
    return walk


# ------------------------------------------------------------------------ positions


@dataclass
class PositionPatterns:
    sinusoidal: np.ndarray  # (T, E) the table added to X
    similarity: np.ndarray  # (T, T) pe · peᵀ: nearby positions look alike
    rope_angles: np.ndarray  # (T, D/2) the angle of each feature pair at each position
    rope_scores: np.ndarray  # (T, T) rope(x, m) · rope(x, n): a function of m - n only


def position_patterns(T: int = 32, d_model: int = 16, head_dim: int = 8, *,
                      seed: int = 0) -> PositionPatterns:
    """Sinusoidal table and similarity; RoPE's angles and the scores of one vector
    placed at every position (equal along each diagonal: relative position)."""
    T, d_model = check_positive_int(T, "T"), check_positive_int(d_model, "d_model")
    pe = sinusoidal_encoding(T, d_model)  # (T, E)
    cos, sin = rope_angles(np.arange(T), head_dim)  # (T, D) each, halves repeated
    angles = np.arctan2(sin, cos)[:, : head_dim // 2]  # (T, D/2), wrapped to (-π, π]
    x = np.random.default_rng(check_positive_int(seed, "seed", allow_zero=True)).standard_normal(
        head_dim)  # (D,)
    placed = apply_rope(np.tile(x, (T, 1)))  # (T, D): x at positions 0..T-1
    return PositionPatterns(pe, pe @ pe.T, angles, placed @ placed.T)


# --------------------------------------------------------------- sparse and low rank


@dataclass
class SparsePatterns:
    masks: dict[str, np.ndarray]  # name -> (T, T) bool, True = kept
    exact: np.ndarray  # (T, T) exact weights of the example q, k
    approximations: dict[str, np.ndarray]  # name -> (T, T) effective weights
    settings: dict[str, int]


def sparse_patterns(T: int = 24, *, window: int = 5, block_size: int = 3, rank: int = 4,
                    seed: int = 0) -> SparsePatterns:
    """Which keys each query keeps under a causal window, a symmetric window with a
    global token, and BigBird's blocks; and the weights Linformer and Nyström
    effectively use, found by running them with V = I (their output is then the
    (T, S) matrix they multiply V by)."""
    T = check_positive_int(T, "T")
    masks = {
        "window_causal": sliding_window_mask(T, window, is_causal=True),
        "window_global": sliding_window_mask(T, window, is_causal=False, global_tokens=[0]),
        "bigbird": block_sparse_mask(T, block_size, seed=seed),
    }
    q, k, _ = example_qkv(T, 8, seed=seed)
    identity = np.eye(T)
    _, exact = attend(q, k, identity, None, None, 1.0 / np.sqrt(8))  # (T, T)
    projection = linformer_projection(T, rank, kind="pool")
    approximations = {
        "linformer": linformer_attention(q, k, identity, projection),  # (T, T)
        "nystrom": nystrom_attention(q, k, identity, rank),  # (T, T)
    }
    return SparsePatterns(masks, exact, approximations,
                          {"window": window, "block_size": block_size, "rank": rank})
