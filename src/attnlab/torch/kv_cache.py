"""KV caches for causal decoding in PyTorch; behave identically to :mod:`attnlab.fast.kv_cache`.

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T new tokens, S keys attended to, D head dim, Dv value head dim, W window.

Same semantics as the NumPy twins, tested against them, and the same
bookkeeping, written once (:mod:`attnlab.fast.cache_book`: lengths, doubling,
left padding, the checks and their messages; :mod:`attnlab.fast.ring_book`: the
ring of W slots); this module holds the torch array operations:

- :class:`KVCache`: appends keys (B, Hkv, T, D) and values (B, Hkv, T, Dv);
  ``attend(q, k, v)`` appends, then attends from the T new queries (positions
  ``length - T .. length - 1``) over everything cached, causal and bottom-right
  aligned (``is_causal=False``: every key held); ``attend(q)`` attends without
  appending; ``key_padding`` (B, T) marks left padding, never attended to
  (``lengths`` counts each row's real tokens). Storage grows by doubling, or is
  fixed by ``max_len`` (appending past it raises).
- :class:`SlidingWindowKVCache`: a rolling buffer of W slots, position i in slot
  ``i mod W``. **W keys including the current token**: the query at position p
  sees keys ``max(0, p - W + 1) .. p``.

The attention itself is :func:`attnlab.torch.kernel.attend` (torch's fused
kernel where it applies). Query head h reads key/value head h // (H / Hkv); the
heads of a group are stacked as rows of one product, the keys are not repeated.

Checks: shapes, dtypes and devices always; under
:func:`attnlab.torch.debug_checks` also NaN/Inf in q, k, v, values too large
for the cache's dtype, and scores against the held keys that could overflow
(all before anything is appended).

The caches are for inference: keys and values are stored detached (gradients
flow to the queries of the current call only). Use the full forward to train.

``dtype=torch.float16`` or ``torch.bfloat16`` stores keys and values in half the
memory; attention is computed in float32 (``compute_dtype``) and returned in
float32, as by the NumPy twins.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from ..checks import check_alloc
from ..errors import AttnlabError
from ..fast.cache_book import CacheBook, GrowingBook, TwinArrays
from ..fast.ring_book import RingBook
from . import debug
from .checks import as_bool_tensor, as_float_tensor, check_sinks_tensor
from .gqa import repeat_kv
from .kernel import attend, causal_allowed
from .masks import window_mask

__all__ = ["KVCache", "SlidingWindowKVCache", "TorchTwinArrays"]


def _grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor | None,
    scale: float, softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Shapes: q (B, H, T, D), keys (B, Hkv, S, D), values (B, Hkv, S, Dv),
    allowed bool (T, S), (B, 1, T, S) or None, sinks (H,) or None -> (B, H, T, Dv).

    With sinks the G = H / Hkv query heads of a group each get their own copy of the
    group's keys and values (the kernel takes one sink per head of q)."""
    B, H, T, D = q.shape
    Hkv = keys.shape[1]
    G = H // Hkv
    if keys.dtype != q.dtype:  # float16 / bfloat16 storage, computed in float32
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    if sinks is not None:
        keys = repeat_kv(keys, G)  # (B, H, S, D): head h reads h // G
        values = repeat_kv(values, G)  # (B, H, S, Dv)
        return cast(torch.Tensor, attend(q, keys, values, allowed, None, scale, softcap=softcap,
                                          sinks=sinks.to(q.dtype)))  # (B, H, T, Dv)
    rows = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D); head h = g*G + j
    if allowed is not None and G > 1 and allowed.shape[-2] > 1:  # one row broadcasts as is
        reps = (1,) * (allowed.ndim - 2) + (G, 1)
        allowed = allowed.repeat(*reps)  # (..., G*T, S), rows in the order of `rows`
    out = cast(torch.Tensor, attend(rows, keys, values, allowed, None, scale,
                                    softcap=softcap))  # (B, Hkv, G*T, Dv)
    return out.reshape(B, H, T, values.shape[-1])  # (B, H, T, Dv)


