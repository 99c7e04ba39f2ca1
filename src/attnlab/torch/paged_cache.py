"""A paged KV cache in PyTorch; behaves identically to :class:`attnlab.PagedKVCache`.

Dimension legend: B sequences in a call, H query heads, Hkv key/value heads, T
new tokens per sequence, S_b keys of sequence b, D head dim, Dv value head dim,
P block size, N blocks in the pool.

One pool of N blocks of P positions (keys (N, Hkv, P, D), values (N, Hkv, P, Dv));
each sequence has a block table, position p in slot ``p mod P`` of block
``table[p // P]``. The bookkeeping (the free list, the block tables, the slot
of each position, the checks and their messages) is the NumPy twin's, written
once (:class:`~attnlab.fast.paged_book.PagedBook`), and so is the mask of each
sequence's keys (:func:`~attnlab.fast.paged_cache.paged_allowed`): both hand out
the same blocks in the same order. This module holds the torch array
operations (those every torch cache shares, the dtypes, device and input
conversions, are :class:`~attnlab.torch.kv_cache.TorchTwinArrays`); attention is
:func:`attnlab.torch.kernel.attend`.

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

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from ..checks import check_alloc
from ..fast.paged_book import PagedBook
from ..fast.paged_cache import owned_slots, paged_allowed
from .kernel import attend
from .kv_cache import TorchTwinArrays

__all__ = ["PagedKVCache"]


class PagedKVCache(PagedBook[torch.Tensor], TorchTwinArrays):
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
        super().__init__(num_blocks, block_size, num_kv_heads, head_dim, value_head_dim,
                         dtype, device)

    def _to_storage(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x.detach().to(self.dtype)

    def _to_compute(self, q: torch.Tensor, name: str) -> torch.Tensor:
        return q.to(self.compute_dtype)

    def _check_attend_room(self, B: int, H: int, T: int, S: int) -> None:
        check_alloc((B, T, S), torch.bool, "the mask (B, T, max S_b)", "q")

    def _pool(self, width: int) -> torch.Tensor:  # -> (N, Hkv, P, width)
        return torch.zeros(self.num_blocks, self.num_kv_heads, self.block_size, width,
                           dtype=self.dtype, device=self.device)

    def _index_array(self, blocks: list[int]) -> torch.Tensor:
        return torch.tensor(blocks, dtype=torch.int64)

    def _gather_blocks(self, pool: torch.Tensor, tables: list[list[int]],
                       lengths: Sequence[int], S: int, stored: bool) -> torch.Tensor:
        n_blocks = len(tables[0]) if tables else 0
        blocks = torch.tensor(tables, dtype=torch.int64).reshape(len(tables), n_blocks)  # (B, n)
        gathered = pool[blocks.to(self.device)]  # (B, n, Hkv, P, ·)
        B, _, Hkv, P, width = gathered.shape
        gathered = gathered.transpose(1, 2).reshape(B, Hkv, n_blocks * P, width)
        owned = torch.from_numpy(owned_slots(np.asarray(lengths), S)).to(
            self.device)[:, None, :, None]  # (B, 1, S, 1)
        out = torch.where(owned, gathered[:, :, :S], 0.0)  # (B, Hkv, S, ·)
        return out if stored else out.to(self.compute_dtype)

    def _attend_grouped(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        lengths: Sequence[int], T: int, S: int, is_causal: bool,
                        scale: float) -> torch.Tensor:
        allowed = torch.from_numpy(paged_allowed(np.asarray(lengths, dtype=np.int64), T, S,
                                                 is_causal).copy()).to(self.device)  # (B, T, S)
        return cast(torch.Tensor, attend(q, keys, values, allowed[:, None, None], None, scale))
