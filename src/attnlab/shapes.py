"""Shape checks and KV-cache slot arithmetic shared by the NumPy core and attnlab.torch.

Everything here reads only shapes (tuples of ints) and integers, never array
values, so the two twins run the same checks with the same messages and the
same bookkeeping without the torch layer touching NumPy code paths: a shape
is a ``tuple`` of ints, a NumPy ``.shape`` or a ``torch.Size`` alike. Nothing
here imports NumPy or torch.

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length
(new tokens), S key length, D head dim, Dv value head dim, E model width,
Ekv width of the keys' and values' input, W window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .checks import MAX_ELEMENTS, check_broadcastable, check_positive_int, shape_str
from .errors import AttnlabError, ShapeError
from .messages import Message, msg

__all__ = [
    "AttentionShapes",
    "broadcast_shapes",
    "check_attention_shapes",
    "check_score_elements",
    "check_alibi_slopes_shape",
    "check_sinks_shape",
    "check_module_inputs",
    "check_key_padding_shape",
    "check_kv_shapes",
    "check_cache_query_shape",
    "check_cache_room",
    "grown_capacity",
    "held_positions",
    "ring_segments",
    "check_window",
    "check_positions",
    "CAUSAL_ALIGNMENTS",
    "Band",
    "attention_band",
    "check_causal_alignment",
    "check_window_pair",
]

Shape = Sequence[int]


# ------------------------------------------------------------------ attention inputs


class AttentionShapes(NamedTuple):
    """The sizes of checked attention inputs: q (..., T, D), k (..., S, D), v (..., S, Dv)."""

    batch: tuple[int, ...]  # the broadcast leading dims of q, k and v
    T: int
    S: int
    D: int
    Dv: int


def broadcast_shapes(*shapes: Shape) -> tuple[int, ...] | None:
    """The broadcast of ``shapes`` by NumPy's rules, or None if they do not broadcast.

    >>> broadcast_shapes((2, 1, 4), (3, 1), ())
    (2, 3, 4)
    >>> broadcast_shapes((2,), (3,)) is None
    True
    """
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            size = int(size)
            if size != 1:
                if result[i] != 1 and result[i] != size:
                    return None
                result[i] = size
    return tuple(result)


def check_attention_shapes(q: Shape, k: Shape, v: Shape) -> AttentionShapes:
    """Check the shapes of q (..., T, D), k (..., S, D), v (..., S, Dv), naming the argument
    at fault; the leading (batch) dims broadcast against each other."""
    if len(q) < 2 or len(k) < 2 or len(v) < 2:
        for name, shape, layout in (("q", q, "(..., T, D)"), ("k", k, "(..., S, D)"),
                                    ("v", v, "(..., S, Dv)")):
            if len(shape) < 2:
                raise ShapeError(msg("check.ndim", name=name, layout=layout,
                                     shape=shape_str(shape)))
    *q_lead, T, D = q
    *k_lead, S, k_D = k
    *v_lead, v_S, Dv = v
    if k_D != D:
        raise ShapeError(msg("shape.k_width", D=D, shape=shape_str(k)))
    if v_S != S:
        raise ShapeError(msg("shape.v_length", S=S, shape=shape_str(v)))
    batch: tuple[int, ...] | None = tuple(q_lead)
    if not q_lead == k_lead == v_lead:  # the common case has nothing to broadcast
        batch = broadcast_shapes(q_lead, k_lead, v_lead)
    if batch is None:
        raise ShapeError(msg("shape.batch", q=shape_str(q), k=shape_str(k), v=shape_str(v)))
    return AttentionShapes(batch, T, S, D, Dv)


def check_score_elements(
    score_shape: Shape, hint: str | Message, *, limit: int | None = None
) -> None:
    """Refuse a score matrix of more than ``limit`` (default
    :data:`attnlab.checks.MAX_ELEMENTS`) elements before it is built; ``hint`` says what
    to do instead."""
    limit = MAX_ELEMENTS if limit is None else limit
    n_scores = 1
    for size in score_shape:
        n_scores *= int(size)
    if n_scores > limit:
        raise AttnlabError(msg("shape.score_elements", shape=shape_str(score_shape),
                               count=f"{n_scores:,}", limit=f"{limit:,}", hint=hint))


def check_alibi_slopes_shape(shape: Shape, batch: Shape) -> None:
    """ALiBi's slopes (H,) or (B, H), broadcasting against the batch dims (..., H) of q."""
    if len(shape) not in (1, 2):
        raise ShapeError(msg("kernel.alibi_ndim", shape=shape_str(shape)))
    check_broadcastable(shape, batch, "alibi_slopes", "the batch dims (..., H)")


