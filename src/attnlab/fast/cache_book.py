"""The KV caches' bookkeeping, written once for the NumPy and the torch twins.

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T new tokens, S keys attended to, D head dim, Dv value head dim, W window.

A KV cache is bookkeeping (how many positions it holds, which slot holds which
position, when its storage grows, what a call may append, which keys a query
sees, the checks and messages at its boundary) around a few array operations
(allocate, copy a slice, concatenate, attend). The bookkeeping is here, once:

- :class:`CacheBook`: sizes, length, the checks of q, k, v and key_padding;
- :class:`GrowingBook`: the full cache (doubling storage, or fixed by
  ``max_len``; left padding marked per row), :class:`attnlab.KVCache`;
- :class:`attnlab.fast.ring_book.RingBook`: the sliding window, a ring of W
  slots holding position i in slot ``i mod W``, :class:`attnlab.SlidingWindowKVCache`.

Each twin (:mod:`attnlab.fast.kv_cache`, :mod:`attnlab.torch.kv_cache`)
subclasses these and writes only the array operations :class:`CacheBook`
leaves unimplemented, as einops keeps one algorithm and a thin adapter per
framework; the slot arithmetic itself is :mod:`attnlab.shapes`. Nothing here
imports NumPy or torch: arrays are only indexed, sliced and handed back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from ..checks import check_alloc, check_flag, check_positive_int, check_scale
from ..errors import AttnlabError
from ..kernel_options import check_softcap
from ..shapes import (
    check_cache_query_shape,
    check_cache_room,
    check_key_padding_shape,
    check_kv_shapes,
    grown_capacity,
)

__all__ = ["CacheBook", "GrowingBook", "TwinArrays", "check_kv_pair"]

#: The array type of a twin: ``numpy.ndarray`` or ``torch.Tensor``.
A = TypeVar("A")


def check_kv_pair(k: Any, v: Any) -> None:
    """k and v of an attend call: both (append, then attend) or neither."""
    if (k is None) != (v is None):
        raise AttnlabError("k, v: expected both (append, then attend) or neither (attend "
                           f"over the cache as it is), got k {type(k).__name__} and v "
                           f"{type(v).__name__}")


class TwinArrays(ABC, Generic[A]):
    """The head sizes of a cache, and what each twin supplies about its arrays: the dtypes,
    the conversions of its inputs, their device, their size (also
    :class:`attnlab.fast.paged_book.PagedBook`'s)."""

    dtype: Any  # the storage dtype, set by _set_dtype
    compute_dtype: Any

    def _set_heads(self, num_kv_heads: int, head_dim: int, value_head_dim: int | None,
                   dtype: Any, device: Any) -> None:
        """Check and set the head sizes (Dv = D unless given), then the dtypes and device."""
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_head_dim = (
            self.head_dim if value_head_dim is None
            else check_positive_int(value_head_dim, "value_head_dim")
        )
        self._set_dtype(dtype, device)

    @abstractmethod
    def _set_dtype(self, dtype: Any, device: Any) -> None:
        """Check and set ``dtype`` (storage) and ``compute_dtype`` (and the device)."""

    @abstractmethod
    def _as_float(self, x: Any, name: str) -> A: ...  # or raise naming `name`

    def _check_placed(self, x: A, name: str) -> None:
        """Refuse an array on another device than the cache's (torch)."""

    def _check_finite(self, named: list[tuple[str, A]]) -> None:
        """Refuse NaN/Inf where the twin looks at values (torch: under debug_checks)."""

    @abstractmethod
    def _to_storage(self, x: A, name: str) -> A: ...  # refused if the cast overflows

    @abstractmethod
    def _to_compute(self, q: A, name: str) -> A: ...

    @abstractmethod
    def _nbytes(self, x: A) -> int: ...

    def _repr_tail(self) -> str:
        return ""  # the torch twins add their device


class CacheBook(TwinArrays[A]):
    """Sizes, length and input checks of a KV cache; the array operations are the twin's.

    Shapes: stores keys (B, Hkv, ·, D) and values (B, Hkv, ·, Dv) in ``_keys`` and
    ``_values``.
    """

    _keys: Any  # (B, Hkv, capacity or W, D)
    _values: Any  # (B, Hkv, capacity or W, Dv)

    def __init__(self, batch: int, num_kv_heads: int, head_dim: int,
                 value_head_dim: int | None, dtype: Any, device: Any) -> None:
        self.batch = check_positive_int(batch, "batch")
        self._set_heads(num_kv_heads, head_dim, value_head_dim, dtype, device)
        self._length = 0

    # ---- what each twin writes: its array operations (A = its array type) ------------

    @abstractmethod
    def _as_bool(self, x: Any, name: str) -> A: ...  # True = a real token

    @abstractmethod
    def _check_sinks(self, sinks: Any, q: A) -> Any: ...  # (H,) for q (B, H, T, D)

    @abstractmethod
    def _check_scores(self, q: A, k: A, scale: float) -> None:
        """Refuse q whose scores with the held and the new keys k could overflow."""

    @abstractmethod
    def _check_attend_room(self, q: A, S: int) -> None: ...  # q over S keys fits the limit

    @abstractmethod
    def _zeros(self, length: int, width: int) -> A: ...  # -> (B, Hkv, length, width)

    @abstractmethod
    def _ones_bool(self, length: int) -> A: ...  # -> (B, length), all True

    @abstractmethod
    def _arange(self, start: int, stop: int) -> A: ...  # -> (stop - start,) int64

    @abstractmethod
    def _concat(self, parts: list[A]) -> A: ...  # along the position axis, 2

    @abstractmethod
    def _copy(self, x: A) -> A: ...

    def _view(self, x: A) -> A:
        """What a property hands out of a buffer (NumPy: a read-only view)."""
        return x

    @abstractmethod
    def _row_sums(self, real: A) -> A: ...  # (B, S) bool -> (B,) int64

    @abstractmethod
    def _causal(self, T: int, S: int) -> A: ...  # -> (T, S) bool, bottom-right aligned

    @abstractmethod
    def _window(self, T: int, S: int, window: Any, is_causal: bool) -> A: ...  # -> (T, S)

    @abstractmethod
    def _grouped(self, q: A, keys: A, values: A, allowed: A | None, scale: float,
                 softcap: float | None, sinks: Any) -> A:
        """Attention of H query heads over Hkv key/value heads: q (B, H, T, D),
        keys (B, Hkv, S, D), values (B, Hkv, S, Dv), allowed (T, S), (B, 1, T, S)
        or None -> (B, H, T, Dv)."""

    @abstractmethod
    def _held_keys(self) -> A: ...  # (B, Hkv, n, D) in slot order: the book's

    # ---- the bookkeeping ----------------------------------------------------------

    @property
    def length(self) -> int:
        """Number of tokens appended so far = the absolute position of the next token."""
        return self._length

    def __len__(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        return self._nbytes(self._keys) + self._nbytes(self._values)

    def next_positions(self, T: int) -> A:  # -> (T,) int64
        """Absolute positions of the next T tokens: ``length .. length + T - 1`` (for RoPE)."""
        T = check_positive_int(T, "T", allow_zero=True)
        return self._arange(self._length, self._length + T)

    def _check_kv(self, k: Any, v: Any) -> tuple[A, A]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), in the cache's dtype."""
        k_arr, v_arr = self._as_float(k, "k"), self._as_float(v, "v")
        check_kv_shapes(k_arr.shape, v_arr.shape,  # type: ignore[attr-defined]
                        self.batch, self.num_kv_heads, self.head_dim, self.value_head_dim)
        self._check_placed(k_arr, "k")
        self._check_placed(v_arr, "v")
        self._check_finite([("k", k_arr), ("v", v_arr)])
        return self._to_storage(k_arr, "k"), self._to_storage(v_arr, "v")

    def _check_q(self, q: Any, T: int | None) -> A:
        """q (B, H, T, D) with H a multiple of Hkv (any T if None), in the compute dtype."""
        q_arr: Any = self._as_float(q, "q")
        T = q_arr.shape[2] if T is None and q_arr.ndim == 4 else (T or 0)
        check_cache_query_shape(q_arr.shape, self.batch, self.num_kv_heads, T, self.head_dim)
        self._check_placed(q_arr, "q")
        self._check_finite([("q", q_arr)])
        return self._to_compute(q_arr, "q")

    def _check_buffer(self, length: int, name: str) -> None:
        """Refuse key/value buffers of ``length`` positions beyond attnlab's size limit."""
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.batch, self.num_kv_heads, length, width), self.dtype,
                        "the cache's buffer (B, Hkv, length, D)", name)

    def _check_call(self, q: Any, k: Any, v: Any, scale: float | None, sinks: Any, *,
                    optional_kv: bool) -> tuple[A, A, Any, int, float, Any]:
        """The checked q, k, v, T, scale and sinks of an attend call; with ``optional_kv``,
        k = v = None attend without appending (k comes back empty, v None)."""
        if optional_kv:
            check_kv_pair(k, v)
        v_arr: Any
        if optional_kv and k is None:
            q_arr: Any = self._check_q(q, None)
            T = q_arr.shape[2]
            k_arr, v_arr = q_arr[:, :0], None  # nothing new
        else:
            k_arr, v_arr = self._check_kv(k, v)
            T = k_arr.shape[2]  # type: ignore[attr-defined]
            q_arr = self._check_q(q, T)
        scale_value = check_scale(scale, self.head_dim)
        sink_logits = self._check_sinks(sinks, q_arr)  # before anything is written
        return q_arr, k_arr, v_arr, T, scale_value, sink_logits

    def __repr__(self) -> str:
        sizes = self._repr_sizes()
        return (
            f"{type(self).__name__}(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, {sizes}, dtype={self.dtype}{self._repr_tail()})"
        )

    @abstractmethod
    def _repr_sizes(self) -> str: ...


