"""KV caches for causal decoding in PyTorch; behave identically to :mod:`attnlab.fast.kv_cache`.

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T new tokens, S keys attended to, D head dim, Dv value head dim, W window.

Same semantics as the NumPy twins, tested against them, and the same shape
checks and slot arithmetic (:mod:`attnlab.shapes`):

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

from ..errors import AttnlabError, check_alloc, check_flag, check_positive_int, check_scale
from ..kernel import check_softcap
from ..shapes import (
    check_cache_query_shape,
    check_cache_room,
    check_key_padding_shape,
    check_kv_shapes,
    grown_capacity,
    held_positions,
    ring_segments,
)
from . import debug
from .checks import as_bool_tensor, as_float_tensor, check_sinks_tensor
from .kernel import attend, causal_allowed, window_allowed
from .masks import window_mask

__all__ = ["KVCache", "SlidingWindowKVCache"]


class _CacheBase:
    """Shape bookkeeping and input checks shared by the two caches."""

    _keys: torch.Tensor  # (B, Hkv, capacity or W, D)
    _values: torch.Tensor  # (B, Hkv, capacity or W, Dv)

    def __init__(
        self, batch: int, num_kv_heads: int, head_dim: int, value_head_dim: int | None,
        dtype: Any, device: Any,
    ) -> None:
        self.batch = check_positive_int(batch, "batch")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_head_dim = (
            self.head_dim if value_head_dim is None
            else check_positive_int(value_head_dim, "value_head_dim")
        )
        if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise AttnlabError(f"dtype: expected a torch float dtype, got {dtype!r}")
        self.dtype: torch.dtype = dtype
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage, as the
        #: NumPy twin (which is what torch does on CPU); the storage keeps half the memory.
        self.compute_dtype: torch.dtype = (
            torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._length = 0

    @property
    def length(self) -> int:
        """Number of tokens appended so far = the absolute position of the next token."""
        return self._length

    def __len__(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    def next_positions(self, T: int) -> torch.Tensor:  # -> (T,) int64
        """Absolute positions of the next T tokens: ``length .. length + T - 1`` (for RoPE)."""
        T = check_positive_int(T, "T", allow_zero=True)
        return self._length + torch.arange(T, device=self.device)

    def _check_kv(self, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), detached, in the cache's dtype and device."""
        k_t = as_float_tensor(k, "k")
        v_t = as_float_tensor(v, "v")
        check_kv_shapes(k_t.shape, v_t.shape, self.batch, self.num_kv_heads, self.head_dim,
                        self.value_head_dim)
        for name, t in (("k", k_t), ("v", v_t)):
            self._check_device(t, name)
        if debug.debug_checks_enabled():
            debug.check_finite([("k", k_t), ("v", v_t)])
        return self._cast(k_t, "k"), self._cast(v_t, "v")

    def _check_device(self, t: torch.Tensor, name: str) -> None:
        if t.device != self.device:
            raise AttnlabError(
                f"{name}: expected a tensor on the cache's device {self.device}, got {t.device}"
            )

    def _cast(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """``t`` detached, in the cache's dtype; under debug_checks, refused if a narrowing
        cast would overflow to inf."""
        out = t.detach().to(self.dtype)
        if (debug.debug_checks_enabled() and out.numel()
                and torch.finfo(t.dtype).max > torch.finfo(self.dtype).max
                and not bool(torch.isfinite(out.sum(dtype=torch.float64)))):
            if not bool(torch.isfinite(out).all()):
                largest = float(t.detach().abs().amax())
                raise AttnlabError(
                    f"{name}: values up to {largest:.3g} do not fit the cache's dtype "
                    f"{self.dtype} (largest {torch.finfo(self.dtype).max:.3g})"
                )
        return out

    def _check_q(self, q: Any, T: int | None) -> torch.Tensor:
        """q (B, H, T, D) with H a multiple of Hkv (any T if None), in the compute dtype."""
        q_t = as_float_tensor(q, "q")
        T = q_t.shape[2] if T is None and q_t.ndim == 4 else (T or 0)
        check_cache_query_shape(q_t.shape, self.batch, self.num_kv_heads, T, self.head_dim)
        self._check_device(q_t, "q")
        if debug.debug_checks_enabled():
            debug.check_finite([("q", q_t)])
        if q_t.dtype == self.compute_dtype:
            return q_t
        return q_t.to(self.compute_dtype) if self.compute_dtype != self.dtype else self._cast(
            q_t, "q")

    def _check_scores(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        """Under debug_checks: refuse q whose scores with the held and the new keys could
        overflow, before anything is appended."""
        if debug.debug_checks_enabled():
            debug.check_tensor_score_range(q, k, None, scale, cached=self._held_keys())

    def _held_keys(self) -> torch.Tensor:  # (B, Hkv, n, D), in slot order
        raise NotImplementedError

    def _check_buffer(self, length: int, name: str) -> None:
        """Refuse key/value buffers of ``length`` positions beyond attnlab's size limit."""
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.batch, self.num_kv_heads, length, width), self.dtype,
                        "the cache's buffer (B, Hkv, length, D)", name)

    def _zeros(self, length: int, width: int) -> torch.Tensor:  # -> (B, Hkv, length, width)
        return torch.zeros(self.batch, self.num_kv_heads, length, width,
                           dtype=self.dtype, device=self.device)


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
        keys = keys.repeat_interleave(G, dim=1)  # (B, H, S, D): head h reads h // G
        values = values.repeat_interleave(G, dim=1)  # (B, H, S, Dv)
        return cast(torch.Tensor, attend(q, keys, values, allowed, None, scale, softcap=softcap,
                                          sinks=sinks.to(q.dtype)))  # (B, H, T, Dv)
    rows = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D); head h = g*G + j
    if allowed is not None and G > 1 and allowed.shape[-2] > 1:  # one row broadcasts as is
        reps = (1,) * (allowed.ndim - 2) + (G, 1)
        allowed = allowed.repeat(*reps)  # (..., G*T, S), rows in the order of `rows`
    out = cast(torch.Tensor, attend(rows, keys, values, allowed, None, scale,
                                    softcap=softcap))  # (B, Hkv, G*T, Dv)
    return out.reshape(B, H, T, values.shape[-1])  # (B, H, T, Dv)


