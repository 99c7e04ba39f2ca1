"""A paged KV cache, as inference servers keep one (vLLM's PagedAttention).

Dimension legend: B sequences in a call, H query heads, Hkv key/value heads (H
a multiple of Hkv), T new tokens per sequence, S_b keys of sequence b, D head
dim, Dv value head dim, P block size (positions per block), N blocks in the pool.

A server decodes many sequences of different lengths at once, and they start
and finish at different times. Giving each a contiguous buffer of the longest
length wastes most of it; here keys and values live in one pool of N
fixed-size blocks of P positions each, and every sequence has a **block table**,
the list of its blocks in position order: position p of a sequence is slot
``p mod P`` of block ``table[p // P]``. A sequence takes a new block only when
its last one is full, and :meth:`PagedKVCache.free` gives its blocks back to the
pool, where the next sequence that needs one reuses them (the most recently
freed first). A reused block is not cleared: what a sequence may read is set
by its table and its length alone. When sequences of different lengths are
batched, the shorter ones' slots past their length (padding, the rest of a
reused block) are gathered as exact zeros, not masked after reading, so that
nothing another sequence wrote, not even a NaN in the torch twin, can reach
a sequence that does not own it (0 × NaN is NaN under a mask; tested).

:meth:`PagedKVCache.attend` takes a batch of sequences, each with its own
length, and is an efficient implementation equivalent to the plain
computation over each sequence alone (tested to float precision)::

    for b, sequence in enumerate(sequences):
        keys   = every k appended to this sequence, in order    # (Hkv, S_b, D)
        values = every v appended to this sequence, in order    # (Hkv, S_b, Dv)
        out[b] = scaled_dot_product_attention(                  # (H, T, Dv)
            q[b], repeat(keys, H // Hkv, axis=0), repeat(values, H // Hkv, axis=0),
            is_causal=is_causal)                                # bottom-right aligned

Keys and values are stored in the cache's dtype (float16 and bfloat16 store
in half the memory and compute in float32, as :class:`attnlab.KVCache`). The
bookkeeping (the free list, the block tables, the slot of each position, the
checks and their messages) is :mod:`attnlab.fast.paged_book`, shared with the
torch twin; this module holds the NumPy array operations (those every NumPy
cache shares are :class:`attnlab.fast.kv_cache.NumpyTwinArrays`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..checks import check_alloc
from ..kernel import abs_max, attend, check_score_range
from .kv_cache import NumpyTwinArrays, cast_checked
from .paged_book import BlockAllocator, PagedBook, check_sequence_ids

__all__ = ["BlockAllocator", "PagedKVCache", "check_sequence_ids", "paged_allowed"]


def owned_slots(lengths: np.ndarray, S: int) -> np.ndarray:
    """Which of the S gathered slots each sequence owns: (B,) lengths -> (B, S) bool.

    Slot j of row b is position j of sequence b, real only for j < S_b; the
    others are padding (block 0 or stale slots) and are zeroed by both twins.
    """
    return np.arange(S)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]  # (B, S)


def paged_allowed(lengths: np.ndarray, T: int, S: int, is_causal: bool) -> np.ndarray:
    """Which of the S gathered key slots each query may attend: (B,) lengths -> (B, T, S).

    Slot j holds position j of its sequence; only j < S_b are real. Query i of
    sequence b sits at position S_b - T + i (bottom-right) and, causal, sees j
    up to it.
    """
    key_pos = np.arange(S)[None, None, :]  # (1, 1, S)
    allowed = key_pos < lengths[:, None, None]  # (B, 1, S)
    if is_causal:
        query_pos = lengths[:, None, None] - T + np.arange(T)[None, :, None]  # (B, T, 1)
        return allowed & (key_pos <= query_pos)  # (B, T, S)
    return np.broadcast_to(allowed, (len(lengths), T, S))  # (B, T, S)


class PagedKVCache(PagedBook[np.ndarray], NumpyTwinArrays):
    """Keys and values of many sequences in one pool of fixed-size blocks, with block tables.

    Shapes: a pool of keys (N, Hkv, P, D) and values (N, Hkv, P, Dv); per
    sequence a block table (ceil(S_b / P),) of block indices.

    ``add_sequence()`` returns a new sequence id (no block yet); ``append`` and
    ``attend`` take a list of ids, one per batch row, each sequence at its own
    length; ``free(id)`` returns its blocks to the pool. Appending that needs
    more blocks than are free raises before anything is written.

    >>> cache = PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=2)
    >>> a, b = cache.add_sequence(), cache.add_sequence()
    >>> rng = np.random.default_rng(0)
    >>> cache.append([a], rng.random((1, 1, 6, 2)), rng.random((1, 1, 6, 2)))  # a: 6 tokens
    >>> cache.append([b], rng.random((1, 1, 3, 2)), rng.random((1, 1, 3, 2)))  # b: 3 tokens
    >>> cache.block_table(a).tolist(), cache.block_table(b).tolist(), cache.num_free_blocks
    ([0, 1], [2], 5)
    >>> q, k = rng.random((2, 2, 1, 2)), rng.random((2, 1, 1, 2))   # one new token each
    >>> cache.attend([a, b], q, k, k).shape
    (2, 2, 1, 2)
    >>> cache.free(a); cache.num_free_blocks
    7
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
        *,
        dtype: Any = np.float64,
    ) -> None:
        self._k_max = 0.0  # the largest |key| ever written (for the score-range check)
        super().__init__(num_blocks, block_size, num_kv_heads, head_dim, value_head_dim,
                         dtype, None)

    def _to_compute(self, q: np.ndarray, name: str) -> np.ndarray:
        return cast_checked(q, self.compute_dtype, name, "the cache's compute dtype")

    def _check_scores(self, q: np.ndarray, k: np.ndarray | None, scale: float) -> None:
        k_max = max(self._k_max, 0.0 if k is None else abs_max(k))
        check_score_range(abs_max(q), k_max, self.head_dim, scale, self.compute_dtype)

    def _check_attend_room(self, B: int, H: int, T: int, S: int) -> None:
        check_alloc((B, H, T, S), self.compute_dtype, "the score matrix (B, H, T, max S_b)", "q")

    def _pool(self, width: int) -> np.ndarray:  # -> (N, Hkv, P, width)
        return np.zeros((self.num_blocks, self.num_kv_heads, self.block_size, width), self.dtype)

    def _index_array(self, blocks: list[int]) -> np.ndarray:
        return np.array(blocks, dtype=np.int64)

    def _write(self, ids: list[int], k: Any, v: Any) -> None:
        super()._write(ids, k, v)
        self._k_max = max(self._k_max, abs_max(k))

    def _gather_blocks(self, pool: np.ndarray, tables: list[list[int]], lengths: Sequence[int],
                       S: int, stored: bool) -> np.ndarray:
        n_blocks = len(tables[0]) if tables else 0
        blocks = np.array(tables, dtype=np.int64).reshape(len(tables), n_blocks)  # (B, n)
        gathered = pool[blocks]  # (B, n, Hkv, P, ·)
        B, _, Hkv, P, width = gathered.shape
        gathered = gathered.transpose(0, 2, 1, 3, 4).reshape(B, Hkv, n_blocks * P, width)
        dtype = self.dtype if stored else self.compute_dtype
        owned = owned_slots(np.asarray(lengths), S)[:, None, :, None]  # (B, 1, S, 1)
        return np.where(owned, gathered[:, :, :S], 0).astype(dtype, copy=False)  # (B, Hkv, S, ·)

    def _attend_grouped(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                        lengths: Sequence[int], T: int, S: int, is_causal: bool,
                        scale: float) -> np.ndarray:
        allowed = paged_allowed(np.asarray(lengths, dtype=np.int64), T, S, is_causal)  # (B, T, S)
        out, _ = attend(q, keys, values, allowed[:, None, None], None, scale)
        return out  # (B, Hkv, G, T, Dv)
