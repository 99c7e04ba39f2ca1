"""KV caches for causal decoding: a full cache and a sliding-window rolling buffer.

Dimension legend: B batch, H query heads, Hkv key/value heads (GQA: H is a
multiple of Hkv), T new tokens (query length), S keys attended to (key length),
D head dim, Dv value head dim, W window.

Generating token by token with plain attention recomputes the keys and values
of the whole prefix at every step: O(S²) work for the S-th token. A KV cache
keeps the keys and values of every position seen so far; a step projects only
its T new tokens, appends their keys and values, and attends over the cache:
O(S) work per token.

Positions are absolute token indices starting at 0. The T new queries of a call
sit at positions ``length .. length + T - 1`` (:meth:`KVCache.next_positions`);
rotate queries and keys with RoPE at those positions *before* handing them to
the cache (``apply_rope(k, positions=cache.length)``), so keys are stored
already rotated, as in LLaMA.

:meth:`KVCache.attend` is an efficient implementation equivalent to the
following plain computation over the whole sequence (tested to float precision)::

    keys   = concatenate(every k appended so far, axis=-2)        # (B, Hkv, S, D)
    values = concatenate(every v appended so far, axis=-2)        # (B, Hkv, S, Dv)
    out = scaled_dot_product_attention(                           # (B, H, T, Dv)
        q, repeat(keys, H // Hkv, axis=1), repeat(values, H // Hkv, axis=1),
        is_causal=True)                                           # bottom-right aligned

Sliding window (Mistral). **W is the number of keys a query sees, including
itself**: the query at position p attends to keys ``max(0, p - W + 1) .. p``
(:func:`attnlab.fast.sparse.sliding_window_mask`; FlashAttention's ``window_size=(W - 1, 0)``).
With W = 1 a token sees only itself; with W ≥ the sequence length the window
changes nothing. Some implementations build their mask as ``j >= p - W``
(W + 1 keys) while keeping a W-slot buffer, so the mask and the cache disagree
by one key; here the buffer holds exactly the W positions the next query
needs, position i in slot ``i mod W``. :meth:`SlidingWindowKVCache.attend`
equals::

    scaled_dot_product_attention(q, keys, values,                 # whole sequence
                                 mask=sliding_window_mask(T, W, is_causal=True, S=S))

Sequences of different lengths share one batch as Hugging Face's ``generate``
batches them: prompts left-padded to one length, their padding marked by
``key_padding`` (B, T) (True = a real token) and never attended to;
:attr:`KVCache.lengths` counts each row's real tokens (its next RoPE position).
For batches whose sequences come and go, see :mod:`attnlab.fast.paged_cache`.
``attend(q)`` without k and v attends over the cache as it is, and
``is_causal=False`` lets a chunk of new tokens see each other both ways.

Inputs are cast to the cache's dtype, as writing into a preallocated array
does. float16 and bfloat16 (``dtype="bfloat16"``, through ml_dtypes) store keys
and values in half the memory; attention is then computed in float32
(:attr:`compute_dtype`) and returned in float32. The shape
checks and the slot arithmetic (doubling, the ring of W slots) are
:mod:`attnlab.shapes`, shared with the torch twins; the attention is
:func:`attnlab.kernel.attend`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import (
    AttnlabError,
    as_bool_mask,
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    check_scale,
    missing_extra,
)
from ..kernel import abs_max, attend, check_score_range, check_sinks, check_softcap
from ..masks import causal_mask, window_mask
from ..shapes import (
    check_cache_query_shape,
    check_cache_room,
    check_key_padding_shape,
    check_kv_shapes,
    grown_capacity,
    held_positions,
    ring_segments,
)

__all__ = [
    "KVCache",
    "STORAGE_DTYPES",
    "SlidingWindowKVCache",
    "cast_checked",
    "compute_dtype_of",
    "largest",
    "storage_dtype",
]


#: Storage dtypes of the caches: float16 and bfloat16 (through ml_dtypes) hold keys and
#: values in half the memory and are computed in float32, as torch does on CPU.
STORAGE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def storage_dtype(dtype: Any) -> np.dtype:
    """A cache's storage dtype: float16, bfloat16 (ml_dtypes), float32 or float64."""
    if isinstance(dtype, str) and dtype == "bfloat16" or getattr(dtype, "__name__", "") == \
            "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise missing_extra("ml_dtypes", "bfloat16", "A bfloat16 KV cache") from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        result = np.dtype(dtype)
    except (TypeError, ValueError, UnicodeError):  # not a dtype, e.g. a tensor
        raise AttnlabError(f"dtype: expected a float dtype, got {dtype!r}") from None
    if result.name not in STORAGE_DTYPES:
        raise AttnlabError(f"dtype: expected one of {', '.join(STORAGE_DTYPES)}, got {result}")
    return result