class KVCache(_CacheBase):
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
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype, device)
        self.max_len = None if max_len is None else check_positive_int(max_len, "max_len")
        start = self.max_len if self.max_len is not None else check_positive_int(
            capacity, "capacity"
        )
        self._check_buffer(start, "max_len" if self.max_len is not None else "capacity")
        self._keys = self._zeros(start, self.head_dim)  # (B, Hkv, capacity, D)
        self._values = self._zeros(start, self.value_head_dim)  # (B, Hkv, capacity, Dv)
        self._real = torch.ones(self.batch, start, dtype=torch.bool,
                                device=self.device)  # (B, capacity) True = a real token
        self._padded = False  # whether a key_padding with padding was given since the reset

    @property
    def capacity(self) -> int:
        """Positions allocated now (grows unless ``max_len`` is set)."""
        return self._keys.shape[2]

    @property
    def keys(self) -> torch.Tensor:  # (B, Hkv, S, D)
        """View of the cached keys; valid until the next append."""
        return self._keys[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor:  # (B, Hkv, S, Dv)
        """View of the cached values; valid until the next append."""
        return self._values[:, :, : self._length]

    @property
    def key_padding(self) -> torch.Tensor:  # (B, S) bool
        """View: True = a real token, False = padding (e.g. a left-padded prompt)."""
        return self._real[:, : self._length]

    @property
    def lengths(self) -> torch.Tensor:  # (B,) int64
        """Real tokens held per sequence (padding not counted): row b's next RoPE position."""
        return self._real[:, : self._length].sum(dim=1)

    def _held_keys(self) -> torch.Tensor:  # (B, Hkv, S, D)
        return self.keys

    def reset(self) -> None:
        """Forget every token (the storage is kept for reuse)."""
        self._length = 0
        self._padded = False

    def append(self, k: Any, v: Any, *, key_padding: Any = None) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens.

        ``key_padding`` bool (B, T), True = a real token: padding keys are never
        attended to (left-padded prompts of different lengths in one batch).
        """
        k_t, v_t = self._check_kv(k, v)
        self._write(k_t, v_t, self._check_key_padding(key_padding, k_t.shape[2]))

    def _check_key_padding(self, key_padding: Any, T: int) -> torch.Tensor | None:
        """key_padding bool (B, T) for the T new tokens, on the cache's device, or None."""
        if key_padding is None:
            return None
        padding = as_bool_tensor(key_padding, "key_padding")
        check_key_padding_shape(padding.shape, str(padding.dtype), True, (self.batch, T))
        self._check_device(padding, "key_padding")
        return padding

    def _write(self, k: torch.Tensor, v: torch.Tensor,
               key_padding: torch.Tensor | None = None) -> None:
        T = k.shape[2]
        check_cache_room(self._length, T, self.max_len)
        needed = self._length + T
        if needed > self.capacity:
            new_capacity = grown_capacity(self.capacity, needed)
            self._check_buffer(new_capacity, "k")
            keys = self._zeros(new_capacity, self.head_dim)
            values = self._zeros(new_capacity, self.value_head_dim)
            real = torch.ones(self.batch, new_capacity, dtype=torch.bool, device=self.device)
            keys[:, :, : self._length] = self._keys[:, :, : self._length]
            values[:, :, : self._length] = self._values[:, :, : self._length]
            real[:, : self._length] = self._real[:, : self._length]
            self._keys, self._values, self._real = keys, values, real
        self._keys[:, :, self._length : needed] = k
        self._values[:, :, self._length : needed] = v
        if key_padding is None:
            self._real[:, self._length : needed] = True
        else:
            self._real[:, self._length : needed] = key_padding
            # One host read per prompt (not per decoded token, which passes no key_padding).
            self._padded = self._padded or not bool(key_padding.all())
        self._length = needed

    def attend(
        self, q: Any, k: Any = None, v: Any = None, *, key_padding: Any = None,
        is_causal: bool = True, scale: float | None = None, softcap: float | None = None,
        window: Any = None, sinks: Any = None,
    ) -> torch.Tensor:
        """Append the T new tokens' k, v, then attend from their queries over the whole cache.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv),
        key_padding bool (B, T) -> (B, H, T, Dv).

        Query i sits at position ``S - T + i`` (S = length after the append) and,
        with ``is_causal`` (the default), sees keys 0 .. S - T + i: causal,
        bottom-right aligned; ``is_causal=False`` lets the T queries see every key
        held. ``k = v = None`` attends without appending. ``key_padding`` (True =
        a real token) marks the new tokens' padding, never attended to; a query
        that sees no real key gets 0. ``scale`` defaults to 1/√D; ``softcap``,
        ``window`` and ``sinks`` (H,) as in the NumPy twin.
        """
        is_causal = check_flag(is_causal, "is_causal")
        cap = check_softcap(softcap)
        if (k is None) != (v is None):
            raise AttnlabError("k, v: expected both (append, then attend) or neither (attend "
                               f"over the cache as it is), got k {type(k).__name__} and v "
                               f"{type(v).__name__}")
        padding: torch.Tensor | None = None
        if k is None:
            if key_padding is not None:
                raise AttnlabError("key_padding: marks the padding of new tokens; expected "
                                   "None when k and v are None (nothing is appended)")
            q_t = self._check_q(q, None)
            T = q_t.shape[2]
            S = self._length
            k_t = q_t[:, :0]  # nothing new
        else:
            k_t, v_t = self._check_kv(k, v)
            T = k_t.shape[2]
            q_t = self._check_q(q, T)
            padding = self._check_key_padding(key_padding, T)
            S = self._length + T
        scale_value = check_scale(scale, self.head_dim)
        sink_t = check_sinks_tensor(sinks, q_t.shape[:2], q_t)  # before anything is written
        check_alloc((T, S), torch.bool, "the causal mask (T, S)", "q")
        self._check_scores(q_t, k_t, scale_value)
        if k is not None:
            self._write(k_t, v_t, padding)
        # One query at the end of the cache sees every key: no causal mask needed.
        allowed = causal_allowed(T, S, self.device) if is_causal and T > 1 else None  # (T, S)
        if window is not None:
            allowed = window_mask(T, S, window=window, is_causal=is_causal, device=self.device)
        if self._padded:
            real = self._real[:, None, None, :S]  # (B, 1, 1, S)
            allowed = real if allowed is None else (real & allowed)  # (B, 1, T, S)
        return _grouped_attention(q_t, self._keys[:, :, :S], self._values[:, :, :S], allowed,
                                  scale_value, cap, sink_t)  # (B, H, T, Dv)

    def __repr__(self) -> str:
        return (
            f"KVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, length={self._length}, capacity={self.capacity}, "
            f"max_len={self.max_len}, dtype={self.dtype}, device={self.device})"
        )


class SlidingWindowKVCache(_CacheBase):
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
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype, device)
        self.window = check_positive_int(window, "window")
        self._check_buffer(self.window, "window")
        self._keys = self._zeros(self.window, self.head_dim)  # (B, Hkv, W, D)
        self._values = self._zeros(self.window, self.value_head_dim)  # (B, Hkv, W, Dv)

    @property
    def positions(self) -> torch.Tensor:  # (min(length, W),) int64
        """The absolute positions held, in increasing order."""
        held = held_positions(self._length, self.window)
        return torch.arange(held.start, held.stop, device=self.device)

    @property
    def keys(self) -> torch.Tensor:  # (B, Hkv, min(length, W), D)
        """A copy of the held keys in position order."""
        return self._in_order(self._keys)

    @property
    def values(self) -> torch.Tensor:  # (B, Hkv, min(length, W), Dv)
        """A copy of the held values in position order."""
        return self._in_order(self._values)

    def _in_order(self, buffer: torch.Tensor) -> torch.Tensor:  # (B, Hkv, W, ·) -> (B, Hkv, n, ·)
        held = held_positions(self._length, self.window)
        parts = [buffer[:, :, slot : slot + count]
                 for _, slot, count in ring_segments(held.start, held.stop, self.window)]
        return torch.cat(parts, dim=2) if parts else buffer[:, :, :0].clone()

    def _held_keys(self) -> torch.Tensor:  # (B, Hkv, min(length, W), D), slot order
        # Until the buffer is full, positions 0 .. length - 1 sit in slots 0 .. length - 1.
        return self._keys[:, :, : min(self._length, self.window)]

    def reset(self) -> None:
        """Forget every token."""
        self._length = 0

    def append(self, k: Any, v: Any) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens."""
        k_t, v_t = self._check_kv(k, v)
        self._write(k_t, v_t)

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Positions length .. length+T-1 go to their slots; only the last W can survive."""
        T = k.shape[2]
        keep = min(T, self.window)
        start = self._length + T - keep  # the first position that survives
        for offset, slot, count in ring_segments(start, start + keep, self.window):
            first = T - keep + offset  # its index in the chunk
            self._keys[:, :, slot : slot + count] = k[:, :, first : first + count]
            self._values[:, :, slot : slot + count] = v[:, :, first : first + count]
        self._length += T

    def attend(
        self, q: Any, k: Any, v: Any, *, scale: float | None = None,
        softcap: float | None = None, sinks: Any = None,
    ) -> torch.Tensor:
        """Append the T new tokens' k, v, and attend from their queries within the window.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv).

        The query at position p sees keys ``max(0, p - W + 1) .. p``. A single
        new token is written first and attends over the held slots (exactly its
        window, in any order); a chunk of T > 1 attends over the held keys in
        position order followed by the chunk, and is written afterwards. ``softcap``
        and ``sinks`` (H,) as in the NumPy twin.
        """
        cap = check_softcap(softcap)
        k_t, v_t = self._check_kv(k, v)
        T = k_t.shape[2]
        q_t = self._check_q(q, T)
        scale_value = check_scale(scale, self.head_dim)
        sink_t = check_sinks_tensor(sinks, q_t.shape[:2], q_t)  # before anything is written
        self._check_scores(q_t, k_t, scale_value)
        W = self.window
        if T == 1:
            # After writing, the held slots hold positions p - W + 1 .. p: exactly the window.
            self._write(k_t, v_t)
            n = min(self._length, W)
            return _grouped_attention(q_t, self._keys[:, :, :n], self._values[:, :, :n], None,
                                      scale_value, cap, sink_t)  # (B, H, 1, Dv)
        held = held_positions(self._length, W)
        keys = torch.cat([self._in_order(self._keys), k_t], dim=2)  # (B, Hkv, n + T, D)
        values = torch.cat([self._in_order(self._values), v_t], dim=2)  # (B, Hkv, n + T, Dv)
        query_pos = torch.arange(self._length, self._length + T, device=self.device)  # (T,)
        key_pos = torch.arange(held.start, self._length + T, device=self.device)  # (n + T,)
        allowed = window_allowed(query_pos, key_pos, W, True)  # (T, n + T)
        out = _grouped_attention(q_t, keys, values, allowed, scale_value, cap,
                                 sink_t)  # (B, H, T, Dv)
        self._write(k_t, v_t)
        return out

    def __repr__(self) -> str:
        return (
            f"SlidingWindowKVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, window={self.window}, length={self._length}, "
            f"dtype={self.dtype}, device={self.device})"
        )
