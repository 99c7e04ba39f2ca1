"""The paged KV cache's bookkeeping, written once for the NumPy and the torch twins.

Dimension legend: B sequences in a call, H query heads, Hkv key/value heads (H
a multiple of Hkv), T new tokens per sequence, S_b keys of sequence b, D head
dim, Dv value head dim, P block size (positions per block), N blocks in the pool.

A paged cache (:mod:`attnlab.fast.paged_cache`) is bookkeeping (the free list
of blocks, each sequence's block table and length, which slot of which block
holds position p, what a call may append, the checks and messages at its
boundary) around a few array operations (allocate the pool, copy a run of
slots, gather a batch's blocks, attend). The bookkeeping is here, once:
:class:`BlockAllocator`, :func:`check_sequence_ids` and :class:`PagedBook`; each
twin (:class:`attnlab.PagedKVCache`, :class:`attnlab.torch.PagedKVCache`)
subclasses :class:`PagedBook` and writes only the array operations it and
:class:`attnlab.fast.cache_book.TwinArrays` leave unimplemented. Nothing here
imports NumPy or torch.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from numbers import Integral
from typing import Any, TypeVar

from ..checks import check_alloc, check_flag, check_positive_int, check_scale, describe
from ..errors import AttnlabError
from ..messages import msg
from ..shapes import check_cache_query_shape, check_kv_shapes
from .cache_book import TwinArrays, check_kv_pair

__all__ = ["BlockAllocator", "PagedBook", "check_sequence_ids"]

#: The array type of a twin: ``numpy.ndarray`` or ``torch.Tensor``.
A = TypeVar("A")


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
            if (not isinstance(block, Integral) or isinstance(block, bool)
                    or not 0 <= block < self.num_blocks):
                raise AttnlabError(msg("paged.block_id", last=self.num_blocks - 1,
                                       got=repr(block)))
            if block in free or block in seen:
                raise AttnlabError(msg("paged.block_free", block=int(block)))
            seen.add(int(block))
        self._free.extend(int(b) for b in reversed(blocks))


def check_sequence_ids(sequences: Any, known: dict[int, list[int]], B: int | None) -> list[int]:
    """``sequences`` as a list of distinct known sequence ids (B of them if B is given)."""
    if isinstance(sequences, Integral) and not isinstance(sequences, bool):
        sequences = [sequences]
    if not isinstance(sequences, (list, tuple)) or not all(
            isinstance(s, Integral) and not isinstance(s, bool) for s in sequences):
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


class PagedBook(TwinArrays[A]):
    """Sequences, block tables and input checks of a paged cache; the array operations
    are the twin's.

    Shapes: a pool of keys (N, Hkv, P, D) and values (N, Hkv, P, Dv) in ``_keys`` and
    ``_values``; per sequence a block table (ceil(S_b / P),) of block indices.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 value_head_dim: int | None, dtype: Any, device: Any) -> None:
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self.block_size = check_positive_int(block_size, "block_size")
        self._set_heads(num_kv_heads, head_dim, value_head_dim, dtype, device)
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.num_blocks, self.num_kv_heads, self.block_size, width), self.dtype,
                        "the block pool (N, Hkv, P, D)", "num_blocks")
        self._keys: Any = self._pool(self.head_dim)  # (N, Hkv, P, D)
        self._values: Any = self._pool(self.value_head_dim)  # (N, Hkv, P, Dv)
        self._allocator = BlockAllocator(self.num_blocks)
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    # ---- what each twin writes besides TwinArrays' operations (A = its array type) ------

    def _check_scores(self, q: A, k: A | None, scale: float) -> None:
        """Refuse q whose scores with the held and the new keys could overflow (NumPy)."""

    @abstractmethod
    def _check_attend_room(self, B: int, H: int, T: int, S: int) -> None: ...

    @abstractmethod
    def _pool(self, width: int) -> A: ...  # -> (N, Hkv, P, width) zeros

    @abstractmethod
    def _index_array(self, blocks: list[int]) -> A: ...  # -> (n,) int64

    @abstractmethod
    def _gather_blocks(self, pool: A, tables: list[list[int]], lengths: Sequence[int], S: int,
                       stored: bool) -> A:
        """The blocks ``tables`` (B, n) of ``pool`` (N, Hkv, P, ·) laid end to end ->
        (B, Hkv, S, ·), slots past ``lengths[b]`` exact zeros, in the compute dtype (the
        storage dtype if ``stored``)."""

    @abstractmethod
    def _attend_grouped(self, q: A, keys: A, values: A, lengths: Sequence[int], T: int,
                        S: int, is_causal: bool, scale: float) -> A:
        """q (B, Hkv, G, T, D) over keys (B, Hkv, S, D), values (B, Hkv, S, Dv), each row's
        query i at position lengths[b] - T + i -> (B, Hkv, G, T, Dv)."""

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

    def block_table(self, sequence: int) -> A:  # -> (ceil(S_b / P),) int64
        """The blocks of ``sequence`` in position order (a copy)."""
        (sequence,) = check_sequence_ids(sequence, self._tables, 1)
        return self._index_array(self._tables[sequence])

    @property
    def num_free_blocks(self) -> int:
        return self._allocator.num_free

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value pools: fixed, whatever is in them."""
        return self._nbytes(self._keys) + self._nbytes(self._values)

    def keys(self, sequence: int) -> A:  # -> (Hkv, S_b, D)
        """A copy of the keys of ``sequence`` in position order."""
        keys: Any = self._gather([self.length(sequence)], [sequence], self._keys, stored=True)
        return keys[0]

    def values(self, sequence: int) -> A:  # -> (Hkv, S_b, Dv)
        """A copy of the values of ``sequence`` in position order."""
        values: Any = self._gather([self.length(sequence)], [sequence], self._values,
                                   stored=True)
        return values[0]

    # ---- writing and attending -----------------------------------------------------

    def append(self, sequences: Any, k: Any, v: Any) -> None:
        """Append T new tokens to each of B sequences: k (B, Hkv, T, D), v (B, Hkv, T, Dv)."""
        k_arr, v_arr = self._check_kv(k, v)
        ids = check_sequence_ids(sequences, self._tables, k_arr.shape[0])  # type: ignore[attr-defined]
        self._write(ids, k_arr, v_arr)

    def attend(
        self, sequences: Any, q: Any, k: Any = None, v: Any = None, *, is_causal: bool = True,
        scale: float | None = None,
    ) -> A:
        """Append each sequence's T new tokens (if k, v are given), then attend over its keys.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv);
        ``sequences``: B sequence ids, one per batch row, each at its own length S_b.

        Query i of row b sits at position S_b - T + i (S_b after the append) and,
        with ``is_causal`` (the default), sees that sequence's keys 0 .. S_b - T + i;
        ``is_causal=False``: all of them. ``k = v = None`` attends without
        appending. Never reads another sequence's keys. See
        :mod:`attnlab.fast.paged_cache` for the plain computation it equals.
        """
        is_causal = check_flag(is_causal, "is_causal")
        check_kv_pair(k, v)
        q_arr: Any = self._as_float(q, "q")
        B = q_arr.shape[0] if q_arr.ndim == 4 else 0
        T = q_arr.shape[2] if q_arr.ndim == 4 else 0
        k_arr: Any = None
        v_arr: Any = None
        if k is not None:
            k_arr, v_arr = self._check_kv(k, v)
            B, T = k_arr.shape[0], k_arr.shape[2]
        H = check_cache_query_shape(q_arr.shape, B, self.num_kv_heads, T, self.head_dim)
        self._check_placed(q_arr, "q")
        self._check_finite([("q", q_arr)])
        q_arr = self._to_compute(q_arr, "q")
        ids = check_sequence_ids(sequences, self._tables, B)
        scale_value = check_scale(scale, self.head_dim)
        self._check_scores(q_arr, k_arr, scale_value)
        lengths = [self._lengths[s] + (0 if k_arr is None else T) for s in ids]  # after it
        S = max(lengths, default=0)
        self._check_attend_room(B, H, T, S)
        if k_arr is not None:
            self._write(ids, k_arr, v_arr)
        keys: Any = self._gather(lengths, ids, self._keys, S)  # (B, Hkv, S, D)
        values: Any = self._gather(lengths, ids, self._values, S)  # (B, Hkv, S, Dv)
        Hkv = self.num_kv_heads
        # (B, Hkv, G, T, D) against (B, Hkv, 1, S, ·): the key/value heads are not repeated.
        out: Any = self._attend_grouped(q_arr.reshape(B, Hkv, H // Hkv, T, self.head_dim),
                                        keys[:, :, None], values[:, :, None], lengths, T, S,
                                        is_causal, scale_value)
        return out.reshape(B, H, T, self.value_head_dim)

    def _check_kv(self, k: Any, v: Any) -> tuple[A, A]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), in the storage dtype."""
        k_arr: Any = self._as_float(k, "k")
        v_arr: Any = self._as_float(v, "v")
        B = k_arr.shape[0] if k_arr.ndim == 4 else 0
        check_kv_shapes(k_arr.shape, v_arr.shape, B, self.num_kv_heads, self.head_dim,
                        self.value_head_dim)
        self._check_placed(k_arr, "k")
        self._check_placed(v_arr, "v")
        self._check_finite([("k", k_arr), ("v", v_arr)])
        return self._to_storage(k_arr, "k"), self._to_storage(v_arr, "v")

    def _write(self, ids: list[int], k: Any, v: Any) -> None:
        """Each row's T tokens at positions S_b .. S_b + T - 1, taking new blocks as needed."""
        T, P = k.shape[2], self.block_size
        needed = [math.ceil((self._lengths[s] + T) / P) - len(self._tables[s]) for s in ids]
        if sum(needed) > self._allocator.num_free:  # refuse before writing anything
            self._allocator.allocate(sum(needed), "k")
        for s, count in zip(ids, needed, strict=True):
            self._tables[s] += self._allocator.allocate(count, "k")
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

    def _gather(self, lengths: Sequence[int], ids: list[int], pool: Any, S: int | None = None,
                *, stored: bool = False) -> A:
        """The first ``lengths[b]`` positions of each sequence from ``pool`` (N, Hkv, P, ·)
        -> (B, Hkv, S, ·), S = the longest unless given; slots past a sequence's length
        (its table padded with block 0, the rest of a reused block) are exact zeros: a NaN
        another sequence wrote there would survive a mask (0 × NaN), so it is never read."""
        lengths = [int(n) for n in lengths]
        S = max(lengths, default=0) if S is None else S
        n_blocks = math.ceil(S / self.block_size)
        tables = [(self._tables[s][:n_blocks] + [0] * n_blocks)[:n_blocks]
                  for s in ids]  # (B, n), padded with block 0
        return self._gather_blocks(pool, tables, lengths, S, stored)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"sequences={len(self._tables)}, free_blocks={self.num_free_blocks}, "
            f"dtype={self.dtype}{self._repr_tail()})"
        )