def check_sinks_shape(shape: Shape, batch: Shape) -> None:
    """Attention sinks (H,): one logit per head of q (..., H, T, D), ``batch`` = q's
    leading dims (..., H)."""
    if len(shape) != 1:
        raise ShapeError(msg("kernel.sinks_ndim", shape=shape_str(shape)))
    if not batch or int(batch[-1]) != int(shape[0]):
        raise ShapeError(msg("kernel.sinks_heads", heads=shape_str(tuple(batch)[-1:] or (1,)),
                             shape=shape_str(shape)))


# ------------------------------------------------------------------ multi-head attention


def check_module_inputs(
    query: Shape, key: Shape, value: Shape, E: int, Ekv: int,
    names: tuple[str, str, str] = ("query", "key", "value"), Ev: int | None = None,
) -> tuple[tuple[int, ...], int, int]:
    """Shapes of multi-head attention's inputs: query (B, T, E) or (T, E), key and value
    (B, S, Ekv) or (S, Ekv) with the same batch (value (B, S, Ev) when ``Ev`` is given);
    returns (lead, T, S), lead = (B,) or ()."""
    q_name, k_name, v_name = names
    if len(query) not in (2, 3) or int(query[-1]) != E:
        raise ShapeError(msg("shape.module_query", name=q_name, E=E, shape=shape_str(query)))
    lead = tuple(int(n) for n in query[:-2])
    lead_str = f"{lead[0]}, " if lead else ""
    v_width, v_what = (Ekv, "d_context") if Ev is None else (Ev, "d_value_context")
    for name, shape, width, what in ((k_name, key, Ekv, "d_context"),
                                     (v_name, value, v_width, v_what)):
        if len(shape) != len(query) or tuple(shape[:-2]) != lead or int(shape[-1]) != width:
            raise ShapeError(msg("shape.module_context", name=name, lead=lead_str, width=width,
                                 query=q_name, what=what, shape=shape_str(shape)))
    S = int(key[-2])
    if int(value[-2]) != S:
        raise ShapeError(msg("shape.module_length", name=v_name, lead=lead_str, S=S,
                             width=v_width, keys_name=k_name, shape=shape_str(value)))
    return lead, int(query[-2]), S


def check_key_padding_shape(
    shape: Shape | None, dtype_name: str, is_bool: bool, expected: Shape
) -> None:
    """key_padding must be bool of exactly ``expected`` = (B, S) (True = a real token).

    ``shape`` None means "not an array"; ``dtype_name`` is then the received type's name.
    """
    if shape is None or not is_bool or tuple(shape) != tuple(expected):
        got = dtype_name if shape is None else f"{dtype_name} {shape_str(shape)}"
        raise ShapeError(msg("shape.key_padding", expected=shape_str(expected), got=got))


# ------------------------------------------------------------------ KV caches: inputs


def check_kv_shapes(k: Shape, v: Shape, B: int, Hkv: int, D: int, Dv: int) -> int:
    """k (B, Hkv, T, D) and v (B, Hkv, T, Dv) of T new tokens; returns T."""
    if len(k) != 4 or (int(k[0]), int(k[1])) != (B, Hkv) or int(k[3]) != D:
        raise ShapeError(
            f"k: expected (B, Hkv, T, D) = ({B}, {Hkv}, T, {D}), got {shape_str(k)}"
        )
    T = int(k[2])
    if tuple(int(n) for n in v) != (B, Hkv, T, Dv):
        raise ShapeError(
            f"v: expected (B, Hkv, T, Dv) = ({B}, {Hkv}, {T}, {Dv}) to match k, "
            f"got {shape_str(v)}"
        )
    return T


