"""KV caches for causal decoding in PyTorch; behave identically to :mod:`attnlab.fast.kv_cache`.

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T new tokens, S keys attended to, D head dim, Dv value head dim, W window.

Same semantics as the NumPy twins, tested against them:

- :class:`KVCache`: appends keys (B, Hkv, T, D) and values (B, Hkv, T, Dv);
  ``attend(q, k, v)`` appends, then attends from the T new queries (positions
  ``length - T .. length - 1``) over everything cached, causal and bottom-right
  aligned. Storage grows by doubling, or is fixed by ``max_len`` (appending past
  it raises).
- :class:`SlidingWindowKVCache`: a rolling buffer of W slots, position i in slot
  ``i mod W``. **W keys including the current token**: the query at position p
  sees keys ``max(0, p - W + 1) .. p``.

The attention itself is :func:`attnlab.torch.attention.attend` (torch's fused
kernel where it applies). Query head h reads key/value head h // (H / Hkv); the
heads of a group are stacked as rows of one product, the keys are not repeated.

The caches are for inference: keys and values are stored detached (gradients
flow to the queries of the current call only). Use the full forward to train.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from ..errors import (
    AttnlabError,
    ShapeError,
    check_alloc,
    check_positive_int,
    check_scale,
    shape_str,
)
from .attention import attend, check_tensor_score_range
from .checks import as_float_tensor, check_finite

__all__ = ["KVCache", "SlidingWindowKVCache", "sliding_window_mask"]


def sliding_window_mask(
    T: int, window: int, *, S: int | None = None, device: Any = None
) -> torch.Tensor:  # -> (T, S)
    """Causal sliding-window mask, bottom-right aligned, True = may attend; behaves
    identically to ``attnlab.sliding_window_mask(T, window, is_causal=True, S=S)``.

    Query i sits at position ``p = S - T + i`` and sees keys ``p - W < j <= p``.

    >>> sliding_window_mask(3, 2).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [0, 1, 1]], dtype=torch.int32)
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    W = check_positive_int(window, "window")
    check_alloc((T, S), torch.bool, "the sliding-window mask (T, S)", sizes)
    query_pos = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1)
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    return (key_pos <= query_pos) & (key_pos > query_pos - W)  # (T, S)


