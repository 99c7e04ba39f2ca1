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
in half the memory and compute in float32, as :class:`attnlab.KVCache`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import (
    AttnlabError,
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    check_scale,
    describe,
)
from ..kernel import abs_max, attend, check_score_range
from ..messages import msg
from ..shapes import check_cache_query_shape, check_kv_shapes
from .kv_cache import cast_checked, compute_dtype_of, storage_dtype

__all__ = ["BlockAllocator", "PagedKVCache", "check_sequence_ids", "paged_allowed"]


class BlockAllocator:
    """The free list of a pool of ``num_blocks`` blocks: hands blocks out and takes them back.

    Blocks freed last are handed out first (a stack), so that freed blocks are
    reused at once, warm in cache.

    >>> pool = BlockAllocator(4)
    >>> pool.allocate(2, "k"), pool.num_free
    ([0, 1], 2)
    >>> pool.release([0, 1]); pool.allocate(1, "k")
    [0]
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int, name: str) -> list[int]:
        """``count`` free blocks, or an AttnlabError naming ``name`` if the pool has too few."""
        if count > len(self._free):
            raise AttnlabError(
                f"{name}: the cache needs {count} more blocks but has {len(self._free)} free "
                f"of {self.num_blocks}; free finished sequences or create it with more "
                "num_blocks"
            )
        return [self._free.pop() for _ in range(count)]

    def release(self, blocks: Sequence[int]) -> None:
        """Give ``blocks`` back; the last of them is handed out first.

        Each must be a block of this pool that is handed out now: a block given
        back twice would later go to two sequences at once (checked before any
        is taken back).
        """
        free = set(self._free)
        seen: set[int] = set()
        for block in blocks:
            if (not isinstance(block, (int, np.integer)) or isinstance(block, bool)
                    or not 0 <= block < self.num_blocks):
                raise AttnlabError(msg("paged.block_id", last=self.num_blocks - 1,
                                       got=repr(block)))
            if block in free or block in seen:
                raise AttnlabError(msg("paged.block_free", block=int(block)))
            seen.add(int(block))
        self._free.extend(int(b) for b in reversed(blocks))


def check_sequence_ids(sequences: Any, known: dict[int, list[int]], B: int | None) -> list[int]:
    """``sequences`` as a list of distinct known sequence ids (B of them if B is given)."""
    if isinstance(sequences, (int, np.integer)) and not isinstance(sequences, bool):
        sequences = [sequences]
    if not isinstance(sequences, (list, tuple)) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in sequences):
        raise AttnlabError(f"sequences: expected a list of sequence ids (ints from "
                           f"add_sequence), got {describe(sequences)}")
    ids = [int(s) for s in sequences]
    unknown = [s for s in ids if s not in known]
    if unknown:
        raise AttnlabError(f"sequences: {unknown[0]} is not a sequence of this cache (freed, "
                           f"or never added); it holds {sorted(known)}")
    if len(set(ids)) != len(ids):
        raise AttnlabError(f"sequences: expected distinct ids, got {ids}")
    if B is not None and len(ids) != B:
        raise AttnlabError(f"sequences: expected one id per batch row of q, B = {B}, "
                           f"got {len(ids)}")
    return ids


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


class PagedKVCache:
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
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self.block_size = check_positive_int(block_size, "block_size")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_head_dim = (
            self.head_dim if value_head_dim is None
            else check_positive_int(value_head_dim, "value_head_dim")
        )
        self.dtype = storage_dtype(dtype)
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage.
        self.compute_dtype = compute_dtype_of(self.dtype)
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.num_blocks, self.num_kv_heads, self.block_size, width), self.dtype,
                        "the block pool (N, Hkv, P, D)", "num_blocks")
        self._keys = np.zeros((self.num_blocks, self.num_kv_heads, self.block_size,
                               self.head_dim), self.dtype)  # (N, Hkv, P, D)
        self._values = np.zeros((self.num_blocks, self.num_kv_heads, self.block_size,
                                 self.value_head_dim), self.dtype)  # (N, Hkv, P, Dv)
        self._allocator = BlockAllocator(self.num_blocks)
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0
        self._k_max = 0.0  # the largest |key| ever written (for the score-range check)

    # ---- sequences and blocks ----------------------------------------------------

    def add_sequence(self) -> int:
        """A new, empty sequence; returns its id (blocks come with its first tokens)."""
        sequence = self._next_id
        self._next_id += 1
        self._tables[sequence] = []
        self._lengths[sequence] = 0
        return sequence

    def free(self, sequence: int) -> None:
        """Forget ``sequence`` and give its blocks back to the pool."""
        (sequence,) = check_sequence_ids(sequence, self._tables, 1)
        self._allocator.release(self._tables.pop(sequence))
        del self._lengths[sequence]

    @property
    def sequences(self) -> list[int]:
        """The ids of the sequences held, in the order they were added."""
        return list(self._tables)

    def length(self, sequence: int) -> int:
        """Tokens held for ``sequence`` = the position of its next token (for RoPE)."""
        (sequence,) = check_sequence_ids(sequence, self._tables, 1)
        return self._lengths[sequence]

    def block_table(self, sequence: int) -> np.ndarray:  # -> (ceil(S_b / P),) int64
        """The blocks of ``sequence`` in position order (a copy)."""
        (sequence,) = check_sequence_ids(sequence, self._tables, 1)
        return np.array(self._tables[sequence], dtype=np.int64)

    @property
    def num_free_blocks(self) -> int:
        return self._allocator.num_free

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value pools: fixed, whatever is in them."""
        return self._keys.nbytes + self._values.nbytes

    def keys(self, sequence: int) -> np.ndarray:  # -> (Hkv, S_b, D)
        """A copy of the keys of ``sequence`` in position order."""
        return self._gather([self.length(sequence)], [sequence], self._keys, stored=True)[0]

    def values(self, sequence: int) -> np.ndarray:  # -> (Hkv, S_b, Dv)
        """A copy of the values of ``sequence`` in position order."""
        return self._gather([self.length(sequence)], [sequence], self._values, stored=True)[0]

    # ---- writing and attending -----------------------------------------------------

    def append(self, sequences: Any, k: Any, v: Any) -> None:
        """Append T new tokens to each of B sequences: k (B, Hkv, T, D), v (B, Hkv, T, Dv)."""
        k_arr, v_arr = self._check_kv(k, v)
        ids = check_sequence_ids(sequences, self._tables, k_arr.shape[0])
        self._write(ids, k_arr, v_arr)

    def attend(
        self, sequences: Any, q: Any, k: Any = None, v: Any = None, *, is_causal: bool = True,
        scale: float | None = None,
    ) -> np.ndarray:
        """Append each sequence's T new tokens (if k, v are given), then attend over its keys.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv);
        ``sequences``: B sequence ids, one per batch row, each at its own length S_b.

        Query i of row b sits at position S_b - T + i (S_b after the append) and,
        with ``is_causal`` (the default), sees that sequence's keys 0 .. S_b - T + i;
        ``is_causal=False``: all of them. ``k = v = None`` attends without
        appending. Never reads another sequence's keys. See the module docstring
        for the plain computation it equals.
        """
        is_causal = check_flag(is_causal, "is_causal")
        if (k is None) != (v is None):
            raise AttnlabError("k, v: expected both (append, then attend) or neither (attend "
                               f"over the cache as it is), got k {type(k).__name__} and v "
                               f"{type(v).__name__}")
        q_arr = as_float_array(q, "q")
        B = q_arr.shape[0] if q_arr.ndim == 4 else 0
        T = q_arr.shape[2] if q_arr.ndim == 4 else 0
        k_arr = v_arr = None
        if k is not None:
            k_arr, v_arr = self._check_kv(k, v)
            B, T = k_arr.shape[0], k_arr.shape[2]
        check_cache_query_shape(q_arr.shape, B, self.num_kv_heads, T, self.head_dim)
        q_arr = cast_checked(q_arr, self.compute_dtype, "q", "the cache's compute dtype")
        ids = check_sequence_ids(sequences, self._tables, B)
        scale_value = check_scale(scale, self.head_dim)
        k_max = max(self._k_max, 0.0 if k_arr is None else abs_max(k_arr))
        check_score_range(abs_max(q_arr), k_max, self.head_dim, scale_value, self.compute_dtype)
        lengths = np.array([self._lengths[s] + (0 if k_arr is None else T) for s in ids],
                           dtype=np.int64)  # (B,) after the append
        S = int(lengths.max()) if B else 0
        check_alloc((B, q_arr.shape[1], T, S), self.compute_dtype,
                    "the score matrix (B, H, T, max S_b)", "q")
        if k_arr is not None and v_arr is not None:
            self._write(ids, k_arr, v_arr)
        keys = self._gather(lengths, ids, self._keys, S)  # (B, Hkv, S, D)
        values = self._gather(lengths, ids, self._values, S)  # (B, Hkv, S, Dv)
        allowed = paged_allowed(lengths, T, S, is_causal)  # (B, T, S)
        H, Hkv = q_arr.shape[1], self.num_kv_heads
        G = H // Hkv
        # (B, Hkv, G, T, D) against (B, Hkv, 1, S, ·): the key/value heads are not repeated.
        out, _ = attend(q_arr.reshape(B, Hkv, G, T, self.head_dim), keys[:, :, None],
                        values[:, :, None], allowed[:, None, None], None, scale_value)
        return out.reshape(B, H, T, self.value_head_dim)  # (B, H, T, Dv)

    def _check_kv(self, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), in the storage dtype."""
        k_arr = as_float_array(k, "k")
        v_arr = as_float_array(v, "v")
        B = k_arr.shape[0] if k_arr.ndim == 4 else 0
        check_kv_shapes(k_arr.shape, v_arr.shape, B, self.num_kv_heads, self.head_dim,
                        self.value_head_dim)
        return (cast_checked(k_arr, self.dtype, "k", "the cache's dtype"),
                cast_checked(v_arr, self.dtype, "v", "the cache's dtype"))

    def _write(self, ids: list[int], k: np.ndarray, v: np.ndarray) -> None:
        """Each row's T tokens at positions S_b .. S_b + T - 1, taking new blocks as needed."""
        T, P = k.shape[2], self.block_size
        needed = [math.ceil((self._lengths[s] + T) / P) - len(self._tables[s]) for s in ids]
        if sum(needed) > self._allocator.num_free:  # refuse before writing anything
            self._allocator.allocate(sum(needed), "k")
        for s, count in zip(ids, needed, strict=True):
            self._tables[s] += self._allocator.allocate(count, "k")
        self._k_max = max(self._k_max, abs_max(k))
        for row, s in enumerate(ids):
            table, start = self._tables[s], self._lengths[s]
            position = start
            while position < start + T:  # one block's run of slots at a time
                block, slot = table[position // P], position % P
                count = min(P - slot, start + T - position)
                chunk = slice(position - start, position - start + count)
                self._keys[block, :, slot: slot + count] = k[row, :, chunk]
                self._values[block, :, slot: slot + count] = v[row, :, chunk]
                position += count
            self._lengths[s] = start + T

    def _gather(self, lengths: Sequence[int] | np.ndarray, ids: list[int], pool: np.ndarray,
                S: int | None = None, *, stored: bool = False) -> np.ndarray:
        """The first ``lengths[b]`` positions of each sequence, from ``pool`` (N, Hkv, P, ·),
        in the compute dtype (the storage dtype if ``stored``) -> (B, Hkv, S, ·), S = the
        longest unless given; slots past a sequence's length are exact zeros (never
        another sequence's values)."""
        P = self.block_size
        S = int(max(lengths, default=0)) if S is None else S
        n_blocks = math.ceil(S / P)
        tables = np.zeros((len(ids), n_blocks), dtype=np.int64)  # (B, n) padded with block 0
        for row, s in enumerate(ids):
            table = self._tables[s][:n_blocks]
            tables[row, : len(table)] = table
        gathered = pool[tables]  # (B, n, Hkv, P, ·)
        B, _, Hkv, _, width = gathered.shape
        gathered = gathered.transpose(0, 2, 1, 3, 4).reshape(B, Hkv, n_blocks * P, width)
        dtype = self.dtype if stored else self.compute_dtype
        owned = owned_slots(np.asarray(lengths), S)[:, None, :, None]  # (B, 1, S, 1)
        return np.where(owned, gathered[:, :, :S], 0).astype(dtype, copy=False)  # (B, Hkv, S, ·)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"sequences={len(self._tables)}, free_blocks={self.num_free_blocks}, "
            f"dtype={self.dtype})"
        )