def check_cache_query_shape(q: Shape, B: int, Hkv: int, T: int, D: int) -> int:
    """q (B, H, T, D) with H a positive multiple of Hkv; returns H."""
    if (len(q) != 4 or int(q[0]) != B or (int(q[2]), int(q[3])) != (T, D)
            or int(q[1]) % Hkv or int(q[1]) == 0):
        raise ShapeError(
            f"q: expected (B, H, T, D) = ({B}, H, {T}, {D}) with H a positive multiple of "
            f"Hkv = {Hkv} and T matching k, got {shape_str(q)}"
        )
    return int(q[1])


# ------------------------------------------------------------------ KV caches: slots


def check_cache_room(length: int, T: int, max_len: int | None) -> None:
    """Refuse T new tokens that do not fit a cache holding ``length`` of ``max_len``."""
    if max_len is not None and length + T > max_len:
        raise AttnlabError(
            f"k: the cache is full: it holds {length} of max_len = {max_len} "
            f"positions, expected T <= {max_len - length} new tokens, got T = {T}; "
            "create it with a larger max_len, leave max_len=None to let it grow, or use "
            "SlidingWindowKVCache"
        )


def grown_capacity(capacity: int, needed: int) -> int:
    """The capacity after doubling ``capacity`` until ``needed`` positions fit
    (amortised O(1) per appended token).

    >>> grown_capacity(256, 300), grown_capacity(256, 256)
    (512, 256)
    """
    while capacity < needed:
        capacity *= 2
    return capacity


def held_positions(length: int, window: int) -> range:
    """The positions a W-slot rolling buffer holds after ``length`` appended tokens:
    the last ``min(length, W)``. Position p lives in slot ``p mod W``.

    >>> held_positions(5, 3), held_positions(2, 3)
    (range(2, 5), range(0, 2))
    """
    return range(max(0, length - window), length)


def ring_segments(start: int, stop: int, window: int) -> list[tuple[int, int, int]]:
    """Positions ``start .. stop - 1`` (at most W of them) in a W-slot ring, as at most
    two contiguous runs ``(offset, slot, count)``: positions ``start + offset ..`` live
    in slots ``slot .. slot + count - 1``.

    Writing a chunk, or reading the buffer in position order, is then one or two
    slice copies instead of a gather.

    >>> ring_segments(3, 7, 4)   # positions 3, 4, 5, 6 -> slots 3 | 0, 1, 2
    [(0, 3, 1), (1, 0, 3)]
    """
    count = stop - start
    if count > window:
        raise ValueError(f"ring_segments: {count} positions do not fit {window} slots")
    if count <= 0:
        return []
    slot = start % window
    first = min(count, window - slot)
    segments = [(0, slot, first)]
    if first < count:
        segments.append((first, 0, count - first))
    return segments


# ------------------------------------------------------------------ sliding windows


def check_window(window: object, is_causal: bool) -> int:
    """W >= 1; a symmetric window (``is_causal=False``) must be odd."""
    W = check_positive_int(window, "window")
    if not is_causal and W % 2 == 0:
        raise AttnlabError(
            "window: a symmetric window (is_causal=False) holds the query and (W - 1) / 2 keys "
            f"on each side, so W must be odd; got {W} (use {W - 1} or {W + 1})"
        )
    return W


def check_positions(positions: Sequence[int], name: str, S: int) -> tuple[int, ...]:
    """Distinct key positions in [0, S), returned sorted (``global_tokens``).

    ``positions`` are Python ints: each twin first checks that its array is 1-D
    and of an integer dtype, then hands over ``.tolist()``.
    """
    ints = [int(p) for p in positions]
    if ints and (min(ints) < 0 or max(ints) >= S):
        raise AttnlabError(msg("shape.positions_range", name=name, S=S, got=ints))
    if len(set(ints)) != len(ints):
        raise AttnlabError(msg("shape.positions_distinct", name=name, got=ints))
    return tuple(sorted(ints))


