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
(:attr:`compute_dtype`) and returned in float32. The bookkeeping (lengths,
doubling, left padding, the checks and their messages in
:mod:`attnlab.fast.cache_book`; the ring of W slots in :mod:`attnlab.fast.ring_book`)
is shared with the torch twins; this module holds the NumPy array operations,
and the attention is :func:`attnlab.kernel.attend`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_bool_mask, as_float_array, check_alloc
from ..errors import AttnlabError, missing_extra
from ..kernel import abs_max, attend, check_score_range, check_sinks
from ..masks import causal_mask, window_mask
from .cache_book import CacheBook, GrowingBook, TwinArrays
from .ring_book import RingBook

__all__ = [
    "KVCache",
    "NumpyTwinArrays",
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


class NumpyTwinArrays(TwinArrays[np.ndarray]):
    """What every NumPy cache (these and :class:`attnlab.PagedKVCache`) does alike with
    its arrays: the dtypes, the conversion of inputs, the size."""

    def _set_dtype(self, dtype: Any, device: Any) -> None:
        self.dtype = storage_dtype(dtype)
        #: The dtype attention is computed in: float32 for float16 / bfloat16 storage.
        self.compute_dtype = compute_dtype_of(self.dtype)

    def _as_float(self, x: Any, name: str) -> np.ndarray:
        return as_float_array(x, name)

    def _to_storage(self, x: np.ndarray, name: str) -> np.ndarray:
        return cast_checked(x, self.dtype, name, "the cache's dtype")

    def _nbytes(self, x: np.ndarray) -> int:
        return int(x.nbytes)


class _NumpyArrays(CacheBook[np.ndarray], NumpyTwinArrays):
    """The NumPy array operations of the caches; the bookkeeping is :mod:`.cache_book`'s
    and :mod:`.ring_book`'s."""

    def _as_bool(self, x: Any, name: str) -> np.ndarray:
        return as_bool_mask(x, name)

    def _to_compute(self, q: np.ndarray, name: str) -> np.ndarray:
        return cast_checked(q, self.compute_dtype, name, "the cache's dtype")

    def _check_sinks(self, sinks: Any, q: np.ndarray) -> np.ndarray | None:
        return check_sinks(sinks, q.shape[:2], self.compute_dtype)

    def _check_scores(self, q: np.ndarray, k: np.ndarray, scale: float) -> None:
        k_max = max(self._held_k_max(), abs_max(k))
        check_score_range(abs_max(q), k_max, self.head_dim, scale, self.compute_dtype)

    def _held_k_max(self) -> float:
        """The largest |key| the cache holds."""
        return abs_max(self._held_keys())

    def _check_attend_room(self, q: np.ndarray, S: int) -> None:
        check_alloc((*q.shape[:3], S), self.compute_dtype, "the score matrix (B, H, T, S)", "q")

    def _zeros(self, length: int, width: int) -> np.ndarray:
        return np.zeros((self.batch, self.num_kv_heads, length, width), self.dtype)

    def _ones_bool(self, length: int) -> np.ndarray:
        return np.ones((self.batch, length), dtype=bool)

    def _arange(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop, dtype=np.int64)

    def _concat(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts, axis=2)

    def _copy(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def _view(self, x: np.ndarray) -> np.ndarray:
        view = x.view()
        view.flags.writeable = False
        return view

    def _row_sums(self, real: np.ndarray) -> np.ndarray:
        return real.sum(axis=1, dtype=np.int64)

    def _causal(self, T: int, S: int) -> np.ndarray:
        return causal_mask(T, S)

    def _window(self, T: int, S: int, window: Any, is_causal: bool) -> np.ndarray:
        return window_mask(T, S, window=window, is_causal=is_causal)

    def _grouped(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                 allowed: np.ndarray | None, scale: float, softcap: float | None,
                 sinks: Any) -> np.ndarray:
        return _grouped_attention(q, keys, values, allowed, scale, softcap, sinks)


class KVCache(GrowingBook[np.ndarray], _NumpyArrays):
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
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, max_len=max_len,
                         capacity=capacity, dtype=dtype, device=None)
        self._k_max = 0.0  # largest |key| appended since the last reset (for _check_scores)

    def _held_k_max(self) -> float:
        return self._k_max  # kept as keys are written: no pass over the whole cache per step

    def reset(self) -> None:
        """Forget every token (the storage is kept for reuse)."""
        super().reset()
        self._k_max = 0.0

    def _write(self, k: Any, v: Any, key_padding: Any = None) -> None:
        super()._write(k, v, key_padding)
        self._k_max = max(self._k_max, abs_max(k))


class SlidingWindowKVCache(RingBook[np.ndarray], _NumpyArrays):
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
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, window=window,
                         dtype=dtype, device=None)