class _CacheBase:
    """Shape bookkeeping and input checks shared by the two caches."""

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
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._length = 0
        # Largest |key| appended since the last reset, kept on the device (no host sync).
        self._k_max = torch.zeros((), dtype=torch.float64, device=self.device)

    @property
    def length(self) -> int:
        """Number of tokens appended so far = the absolute position of the next token."""
        return self._length

    def __len__(self) -> int:
        return self._length

    def next_positions(self, T: int) -> torch.Tensor:  # -> (T,) int64
        """Absolute positions of the next T tokens: ``length .. length + T - 1`` (for RoPE)."""
        T = check_positive_int(T, "T", allow_zero=True)
        return self._length + torch.arange(T, device=self.device)

    def _check_kv(self, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """k (B, Hkv, T, D), v (B, Hkv, T, Dv), detached, in the cache's dtype and device."""
        B, Hkv, D, Dv = self.batch, self.num_kv_heads, self.head_dim, self.value_head_dim
        k_t = as_float_tensor(k, "k")
        v_t = as_float_tensor(v, "v")
        if k_t.ndim != 4 or tuple(k_t.shape[:2]) != (B, Hkv) or k_t.shape[3] != D:
            raise ShapeError(
                f"k: expected (B, Hkv, T, D) = ({B}, {Hkv}, T, {D}), got {shape_str(k_t.shape)}"
            )
        T = k_t.shape[2]
        if tuple(v_t.shape) != (B, Hkv, T, Dv):
            raise ShapeError(
                f"v: expected (B, Hkv, T, Dv) = ({B}, {Hkv}, {T}, {Dv}) to match k, "
                f"got {shape_str(v_t.shape)}"
            )
        for name, t in (("k", k_t), ("v", v_t)):
            if t.device != self.device:
                raise AttnlabError(
                    f"{name}: expected a tensor on the cache's device {self.device}, "
                    f"got {t.device}"
                )
        check_finite([("k", k_t), ("v", v_t)])
        return self._cast(k_t, "k"), self._cast(v_t, "v")

    def _cast(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """``t`` in the cache's dtype; refused if a narrowing cast would overflow to inf."""
        out = t.detach().to(self.dtype)
        narrowing = torch.finfo(t.dtype).max > torch.finfo(self.dtype).max
        if narrowing and out.numel() and not bool(torch.isfinite(out).all()):
            largest = float(t.detach().abs().amax())
            raise AttnlabError(
                f"{name}: values up to {largest:.3g} do not fit the cache's dtype "
                f"{self.dtype} (largest {torch.finfo(self.dtype).max:.3g})"
            )
        return out

    def _grown_k_max(self, k: torch.Tensor) -> torch.Tensor:  # -> () float64
        """max(the running max|key|, max|k|) as a 0-d tensor on the device."""
        if not k.numel():
            return self._k_max
        return torch.maximum(self._k_max, k.abs().amax().to(torch.float64))

    def _check_scores(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
        """Refuse q (and new keys k) whose scores with the cached keys could overflow,
        before anything is appended; returns the grown max|key| (0-d, float64)."""
        k_max = self._grown_k_max(k)
        check_tensor_score_range(q, k, None, scale, k_max)
        return k_max

    def _check_q(self, q: Any, T: int) -> torch.Tensor:
        """q (B, H, T, D) with H a multiple of Hkv, in the cache's dtype."""
        B, Hkv, D = self.batch, self.num_kv_heads, self.head_dim
        q_t = as_float_tensor(q, "q")
        if (q_t.ndim != 4 or q_t.shape[0] != B or tuple(q_t.shape[2:]) != (T, D)
                or q_t.shape[1] % Hkv or q_t.shape[1] == 0):
            raise ShapeError(
                f"q: expected (B, H, T, D) = ({B}, H, {T}, {D}) with H a positive multiple of "
                f"Hkv = {Hkv} and T matching k, got {shape_str(q_t.shape)}"
            )
        if q_t.device != self.device:
            raise AttnlabError(
                f"q: expected a tensor on the cache's device {self.device}, got {q_t.device}"
            )
        check_finite([("q", q_t)])
        return self._cast(q_t, "q") if q_t.dtype != self.dtype else q_t

    @staticmethod
    def _check_scale(scale: float | None, D: int) -> float:
        return check_scale(scale, D)

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
    scale: float, k_max: torch.Tensor,
) -> torch.Tensor:  # the score range was checked by the caller (_CacheBase._check_scores)
    """Shapes: q (B, H, T, D), keys (B, Hkv, S, D), values (B, Hkv, S, Dv),
    allowed bool (T, S) or None -> (B, H, T, Dv)."""
    B, H, T, D = q.shape
    Hkv = keys.shape[1]
    G = H // Hkv
    rows = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D); head h = g*G + j
    if allowed is not None:
        allowed = allowed.repeat(G, 1)  # (G*T, S), rows in the order of `rows`
    out = cast(torch.Tensor, attend(
        rows, keys, values, allowed, None, scale, is_causal=False, dropout_p=0.0,
        return_weights=False, k_max=k_max, range_checked=True,
    ))  # (B, Hkv, G*T, Dv); without weights attend returns the output alone
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

    @property
    def capacity(self) -> int:
        return self._keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    @property
    def keys(self) -> torch.Tensor:  # (B, Hkv, S, D)
        """View of the cached keys; valid until the next append."""
        return self._keys[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor:  # (B, Hkv, S, Dv)
        """View of the cached values; valid until the next append."""
        return self._values[:, :, : self._length]

    def reset(self) -> None:
        self._length = 0
        self._k_max = torch.zeros_like(self._k_max)

    def append(self, k: Any, v: Any) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens."""
        k_t, v_t = self._check_kv(k, v)
        self._write(k_t, v_t)

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        T = k.shape[2]
        needed = self._length + T
        if self.max_len is not None and needed > self.max_len:
            raise AttnlabError(
                f"k: the cache is full: it holds {self._length} of max_len = {self.max_len} "
                f"positions, expected T <= {self.max_len - self._length} new tokens, got T = {T}; "
                "create it with a larger max_len, leave max_len=None to let it grow, or use "
                "SlidingWindowKVCache"
            )
        if needed > self.capacity:
            new_capacity = self.capacity
            while new_capacity < needed:
                new_capacity *= 2
            self._check_buffer(new_capacity, "k")
            keys, values = self._zeros(new_capacity, self.head_dim), self._zeros(
                new_capacity, self.value_head_dim)
            keys[:, :, : self._length] = self._keys[:, :, : self._length]
            values[:, :, : self._length] = self._values[:, :, : self._length]
            self._keys, self._values = keys, values
        self._keys[:, :, self._length : needed] = k
        self._values[:, :, self._length : needed] = v
        self._length = needed
        self._k_max = self._grown_k_max(k)

    def attend(self, q: Any, k: Any, v: Any, *, scale: float | None = None) -> torch.Tensor:
        """Append the new tokens' k, v, then attend from their queries over the whole cache.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv).
        """
        k_t, v_t = self._check_kv(k, v)
        T = k_t.shape[2]
        q_t = self._check_q(q, T)
        scale_value = self._check_scale(scale, self.head_dim)
        check_alloc((T, self._length + T), torch.bool, "the causal mask (T, S)", "q")
        self._check_scores(q_t, k_t, scale_value)
        self._write(k_t, v_t)
        S = self._length
        allowed = None
        if T > 1:
            query_pos = torch.arange(T, device=self.device)[:, None] + (S - T)  # (T, 1)
            allowed = torch.arange(S, device=self.device)[None, :] <= query_pos  # (T, S)
        return _grouped_attention(q_t, self._keys[:, :, :S], self._values[:, :, :S], allowed,
                                  scale_value, self._k_max)  # (B, H, T, Dv)

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
    position p attends to keys ``max(0, p - W + 1) .. p``. Position i lives in
    slot ``i mod W``.

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
        self._slot_pos = torch.full((self.window,), -1, dtype=torch.int64,
                                    device=self.device)  # (W,) position held by each slot

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    @property
    def positions(self) -> torch.Tensor:  # (min(length, W),)
        """The absolute positions held, in increasing order."""
        return torch.sort(self._slot_pos[self._slot_pos >= 0]).values

    @property
    def keys(self) -> torch.Tensor:  # (B, Hkv, min(length, W), D)
        return self._keys[:, :, self.positions % self.window]

    @property
    def values(self) -> torch.Tensor:  # (B, Hkv, min(length, W), Dv)
        return self._values[:, :, self.positions % self.window]

    def reset(self) -> None:
        self._length = 0
        self._k_max = torch.zeros_like(self._k_max)
        self._slot_pos.fill_(-1)

    def append(self, k: Any, v: Any) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens."""
        k_t, v_t = self._check_kv(k, v)
        self._write(k_t, v_t)

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        T, W = k.shape[2], self.window
        keep = min(T, W)
        positions = self._length + torch.arange(T - keep, T, device=self.device)  # (keep,)
        slots = positions % W  # (keep,) distinct
        self._keys[:, :, slots] = k[:, :, T - keep :]
        self._values[:, :, slots] = v[:, :, T - keep :]
        self._slot_pos[slots] = positions
        self._length += T
        self._k_max = self._grown_k_max(k)

    def attend(self, q: Any, k: Any, v: Any, *, scale: float | None = None) -> torch.Tensor:
        """Append the new tokens' k, v, and attend from their queries within the window.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, T, Dv).
        """
        k_t, v_t = self._check_kv(k, v)
        T = k_t.shape[2]
        q_t = self._check_q(q, T)
        scale_value = self._check_scale(scale, self.head_dim)
        k_max = self._check_scores(q_t, k_t, scale_value)
        W = self.window
        if T == 1:
            # After writing, the W slots hold positions p - W + 1 .. p: exactly the window.
            self._write(k_t, v_t)
            filled = self._slot_pos >= 0  # (W,)
            allowed = None if self._length >= W else filled[None, :]  # (1, W)
            return _grouped_attention(q_t, self._keys, self._values, allowed, scale_value,
                                      self._k_max)
        query_pos = self._length + torch.arange(T, device=self.device)  # (T,)
        key_pos = torch.cat([self._slot_pos, query_pos])  # (W + T,), -1 = empty slot
        keys = torch.cat([self._keys, k_t], dim=2)  # (B, Hkv, W + T, D)
        values = torch.cat([self._values, v_t], dim=2)  # (B, Hkv, W + T, Dv)
        allowed = (
            (key_pos[None, :] >= 0)
            & (key_pos[None, :] <= query_pos[:, None])
            & (key_pos[None, :] > query_pos[:, None] - W)
        )  # (T, W + T)
        out = _grouped_attention(q_t, keys, values, allowed, scale_value,
                                 k_max)  # (B, H, T, Dv)
        self._write(k_t, v_t)
        return out

    def __repr__(self) -> str:
        return (
            f"SlidingWindowKVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, window={self.window}, length={self._length}, "
            f"dtype={self.dtype}, device={self.device})"
        )