# ------------------------------------------------------------- causal and window bands


CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")


class Band(NamedTuple):
    """Which keys each query may reach by position: the causal rule and the window, as one band.

    Query i sits at position ``offset + i`` (``offset`` = S - T bottom-right, as
    FlashAttention; 0 top-left, as torch's ``is_causal`` and JAX), key j at j.
    Query i may attend key j iff ``p - left <= j <= p + right`` with p = offset + i;
    ``left`` / ``right`` None = unbounded on that side.
    """

    left: int | None
    right: int | None
    offset: int

    def reaches(self, p_low: int, p_high: int, k_low: int, k_high: int) -> str:
        """For queries at positions [p_low, p_high] and keys [k_low, k_high]: "none" if no
        pair is in the band, "all" if every pair is, else "some"."""
        if (self.right is not None and k_low > p_high + self.right) or (
                self.left is not None and k_high < p_low - self.left):
            return "none"
        if (self.right is None or k_high <= p_low + self.right) and (
                self.left is None or k_low >= p_high - self.left):
            return "all"
        return "some"


def check_causal_alignment(causal_alignment: object) -> str:
    """``"bottom_right"`` (the default: query i at S - T + i) or ``"top_left"`` (query i at i)."""
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise AttnlabError(
            f"causal_alignment: expected 'bottom_right' or 'top_left', got {causal_alignment!r}"
        )
    return str(causal_alignment)


def check_window_pair(window: object, is_causal: bool) -> tuple[int | None, int | None] | None:
    """``window`` as (left, right) key counts, None = unbounded; None for no window.

    - an int W keeps its meaning everywhere in attnlab: with ``is_causal`` the W
      most recent keys, itself included, (W - 1, 0); without, W odd and the
      query with (W - 1) / 2 keys on each side;
    - a pair (left, right) of ints >= -1 is FlashAttention's ``window_size``:
      query at p attends keys p - left <= j <= p + right, -1 = unbounded.
      ``is_causal`` then also cuts at j <= p (right becomes 0, as FlashAttention does).
    """
    if window is None:
        return None
    if isinstance(window, tuple | list):
        if len(window) != 2:
            raise AttnlabError(
                f"window: expected an int W or a pair (left, right), got {len(window)} values "
                f"{tuple(window)!r}"
            )
        sides: list[int | None] = []
        for side, value in zip(("left", "right"), window, strict=True):
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise AttnlabError(
                    f"window: expected ({side} = an int >= -1, ...), got {value!r} for {side}"
                )
            count = int(value.__index__())
            if count < -1:
                raise AttnlabError(
                    f"window: expected {side} >= -1 (-1 = unbounded), got {count}"
                )
            sides.append(None if count == -1 else count)
        left, right = (_unbounded_past_any_length(side) for side in sides)
        if is_causal:
            right = 0 if right is None else min(right, 0)
        return left, right
    W = check_window(window, is_causal)
    half = _unbounded_past_any_length((W - 1) // 2)
    return (_unbounded_past_any_length(W - 1), 0) if is_causal else (half, half)


#: A window side this long reaches past any sequence attnlab can hold (MAX_ELEMENTS
#: positions): it is unbounded, and 10**30 would overflow int64 in the band's arithmetic.
_LONGEST_SIDE = 2**62


def _unbounded_past_any_length(side: int | None) -> int | None:
    return None if side is None or side >= _LONGEST_SIDE else side


def attention_band(
    T: int, S: int, *, is_causal: bool, window: tuple[int | None, int | None] | None,
    causal_alignment: str,
) -> Band | None:
    """The band of ``is_causal`` and a checked ``window`` (see :func:`check_window_pair`);
    None when neither restricts anything."""
    offset = S - T if causal_alignment == "bottom_right" else 0
    if window is None:
        return Band(None, 0, offset) if is_causal else None
    left, right = window
    if is_causal:
        right = 0 if right is None else min(right, 0)
    if left is None and right is None:
        return None
    return Band(left, right, offset)
