"""The sliding-window KV cache's bookkeeping: a ring of W slots, written once for both twins.

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T new tokens, D head dim, Dv value head dim, W window.

Position i lives in slot ``i mod W``; after any append the ring holds exactly
the last ``min(length, W)`` positions, the keys the next query sees. The slot
arithmetic is :func:`attnlab.shapes.held_positions` and
:func:`attnlab.shapes.ring_segments`; the checks and the array operations each
twin supplies are :class:`attnlab.fast.cache_book.CacheBook`'s.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..checks import check_positive_int
from ..kernel_options import check_softcap
from ..shapes import held_positions, ring_segments
from .cache_book import CacheBook

__all__ = ["RingBook"]

#: The array type of a twin: ``numpy.ndarray`` or ``torch.Tensor``.
A = TypeVar("A")


class RingBook(CacheBook[A]):
    """The sliding-window cache: a ring of W slots, position i in slot ``i mod W``.

    Shapes: keys (B, Hkv, W, D), values (B, Hkv, W, Dv). **W = the number of
    keys each query sees, including itself**: the query at position p attends
    to keys ``max(0, p - W + 1) .. p``.
    """

    def __init__(self, batch: int, num_kv_heads: int, head_dim: int,
                 value_head_dim: int | None, *, window: int, dtype: Any, device: Any) -> None:
        super().__init__(batch, num_kv_heads, head_dim, value_head_dim, dtype, device)
        self.window = check_positive_int(window, "window")
        self._check_buffer(self.window, "window")
        self._keys = self._zeros(self.window, self.head_dim)  # (B, Hkv, W, D)
        self._values = self._zeros(self.window, self.value_head_dim)  # (B, Hkv, W, Dv)

    @property
    def positions(self) -> A:  # (min(length, W),) int64
        """The absolute positions held, in increasing order."""
        held = held_positions(self._length, self.window)
        return self._arange(held.start, held.stop)

    @property
    def keys(self) -> A:  # (B, Hkv, min(length, W), D)
        """A copy of the held keys in position order."""
        return self._in_order(self._keys)

    @property
    def values(self) -> A:  # (B, Hkv, min(length, W), Dv)
        """A copy of the held values in position order."""
        return self._in_order(self._values)

    def _in_order(self, buffer: Any) -> A:  # (B, Hkv, W, ·) -> (B, Hkv, n, ·)
        held = held_positions(self._length, self.window)
        parts = [buffer[:, :, slot : slot + count]
                 for _, slot, count in ring_segments(held.start, held.stop, self.window)]
        return self._concat(parts) if parts else self._copy(buffer[:, :, :0])

    def _held_keys(self) -> A:  # (B, Hkv, min(length, W), D), slot order
        # Until the buffer is full, positions 0 .. length - 1 sit in slots 0 .. length - 1.
        return self._keys[:, :, : min(self._length, self.window)]

    def _repr_sizes(self) -> str:
        return f"window={self.window}, length={self._length}"

    def reset(self) -> None:
        """Forget every token."""
        self._length = 0

    def append(self, k: Any, v: Any) -> None:
        """Append the keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of T new tokens."""
        self._write(*self._check_kv(k, v))

    def _write(self, k: Any, v: Any) -> None:
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
    ) -> A:
        """Append the T new tokens' k, v, and attend from their queries within the window.

        Shapes: q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), sinks (H,)
        -> (B, H, T, Dv).

        The query at position p sees keys ``max(0, p - W + 1) .. p``. A single
        new token is written first and attends over the held slots (exactly its
        window, in any order); a chunk of T > 1 attends over the held keys in
        position order followed by the chunk (its first query still needs old
        keys the chunk would overwrite), and is written afterwards. ``softcap``
        and ``sinks`` as in :func:`attnlab.scaled_dot_product_attention`.
        """
        cap = check_softcap(softcap)
        q_arr, k_arr, v_arr, T, scale_value, sink_logits = self._check_call(
            q, k, v, scale, sinks, optional_kv=False)
        W = self.window
        n = min(self._length, W)  # keys held before the append
        self._check_attend_room(q_arr, n + T)
        self._check_scores(q_arr, k_arr, scale_value)
        if T == 1:
            # After writing, the held slots hold positions p - W + 1 .. p: exactly the window.
            self._write(k_arr, v_arr)
            n = min(self._length, W)
            return self._grouped(q_arr, self._keys[:, :, :n], self._values[:, :, :n], None,
                                 scale_value, cap, sink_logits)  # (B, H, 1, Dv)
        keys = self._concat([self._in_order(self._keys), k_arr])  # (B, Hkv, n + T, D)
        values = self._concat([self._in_order(self._values), v_arr])  # (B, Hkv, n + T, Dv)
        # Bottom-right aligned, the W most recent keys, itself included.
        allowed = self._window(T, n + T, W, True)  # (T, n + T)
        out = self._grouped(q_arr, keys, values, allowed, scale_value, cap,
                            sink_logits)  # (B, H, T, Dv)
        self._write(k_arr, v_arr)
        return out