def compute_dtype_of(dtype: np.dtype) -> np.dtype:
    """float32 for the 2-byte storage dtypes (float16, bfloat16), else the dtype itself."""
    return np.dtype(np.float32) if dtype.itemsize == 2 else dtype


def largest(dtype: np.dtype) -> float:
    """The largest finite value of a float dtype, bfloat16 included."""
    if dtype.name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).max)
    return float(np.finfo(dtype).max)


def cast_checked(arr: np.ndarray, dtype: np.dtype, name: str, what: str) -> np.ndarray:
    """``arr`` in ``dtype``; refused (naming ``name``) if a narrowing cast would overflow."""
    with np.errstate(over="ignore"):
        out = arr.astype(dtype, copy=False)
    if arr.dtype.itemsize > dtype.itemsize and not np.isfinite(out).all():
        raise AttnlabError(
            f"{name}: values up to {abs_max(arr):.3g} do not fit {what} {dtype} "
            f"(largest {largest(dtype):.3g})"
        )
    return out


class _CacheBase:
    """Shape bookkeeping and input checks shared by the two caches."""

    def __init__(
        self, batch: int, num_kv_heads: int, head_dim: int, value_head_dim: int | None,
        dtype: Any,
    ) -> None:
        self.batch = check_positive_int(batch, "batch")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_head_dim = (
            self.head_dim if value_head_dim is None
            else check_positive_int(value_head_dim, "value_head_dim")
        )
        self.dtype = storage_dtype(dtype)
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage.
        self.compute_dtype = compute_dtype_of(self.dtype)
        self._length = 0

    @property
    def length(self) -> int:
        """Number of tokens appended so far = the absolute position of the next token."""
        return self._length

    def __len__(self) -> int:
        return self._length

    def next_positions(self, T: int) -> np.ndarray:  # -> (T,) int64
        """Absolute positions of the next T tokens: ``length .. length + T - 1`` (for RoPE)."""
        T = check_positive_int(T, "T", allow_zero=True)
        return self._length + np.arange(T, dtype=np.int64)

    def _check_kv(self, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), in the cache's dtype."""
        k_arr = as_float_array(k, "k")
        v_arr = as_float_array(v, "v")
        check_kv_shapes(k_arr.shape, v_arr.shape, self.batch, self.num_kv_heads, self.head_dim,
                        self.value_head_dim)
        return self._cast(k_arr, "k"), self._cast(v_arr, "v")

    def _cast(self, arr: np.ndarray, name: str, dtype: np.dtype | None = None) -> np.ndarray:
        """``arr`` in the cache's dtype (or ``dtype``); refused if a narrowing cast would
        overflow to inf."""
        dtype = self.dtype if dtype is None else dtype
        return cast_checked(arr, dtype, name, "the cache's dtype")

    def _check_scores(self, q: np.ndarray, k: np.ndarray, scale: float) -> None:
        """Refuse q whose scores with the held and the new keys could overflow."""
        k_max = max(self._held_k_max(), abs_max(k))
        check_score_range(abs_max(q), k_max, self.head_dim, scale, self.compute_dtype)

    def _held_k_max(self) -> float:
        """The largest |key| the cache holds."""
        raise NotImplementedError

    def _check_q(self, q: Any, T: int | None) -> np.ndarray:
        """q (B, H, T, D) with H a multiple of Hkv (any T if None), in the compute dtype."""
        q_arr = as_float_array(q, "q")
        T = q_arr.shape[2] if T is None and q_arr.ndim == 4 else (T or 0)
        check_cache_query_shape(q_arr.shape, self.batch, self.num_kv_heads, T, self.head_dim)
        return self._cast(q_arr, "q", self.compute_dtype)

    def _check_buffer(self, length: int, name: str) -> None:
        """Refuse key/value buffers of ``length`` positions beyond attnlab's size limit."""
        for width in (self.head_dim, self.value_head_dim):
            check_alloc((self.batch, self.num_kv_heads, length, width), self.dtype,
                        "the cache's buffer (B, Hkv, length, D)", name)