class TorchTwinArrays(TwinArrays[torch.Tensor]):
    """What every torch cache (these and :class:`attnlab.torch.PagedKVCache`) does alike
    with its tensors: the dtypes and device, the conversion of inputs and their checks,
    the size."""

    def _set_dtype(self, dtype: Any, device: Any) -> None:
        if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise AttnlabError(f"dtype: expected a torch float dtype, got {dtype!r}")
        self.dtype: torch.dtype = dtype
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage, as the
        #: NumPy twin (which is what torch does on CPU); the storage keeps half the memory.
        self.compute_dtype: torch.dtype = (
            torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
        self.device = torch.device("cpu") if device is None else torch.device(device)

    def _as_float(self, x: Any, name: str) -> torch.Tensor:
        return as_float_tensor(x, name)

    def _check_placed(self, x: torch.Tensor, name: str) -> None:
        if x.device != self.device:
            raise AttnlabError(
                f"{name}: expected a tensor on the cache's device {self.device}, got {x.device}"
            )

    def _check_finite(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if debug.debug_checks_enabled():
            debug.check_finite(named)

    def _nbytes(self, x: torch.Tensor) -> int:
        return x.numel() * x.element_size()

    def _repr_tail(self) -> str:
        return f", device={self.device}"


class _TorchArrays(CacheBook[torch.Tensor], TorchTwinArrays):
    """The torch array operations of the caches; the bookkeeping is
    :mod:`attnlab.fast.cache_book`'s and :mod:`attnlab.fast.ring_book`'s."""

    def _as_bool(self, x: Any, name: str) -> torch.Tensor:
        return as_bool_tensor(x, name)

    def _to_storage(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` detached, in the cache's dtype; under debug_checks, refused if a narrowing
        cast would overflow to inf."""
        out = x.detach().to(self.dtype)
        if (debug.debug_checks_enabled() and out.numel()
                and torch.finfo(x.dtype).max > torch.finfo(self.dtype).max
                and not bool(torch.isfinite(out.sum(dtype=torch.float64)))):
            if not bool(torch.isfinite(out).all()):
                largest = float(x.detach().abs().amax())
                raise AttnlabError(
                    f"{name}: values up to {largest:.3g} do not fit the cache's dtype "
                    f"{self.dtype} (largest {torch.finfo(self.dtype).max:.3g})"
                )
        return out

    def _to_compute(self, q: torch.Tensor, name: str) -> torch.Tensor:
        if q.dtype == self.compute_dtype:
            return q
        return q.to(self.compute_dtype) if self.compute_dtype != self.dtype else \
            self._to_storage(q, name)

    def _check_sinks(self, sinks: Any, q: torch.Tensor) -> torch.Tensor | None:
        return check_sinks_tensor(sinks, q.shape[:2], q)

    def _check_scores(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        """Under debug_checks: refuse q whose scores with the held and the new keys could
        overflow, before anything is appended."""
        if debug.debug_checks_enabled():
            debug.check_tensor_score_range(q, k, None, scale, cached=self._held_keys())

    def _check_attend_room(self, q: torch.Tensor, S: int) -> None:
        check_alloc((q.shape[2], S), torch.bool, "the causal mask (T, S)", "q")

    def _zeros(self, length: int, width: int) -> torch.Tensor:
        return torch.zeros(self.batch, self.num_kv_heads, length, width,
                           dtype=self.dtype, device=self.device)

    def _ones_bool(self, length: int) -> torch.Tensor:
        return torch.ones(self.batch, length, dtype=torch.bool, device=self.device)

    def _arange(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, device=self.device)

    def _concat(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=2)

    def _copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def _row_sums(self, real: torch.Tensor) -> torch.Tensor:
        return real.sum(dim=1)

    def _causal(self, T: int, S: int) -> torch.Tensor:
        return causal_allowed(T, S, self.device)

    def _window(self, T: int, S: int, window: Any, is_causal: bool) -> torch.Tensor:
        return window_mask(T, S, window=window, is_causal=is_causal, device=self.device)

    def _grouped(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 allowed: torch.Tensor | None, scale: float, softcap: float | None,
                 sinks: Any) -> torch.Tensor:
        return _grouped_attention(q, keys, values, allowed, scale, softcap, sinks)


class KVCache(GrowingBook[torch.Tensor], _TorchArrays):
    """Keys and values of one attention layer for causal decoding, with MHA or GQA;
    behaves identically to :class:`attnlab.KVCache`.

    Shapes: stores keys (B, Hkv, S, D) and values (B, Hkv, S, Dv).

    >>> cache = KVCache(1, 2, 4, max_len=8)
    >>> q, k = torch.ones(1, 4, 3, 4), torch.ones(1, 2, 3, 4)
    >>> cache.attend(q, k, k).shape
    torch.Size([1, 4, 3, 4])
    >>> cache.length
    3
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
        *,
        max_len: int | None = None,
        capacity: int = 256,
        dtype: torch.dtype = torch.float32,
        device: Any = None,
    ) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, max_len=max_len,
                         capacity=capacity, dtype=dtype, device=device)


class SlidingWindowKVCache(RingBook[torch.Tensor], _TorchArrays):
    """Rolling-buffer KV cache for sliding-window attention, memory O(W); behaves
    identically to :class:`attnlab.SlidingWindowKVCache`.

    **W = the number of keys each query sees, including itself**: the query at
    position p attends to keys ``max(0, p - W + 1) .. p``, the band of
    :func:`attnlab.torch.sliding_window_mask` with ``is_causal=True``. Position i
    lives in slot ``i mod W``; the buffer holds the last ``min(length, W)`` positions.

    >>> cache = SlidingWindowKVCache(1, 1, 2, window=3)
    >>> _ = cache.attend(torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
    >>> cache.positions.tolist()
    [2, 3, 4]
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
        *,
        window: int,
        dtype: torch.dtype = torch.float32,
        device: Any = None,
    ) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, window=window,
                         dtype=dtype, device=device)
