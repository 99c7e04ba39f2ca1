"""A paged KV cache in PyTorch; behaves identically to :class:`attnlab.PagedKVCache`.

Dimension legend: B sequences in a call, H query heads, Hkv key/value heads, T
new tokens per sequence, S_b keys of sequence b, D head dim, Dv value head dim,
P block size, N blocks in the pool.

One pool of N blocks of P positions (keys (N, Hkv, P, D), values (N, Hkv, P, Dv));
each sequence has a block table, position p in slot ``p mod P`` of block
``table[p // P]``. The free list, the sequence-id checks and the mask of each
sequence's keys are the NumPy twin's (:class:`~attnlab.fast.paged_cache.BlockAllocator`,
:func:`~attnlab.fast.paged_cache.paged_allowed`), so both hand out the same
blocks in the same order. Attention is :func:`attnlab.torch.kernel.attend`.

As the other torch caches, keys and values are stored detached: for inference.

One rule for both twins: a sequence never reads a slot it does not own. The
slots a shorter sequence is gathered with (its table padded with block 0, the
rest of a reused block) are exact zeros, so that a NaN or inf another sequence
wrote can reach no one else (tested with NaN and ±inf in block 0, a freed and
reused block and a batched sequence). What each twin accepts is its own
convention: the NumPy twin refuses non-finite keys and values when appended,
this one stores them as torch does and checks them under
:func:`attnlab.torch.debug_checks`; either way they reach only their owner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from ..errors import AttnlabError, check_alloc, check_flag, check_positive_int, check_scale
from ..fast.paged_cache import BlockAllocator, check_sequence_ids, owned_slots, paged_allowed
from ..shapes import check_cache_query_shape, check_kv_shapes
from . import debug
from .checks import as_float_tensor
from .kernel import attend

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Keys and values of many sequences in one pool of fixed-size blocks, with block tables;
    behaves identically to :class:`attnlab.PagedKVCache`.

    >>> cache = PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=2)
    >>> a = cache.add_sequence()
    >>> cache.append([a], torch.ones(1, 1, 6, 2), torch.ones(1, 1, 6, 2))
    >>> cache.block_table(a).tolist(), cache.length(a)
    ([0, 1], 6)
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: Any = None,
    ) -> None:
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self.block_size = check_positive_int(block_size, "block_size")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_head_dim = (
            self.head_dim if value_head_dim is None
            else check_positive_int(value_head_dim, "value_head_dim")
        )
        if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise AttnlabError(f"dtype: expected a torch float dtype, got {dtype!r}")
        self.dtype: torch.dtype = dtype
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage.
        self.compute_dtype: torch.dtype = (
            torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.num_blocks, self.num_kv_heads, self.block_size, width), self.dtype,
                        "the block pool (N, Hkv, P, D)", "num_blocks")
        self._keys = torch.zeros(self.num_blocks, self.num_kv_heads, self.block_size,
                                 self.head_dim, dtype=dtype, device=self.device)  # (N, Hkv, P, D)
        self._values = torch.zeros(self.num_blocks, self.num_kv_heads, self.block_size,
                                   self.value_head_dim, dtype=dtype,
                                   device=self.device)  # (N, Hkv, P, Dv)
        self._allocator = BlockAllocator(self.num_blocks)
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

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

    def block_table(self, sequence: int) -> torch.Tensor:  # -> (ceil(S_b / P),) int64
        """The blocks of ``sequence`` in position order (a copy)."""
        (sequence,) = check_sequence_ids(sequence, self._tables, 1)
        return torch.tensor(self._tables[sequence], dtype=torch.int64)

    @property
    def num_free_blocks(self) -> int:
        return self._allocator.num_free

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value pools: fixed, whatever is in them."""
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    def keys(self, sequence: int) -> torch.Tensor:  # -> (Hkv, S_b, D)
        """A copy of the keys of ``sequence`` in position order."""
        return self._gather([self.length(sequence)], [sequence], self._keys)[0]

    def values(self, sequence: int) -> torch.Tensor:  # -> (Hkv, S_b, Dv)
        """A copy of the values of ``sequence`` in position order."""
        return self._gather([self.length(sequence)], [sequence], self._values)[0]

    # ---- writing and attending -----------------------------------------------------

    def append(self, sequences: Any, k: Any, v: Any) -> None:
        """Append T new tokens to each of B sequences: k (B, Hkv, T, D), v (B, Hkv, T, Dv)."""
        k_t, v_t = self._check_kv(k, v)
        ids = check_sequence_ids(sequences, self._tables, k_t.shape[0])
        self._write(ids, k_t, v_t)

    def attend(
        self, sequences: Any, q: Any, k: Any = None, v: Any = None, *, is_causal: bool = True,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Append each sequence's T new tokens (if k, v are given), then attend over its keys.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv);
        ``sequences``: B sequence ids, one per batch row, each at its own length S_b.
        Query i of row b sits at position S_b - T + i and, with ``is_causal``, sees
        that sequence's keys 0 .. S_b - T + i (all of them otherwise). ``k = v =
        None`` attends without appending.
        """
        is_causal = check_flag(is_causal, "is_causal")
        if (k is None) != (v is None):
            raise AttnlabError("k, v: expected both (append, then attend) or neither (attend "
                               f"over the cache as it is), got k {type(k).__name__} and v "
                               f"{type(v).__name__}")
        q_t = as_float_tensor(q, "q")
        B = q_t.shape[0] if q_t.ndim == 4 else 0
        T = q_t.shape[2] if q_t.ndim == 4 else 0
        k_t = v_t = None
        if k is not None:
            k_t, v_t = self._check_kv(k, v)
            B, T = k_t.shape[0], k_t.shape[2]
        check_cache_query_shape(q_t.shape, B, self.num_kv_heads, T, self.head_dim)
        if q_t.device != self.device:
            raise AttnlabError(f"q: expected a tensor on the cache's device {self.device}, "
                               f"got {q_t.device}")
        if debug.debug_checks_enabled():
            debug.check_finite([("q", q_t)])
        q_t = q_t.to(self.compute_dtype)
        ids = check_sequence_ids(sequences, self._tables, B)
        scale_value = check_scale(scale, self.head_dim)
        lengths = np.array([self._lengths[s] + (0 if k_t is None else T) for s in ids],
                           dtype=np.int64)  # (B,) after the append
        S = int(lengths.max()) if B else 0
        check_alloc((B, T, S), torch.bool, "the mask (B, T, max S_b)", "q")
        if k_t is not None and v_t is not None:
            self._write(ids, k_t, v_t)
        keys = self._gather(lengths, ids, self._keys, S).to(self.compute_dtype)  # (B, Hkv, S, D)
        values = self._gather(lengths, ids, self._values, S).to(
            self.compute_dtype)  # (B, Hkv, S, Dv)
        allowed = torch.from_numpy(paged_allowed(lengths, T, S, is_causal).copy()).to(
            self.device)  # (B, T, S)
        H, Hkv = q_t.shape[1], self.num_kv_heads
        G = H // Hkv
        # (B, Hkv, G, T, D) against (B, Hkv, 1, S, ·): the key/value heads are not repeated.
        out = cast(torch.Tensor, attend(q_t.reshape(B, Hkv, G, T, self.head_dim),
                                        keys[:, :, None], values[:, :, None],
                                        allowed[:, None, None], None, scale_value))
        return out.reshape(B, H, T, self.value_head_dim)  # (B, H, T, Dv)

    def _check_kv(self, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), detached, in the cache's dtype and device."""
        k_t = as_float_tensor(k, "k")
        v_t = as_float_tensor(v, "v")
        B = k_t.shape[0] if k_t.ndim == 4 else 0
        check_kv_shapes(k_t.shape, v_t.shape, B, self.num_kv_heads, self.head_dim,
                        self.value_head_dim)
        for name, t in (("k", k_t), ("v", v_t)):
            if t.device != self.device:
                raise AttnlabError(f"{name}: expected a tensor on the cache's device "
                                   f"{self.device}, got {t.device}")
        if debug.debug_checks_enabled():
            debug.check_finite([("k", k_t), ("v", v_t)])
        return k_t.detach().to(self.dtype), v_t.detach().to(self.dtype)

    def _write(self, ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
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

    def _gather(self, lengths: Sequence[int] | np.ndarray, ids: list[int], pool: torch.Tensor,
                S: int | None = None) -> torch.Tensor:
        """The first ``lengths[b]`` positions of each sequence from ``pool`` (N, Hkv, P, ·)
        -> (B, Hkv, S, ·); slots past a sequence's length (padding with block 0, the
        rest of a reused block) are exact zeros: a NaN another sequence wrote there
        would survive the caller's mask (0 × NaN), so it is never read."""
        P = self.block_size
        S = int(max(lengths, default=0)) if S is None else S
        n_blocks = math.ceil(S / P)
        tables = torch.zeros(len(ids), n_blocks, dtype=torch.int64)  # (B, n), padded with 0
        for row, s in enumerate(ids):
            table = self._tables[s][:n_blocks]
            tables[row, : len(table)] = torch.tensor(table, dtype=torch.int64)
        gathered = pool[tables.to(self.device)]  # (B, n, Hkv, P, ·)
        B, _, Hkv, _, width = gathered.shape
        gathered = gathered.transpose(1, 2).reshape(B, Hkv, n_blocks * P, width)
        owned = torch.from_numpy(owned_slots(np.asarray(lengths), S)).to(
            self.device)[:, None, :, None]  # (B, 1, S, 1)
        return torch.where(owned, gathered[:, :, :S], 0.0)  # (B, Hkv, S, ·)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"sequences={len(self._tables)}, free_blocks={self.num_free_blocks}, "
            f"dtype={self.dtype}, device={self.device})"
        )