class GrowingBook(CacheBook[A]):
    """The full cache: every position kept, storage doubling or fixed by ``max_len``.

    Shapes: keys (B, Hkv, capacity, D), values (B, Hkv, capacity, Dv), and
    ``_real`` (B, capacity) bool, True = a real token (False = left padding).
    """

    def __init__(self, batch: int, num_kv_heads: int, head_dim: int,
                 value_head_dim: int | None, *, max_len: int | None, capacity: int,
                 dtype: Any, device: Any) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype, device)
        self.max_len = None if max_len is None else check_positive_int(max_len, "max_len")
        start = self.max_len if self.max_len is not None else check_positive_int(
            capacity, "capacity"
        )
        self._check_buffer(start, "max_len" if self.max_len is not None else "capacity")
        self._keys = self._zeros(start, self.head_dim)  # (B, Hkv, capacity, D)
        self._values = self._zeros(start, self.value_head_dim)  # (B, Hkv, capacity, Dv)
        self._real: Any = self._ones_bool(start)  # (B, capacity) True = a real token
        self._padded = False  # whether a key_padding with padding was given since the reset

    @property
    def capacity(self) -> int:
        """Positions allocated now (grows unless ``max_len`` is set)."""
        return int(self._keys.shape[2])

    @property
    def keys(self) -> A:  # (B, Hkv, S, D)
        """View of the cached keys (read-only in NumPy); valid until the next append."""
        return self._view(self._keys[:, :, : self._length])

    @property
    def values(self) -> A:  # (B, Hkv, S, Dv)
        """View of the cached values (read-only in NumPy); valid until the next append."""
        return self._view(self._values[:, :, : self._length])

    @property
    def key_padding(self) -> A:  # (B, S) bool
        """View: True = a real token, False = padding (e.g. a left-padded prompt)."""
        return self._view(self._real[:, : self._length])

    @property
    def lengths(self) -> A:  # (B,) int64
        """Real tokens held per sequence (padding not counted).

        With left-padded prompts each row has its own length: ``lengths[b]`` is
        the RoPE position of row b's next token (Hugging Face's
        ``attention_mask.cumsum(-1) - 1``), where :meth:`next_positions` gives
        the slots, shared by the batch.
        """
        return self._row_sums(self._real[:, : self._length])

    def _held_keys(self) -> A:  # (B, Hkv, S, D)
        return self._keys[:, :, : self._length]

    def _repr_sizes(self) -> str:
        return f"length={self._length}, capacity={self.capacity}, max_len={self.max_len}"

    def reset(self) -> None:
        """Forget every token (the storage is kept for reuse)."""
        self._length = 0
        self._padded = False

    def append(self, k: Any, v: Any, *, key_padding: Any = None) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens.

        ``key_padding`` bool (B, T), True = a real token: padding keys are never
        attended to (left-padded prompts of different lengths in one batch).
        """
        k_arr, v_arr = self._check_kv(k, v)
        T = k_arr.shape[2]  # type: ignore[attr-defined]
        self._write(k_arr, v_arr, self._check_key_padding(key_padding, T))

    def _check_key_padding(self, key_padding: Any, T: int) -> A | None:
        """key_padding bool (B, T) for the T new tokens, or None (all real)."""
        if key_padding is None:
            return None
        padding: Any = self._as_bool(key_padding, "key_padding")
        check_key_padding_shape(padding.shape, str(padding.dtype), True, (self.batch, T))
        self._check_placed(padding, "key_padding")
        return padding

    def _write(self, k: Any, v: Any, key_padding: Any = None) -> None:
        T = k.shape[2]
        check_cache_room(self._length, T, self.max_len)
        needed = self._length + T
        if needed > self.capacity:
            self._grow(needed)
        self._keys[:, :, self._length : needed] = k
        self._values[:, :, self._length : needed] = v
        if key_padding is None:
            self._real[:, self._length : needed] = True
        else:
            self._real[:, self._length : needed] = key_padding
            # One host read per prompt (not per decoded token, which passes no key_padding).
            self._padded = self._padded or not bool(key_padding.all())
        self._length = needed

    def _grow(self, needed: int) -> None:
        """Double the capacity until ``needed`` positions fit; copies the cached part once."""
        new_capacity = grown_capacity(self.capacity, needed)
        self._check_buffer(new_capacity, "k")
        held = self._length
        keys: Any = self._zeros(new_capacity, self.head_dim)  # (B, Hkv, capacity, D)
        values: Any = self._zeros(new_capacity, self.value_head_dim)  # (B, Hkv, capacity, Dv)
        real: Any = self._ones_bool(new_capacity)  # (B, capacity)
        keys[:, :, :held] = self._keys[:, :, :held]
        values[:, :, :held] = self._values[:, :, :held]
        real[:, :held] = self._real[:, :held]
        self._keys, self._values, self._real = keys, values, real

    def attend(
        self, q: Any, k: Any = None, v: Any = None, *, key_padding: Any = None,
        is_causal: bool = True, scale: float | None = None, softcap: float | None = None,
        window: Any = None, sinks: Any = None,
    ) -> A:
        """Append the T new tokens' k, v, then attend from their queries over the whole cache.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv),
        key_padding bool (B, T) -> (B, H, T, Dv).

        Query i sits at position ``S - T + i`` (S = length after the append) and,
        with ``is_causal`` (the default), sees keys 0 .. S - T + i: causal,
        bottom-right aligned. ``is_causal=False`` lets the T queries see every
        key held, the chunk's own later keys included (a bidirectional chunk,
        e.g. a prefix). ``k = v = None`` attends without appending: q's T
        queries are taken to be the last T positions held (or, not causal, to
        see all of them). ``key_padding`` (True = a real token) marks the new
        tokens' padding, never attended to from then on; a query that sees no
        real key gets 0. ``scale`` defaults to 1/√D; ``softcap``, ``window`` (an
        int W or (left, right), cut at the query when causal) and ``sinks`` (H,), one
        logit per query head, mean what they mean in
        :func:`attnlab.scaled_dot_product_attention`.

        Equals :func:`attnlab.scaled_dot_product_attention` over the whole
        sequence with ``mask = key_padding[:, None, None, :]`` (all of it so far),
        ``is_causal``, ``softcap``, ``window`` and ``sinks``, at the last T queries.
        """
        is_causal = check_flag(is_causal, "is_causal")
        cap = check_softcap(softcap)
        if k is None and v is None and key_padding is not None:
            raise AttnlabError("key_padding: marks the padding of new tokens; expected "
                               "None when k and v are None (nothing is appended)")
        q_arr, k_arr, v_arr, T, scale_value, sink_logits = self._check_call(
            q, k, v, scale, sinks, optional_kv=True)
        padding = None if v_arr is None else self._check_key_padding(key_padding, T)
        S = self._length + (0 if v_arr is None else T)
        self._check_attend_room(q_arr, S)
        self._check_scores(q_arr, k_arr, scale_value)
        if v_arr is not None:
            self._write(k_arr, v_arr, padding)
        # One query at the end of the cache sees every key: no causal mask needed.
        allowed: Any = self._causal(T, S) if is_causal and T > 1 else None  # (T, S)
        if window is not None:
            allowed = self._window(T, S, window, is_causal)  # (T, S)
        if self._padded:
            real = self._real[:, None, None, :S]  # (B, 1, 1, S)
            allowed = real if allowed is None else (real & allowed)  # (B, 1, T, S)
        return self._grouped(q_arr, self._keys[:, :, :S], self._values[:, :, :S], allowed,
                             scale_value, cap, sink_logits)  # (B, H, T, Dv)