def _grouped_attention(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, allowed: np.ndarray | None,
    scale: float, softcap: float | None = None, sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Attention of H query heads over Hkv shared key/value heads, without copying the keys.

    Shapes: q (B, H, T, D), keys (B, Hkv, S, D), values (B, Hkv, S, Dv),
    allowed bool (T, S), (B, 1, T, S) or None, sinks (H, 1, 1) from
    :func:`attnlab.kernel.check_sinks` or None -> (B, H, T, Dv).

    Query head h reads key/value head h // G (G = H / Hkv), as
    ``MultiHeadAttention.expand_kv`` does; the G heads of a group are stacked as
    G·T rows of one product instead of repeating the keys G times. Keys and
    values stored in float16 / bfloat16 are computed in q's dtype (float32).
    """
    B, H, T, D = q.shape
    Hkv = keys.shape[1]
    G = H // Hkv
    if keys.dtype != q.dtype:
        keys, values = keys.astype(q.dtype), values.astype(q.dtype)
    rows = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D); head h = g*G + j
    if allowed is not None and G > 1 and allowed.shape[-2] > 1:  # one row broadcasts as is
        reps = (1,) * (allowed.ndim - 2) + (G, 1)
        allowed = np.tile(allowed, reps)  # (..., G*T, S), rows in the order of `rows`
    row_sinks = None
    if sinks is not None:  # head h = g*G + j owns rows j*T .. j*T + T - 1 of group g
        row_sinks = np.repeat(sinks.reshape(Hkv, G, 1), T, axis=1)  # (Hkv, G*T, 1)
    out, _ = attend(rows, keys, values, allowed, None, scale, softcap=softcap,
                    sinks=row_sinks)  # (B, Hkv, G*T, Dv)
    return out.reshape(B, H, T, values.shape[-1])  # (B, H, T, Dv)


class KVCache(_CacheBase):
    """Keys and values of one attention layer for causal decoding, with MHA or GQA.

    Shapes: stores keys (B, Hkv, S, D) and values (B, Hkv, S, Dv).

    Storage is preallocated. Without ``max_len`` it starts at ``capacity``
    positions and doubles when full (amortised O(1) per token). With
    ``max_len`` all of it is allocated up front and appending past it raises an
    :class:`AttnlabError` saying how many positions are left.

    Prefill a prompt, then decode one token (or a chunk) at a time, all with
    :meth:`attend`; see the module docstring for the plain computation it equals.

    >>> cache = KVCache(batch=1, num_kv_heads=2, head_dim=4, max_len=16)
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.random((1, 4, 5, 4)), rng.random((1, 2, 5, 4)), rng.random((1, 2, 5, 4))
    >>> cache.attend(q, k, v).shape            # prefill 5 tokens, 4 query heads
    (1, 4, 5, 4)
    >>> cache.attend(q[:, :, :1], k[:, :, :1], v[:, :, :1]).shape   # one more
    (1, 4, 1, 4)
    >>> cache.length, cache.keys.shape
    (6, (1, 2, 6, 4))
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
        dtype: Any = np.float64,
    ) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype)
        self.max_len = None if max_len is None else check_positive_int(max_len, "max_len")
        start = self.max_len if self.max_len is not None else check_positive_int(
            capacity, "capacity"
        )
        self._check_buffer(start, "max_len" if self.max_len is not None else "capacity")
        self._keys = np.zeros((self.batch, self.num_kv_heads, start, self.head_dim), self.dtype)
        self._values = np.zeros(
            (self.batch, self.num_kv_heads, start, self.value_head_dim), self.dtype
        )
        self._k_max = 0.0  # largest |key| appended since the last reset (for _check_scores)
        self._real = np.ones((self.batch, start), dtype=bool)  # (B, capacity) True = real token
        self._padded = False  # whether a key_padding with padding was given since the reset

    @property
    def capacity(self) -> int:
        """Positions allocated now (grows unless ``max_len`` is set)."""
        return self._keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        return self._keys.nbytes + self._values.nbytes

    @property
    def keys(self) -> np.ndarray:  # (B, Hkv, S, D)
        """Read-only view of the cached keys; valid until the next append."""
        view = self._keys[:, :, : self._length]
        view.flags.writeable = False
        return view

    @property
    def values(self) -> np.ndarray:  # (B, Hkv, S, Dv)
        """Read-only view of the cached values; valid until the next append."""
        view = self._values[:, :, : self._length]
        view.flags.writeable = False
        return view

    @property
    def key_padding(self) -> np.ndarray:  # (B, S) bool
        """Read-only view: True = a real token, False = padding (e.g. a left-padded prompt)."""
        view = self._real[:, : self._length]
        view.flags.writeable = False
        return view

    @property
    def lengths(self) -> np.ndarray:  # (B,) int64
        """Real tokens held per sequence (padding not counted).

        With left-padded prompts each row has its own length: ``lengths[b]`` is
        the RoPE position of row b's next token (Hugging Face's
        ``attention_mask.cumsum(-1) - 1``), where :meth:`next_positions` gives
        the slots, shared by the batch.
        """
        return self._real[:, : self._length].sum(axis=1, dtype=np.int64)

    def _held_k_max(self) -> float:
        return self._k_max

    def reset(self) -> None:
        """Forget every token (the storage is kept for reuse)."""
        self._length = 0
        self._k_max = 0.0
        self._padded = False

    def append(self, k: Any, v: Any, *, key_padding: Any = None) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens.

        ``key_padding`` bool (B, T), True = a real token: padding keys are never
        attended to (left-padded prompts of different lengths in one batch).
        """
        k_arr, v_arr = self._check_kv(k, v)
        self._write(k_arr, v_arr, self._check_key_padding(key_padding, k_arr.shape[2]))

    def _check_key_padding(self, key_padding: Any, T: int) -> np.ndarray | None:
        """key_padding bool (B, T) for the T new tokens, or None (all real)."""
        if key_padding is None:
            return None
        arr = as_bool_mask(key_padding, "key_padding")
        check_key_padding_shape(arr.shape, str(arr.dtype), True, (self.batch, T))
        return arr

    def _write(self, k: np.ndarray, v: np.ndarray, key_padding: np.ndarray | None = None) -> None:
        T = k.shape[2]
        check_cache_room(self._length, T, self.max_len)
        needed = self._length + T
        if needed > self.capacity:
            self._grow(needed)
        self._k_max = max(self._k_max, abs_max(k))
        self._keys[:, :, self._length : needed] = k
        self._values[:, :, self._length : needed] = v
        self._real[:, self._length : needed] = True if key_padding is None else key_padding
        self._padded = self._padded or (key_padding is not None and not key_padding.all())
        self._length = needed

    def _grow(self, needed: int) -> None:
        """Double the capacity until ``needed`` positions fit; copies the cached part once."""
        new_capacity = grown_capacity(self.capacity, needed)
        self._check_buffer(new_capacity, "k")
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = np.zeros((*old.shape[:2], new_capacity, old.shape[3]), self.dtype)
            new[:, :, : self._length] = old[:, :, : self._length]
            setattr(self, name, new)
        real = np.ones((self.batch, new_capacity), dtype=bool)  # (B, capacity)
        real[:, : self._length] = self._real[:, : self._length]
        self._real = real

    def attend(
        self, q: Any, k: Any = None, v: Any = None, *, key_padding: Any = None,
        is_causal: bool = True, scale: float | None = None, softcap: float | None = None,
        window: Any = None, sinks: Any = None,
    ) -> np.ndarray:
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
        if (k is None) != (v is None):
            raise AttnlabError("k, v: expected both (append, then attend) or neither (attend "
                               f"over the cache as it is), got k {type(k).__name__} and v "
                               f"{type(v).__name__}")
        if k is None:
            if key_padding is not None:
                raise AttnlabError("key_padding: marks the padding of new tokens; expected "
                                   "None when k and v are None (nothing is appended)")
            q_arr = self._check_q(q, None)
            T = q_arr.shape[2]
            k_arr, v_arr, padding = q_arr[:, :0], None, None  # nothing new
        else:
            k_arr, v_arr = self._check_kv(k, v)
            T = k_arr.shape[2]
            q_arr = self._check_q(q, T)
            padding = self._check_key_padding(key_padding, T)
        scale_value = check_scale(scale, self.head_dim)
        sink_logits = check_sinks(sinks, q_arr.shape[:2], self.compute_dtype)  # before a write
        self._check_scores(q_arr, k_arr, scale_value)
        S = self._length + (0 if v_arr is None else T)
        check_alloc((*q_arr.shape[:3], S), self.compute_dtype,
                    "the score matrix (B, H, T, S)", "q")
        if v_arr is not None:
            self._write(k_arr, v_arr, padding)
        keys = self._keys[:, :, :S]  # (B, Hkv, S, D)
        values = self._values[:, :, :S]  # (B, Hkv, S, Dv)
        # One query at the end of the cache sees every key: no causal mask needed.
        allowed = causal_mask(T, S) if is_causal and T > 1 else None  # (T, S)
        if window is not None:
            allowed = window_mask(T, S, window=window, is_causal=is_causal)  # (T, S)
        if self._padded:
            real = self._real[:, None, None, :S]  # (B, 1, 1, S)
            allowed = real if allowed is None else (real & allowed)  # (B, 1, T, S)
        return _grouped_attention(q_arr, keys, values, allowed, scale_value,
                                  cap, sink_logits)  # (B, H, T, Dv)

    def __repr__(self) -> str:
        return (
            f"KVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, length={self._length}, capacity={self.capacity}, "
            f"max_len={self.max_len}, dtype={self.dtype})"
        )


class SlidingWindowKVCache(_CacheBase):
    """Rolling-buffer KV cache for sliding-window attention (Mistral): memory O(W).

    Shapes: stores keys (B, Hkv, W, D) and values (B, Hkv, W, Dv); position i
    lives in slot ``i mod W``.

    **W = the number of keys each query sees, including itself**: the query at
    position p attends to keys ``max(0, p - W + 1) .. p``, the band of
    :func:`attnlab.fast.sparse.sliding_window_mask`. After any append the buffer holds exactly the
    last ``min(length, W)`` positions.

    A single new token is written first and then attends over the W slots
    directly (they hold exactly its window). A chunk of T > 1 tokens attends
    over the old buffer followed by the chunk (its first query still needs old
    keys the chunk would overwrite) and is written afterwards; chunks longer
    than W keep their last W tokens.

    >>> cache = SlidingWindowKVCache(1, 1, 2, window=3)
    >>> x = np.arange(10.0).reshape(1, 1, 5, 2)
    >>> _ = cache.attend(x, x, x)
    >>> cache.length, cache.positions.tolist()       # the last W = 3 of 5 positions
    (5, [2, 3, 4])
    >>> cache.nbytes                                 # 2 buffers x 3 slots x 2 values x 8 bytes
    96
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
        *,
        window: int,
        dtype: Any = np.float64,
    ) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype)
        self.window = check_positive_int(window, "window")
        W = self.window
        self._check_buffer(W, "window")
        self._keys = np.zeros((self.batch, self.num_kv_heads, W, self.head_dim), self.dtype)
        self._values = np.zeros((self.batch, self.num_kv_heads, W, self.value_head_dim),
                                self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers: fixed, whatever the length."""
        return self._keys.nbytes + self._values.nbytes

    @property
    def positions(self) -> np.ndarray:  # (min(length, W),) int64
        """The absolute positions held, in increasing order."""
        held = held_positions(self._length, self.window)
        return np.arange(held.start, held.stop, dtype=np.int64)

    @property
    def keys(self) -> np.ndarray:  # (B, Hkv, min(length, W), D)
        """A copy of the held keys in position order."""
        return self._in_order(self._keys)

    @property
    def values(self) -> np.ndarray:  # (B, Hkv, min(length, W), Dv)
        """A copy of the held values in position order."""
        return self._in_order(self._values)

    def _in_order(self, buffer: np.ndarray) -> np.ndarray:  # (B, Hkv, W, ·) -> (B, Hkv, n, ·)
        held = held_positions(self._length, self.window)
        parts = [buffer[:, :, slot : slot + count]
                 for _, slot, count in ring_segments(held.start, held.stop, self.window)]
        return np.concatenate(parts, axis=2) if parts else buffer[:, :, :0].copy()

    def _held_k_max(self) -> float:
        # Until the buffer is full, positions 0 .. length - 1 sit in slots 0 .. length - 1.
        return abs_max(self._keys[:, :, : min(self._length, self.window)])

    def reset(self) -> None:
        """Forget every token."""
        self._length = 0

    def append(self, k: Any, v: Any) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens."""
        k_arr, v_arr = self._check_kv(k, v)
        self._write(k_arr, v_arr)

    def _write(self, k: np.ndarray, v: np.ndarray) -> None:
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
    ) -> np.ndarray:
        """Append the T new tokens' k, v, and attend from their queries within the window.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), sinks (H,)
        -> (B, H, T, Dv).

        The query at position p sees keys ``max(0, p - W + 1) .. p``. ``softcap``
        and ``sinks`` as in :func:`attnlab.scaled_dot_product_attention`.
        """
        cap = check_softcap(softcap)
        k_arr, v_arr = self._check_kv(k, v)
        T = k_arr.shape[2]
        q_arr = self._check_q(q, T)
        scale_value = check_scale(scale, self.head_dim)
        sink_logits = check_sinks(sinks, q_arr.shape[:2], self.compute_dtype)  # before a write
        self._check_scores(q_arr, k_arr, scale_value)
        W = self.window
        check_alloc((*q_arr.shape[:3], W + T), self.dtype, "the score matrix (B, H, T, W + T)",
                    "q")
        if T == 1:
            # After writing, the held slots hold positions p - W + 1 .. p: exactly the window.
            self._write(k_arr, v_arr)
            n = min(self._length, W)
            return _grouped_attention(q_arr, self._keys[:, :, :n], self._values[:, :, :n], None,
                                      scale_value, cap, sink_logits)  # (B, H, 1, Dv)
        held = held_positions(self._length, W)
        keys = np.concatenate([self._in_order(self._keys), k_arr], axis=2)  # (B, Hkv, n + T, D)
        values = np.concatenate([self._in_order(self._values), v_arr],
                                axis=2)  # (B, Hkv, n + T, Dv)
        query_pos = self._length + np.arange(T)  # (T,)
        key_pos = np.arange(held.start, self._length + T)  # (n + T,)
        offset = key_pos[None, :] - query_pos[:, None]  # (T, n + T)
        allowed = (offset <= 0) & (offset > -W)  # (T, n + T): the W most recent, itself included
        out = _grouped_attention(q_arr, keys, values, allowed, scale_value, cap,
                                 sink_logits)  # (B, H, T, Dv)
        self._write(k_arr, v_arr)
        return out

    def __repr__(self) -> str:
        return (
            f"SlidingWindowKVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, window={self.window}, length={self._length}, "
            f"dtype={self.dtype})"
        )
