"""Sparse attention: a sliding window (Longformer).

Block-sparse patterns (BigBird) are in :mod:`attnlab.fast.block_sparse`, which
shares this module's inner step (:func:`attend_subset`).

Each function here is *exact for its pattern*: it equals
:func:`attnlab.scaled_dot_product_attention` with the boolean mask that the
matching ``*_mask`` helper returns (float64 to ~1e-16; the tests hold 1e-12).
What it saves is the T × S score matrix: queries are taken a chunk (or a
block) at a time against only the keys their pattern allows, so time and
memory grow linearly in T for a fixed window or block budget.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim; ``...`` is any number of leading (batch) dims.

Positions follow the library's causal alignment (bottom-right, as in
FlashAttention): key j sits at position j, query i at position S - T + i. With
T == S (self-attention) a query's position is its index.

Mask convention: True = may attend. ``key_padding`` (..., S) is True for a
real key and False for padding; it is combined with the pattern by AND. A
query with no key left gets output 0, as everywhere in attnlab.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_array, check_alloc, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError
from ..kernel import attend, check_inputs, check_key_padding
from ..messages import msg
from ..shapes import check_causal_alignment, check_positions, check_window_pair

__all__ = [
    "sliding_window_mask",
    "sliding_window_attention",
]



# ----------------------------------------------------------------------- validation


def _check_positions(positions: Any, name: str, S: int) -> np.ndarray:
    """A 1-D list of distinct key positions in [0, S), returned sorted: the array's own
    check here, the positions' in :func:`attnlab.shapes.check_positions` (the torch twin's)."""
    arr = as_array(positions, name)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise AttnlabError(
            f"{name}: expected a 1-D list of integer key positions, got "
            f"{arr.dtype} {shape_str(arr.shape)}"
        )
    return np.array(check_positions(arr.tolist(), name, S), dtype=np.int64)  # (n,) sorted


def _check_window(window: Any, is_causal: bool, far: int) -> tuple[int, int]:
    """``window`` (an int W or FlashAttention's (left, right)) as key counts before and
    after the query; unbounded sides become ``far`` = T + S (no key lies further)."""
    pair = check_window_pair(window, is_causal)
    if pair is None:
        raise AttnlabError(msg("sparse.window_required"))
    left, right = pair
    return (far if left is None else left), (far if right is None else right)


# ------------------------------------------------------------- the shared inner step


def attend_subset(
    q_rows: np.ndarray, k_sel: np.ndarray, v_sel: np.ndarray, allowed: np.ndarray, scale: float
) -> np.ndarray:
    """Dense attention of a few query rows against a few gathered keys.

    Shapes: q_rows (..., t, D), k_sel (..., n, D), v_sel (..., n, Dv),
    allowed bool broadcastable to (..., t, n) -> (..., t, Dv).

    Softmax over the allowed subset equals softmax over all S keys with the
    others at -inf: those add exp(-inf) = 0 to the sum and cannot be the maximum.
    """
    return attend(q_rows, k_sel, v_sel, allowed, None, scale)[0]  # (..., t, Dv)


def _with_padding(allowed: np.ndarray, padding: np.ndarray | None, keys: Any) -> np.ndarray:
    """allowed (t, n) AND the padding of the gathered keys: -> (..., t, n)."""
    if padding is None:
        return allowed
    return allowed & padding[..., None, keys]  # (..., t, n)


# ------------------------------------------------------------------ sliding window


def _window_rule(
    query_pos: np.ndarray, key_pos: np.ndarray, window: tuple[int, int], is_causal: bool,
    global_pos: np.ndarray,
) -> np.ndarray:
    """The sliding-window pattern on a grid of positions: (t,), (n,) -> (t, n) bool.

    ``window`` = (left, right): keys p - left ≤ j ≤ p + right. The one definition
    used by both the mask helper and the fast path.
    """
    offset = key_pos[None, :] - query_pos[:, None]  # (t, n): key position - query position
    left, right = window
    allowed = (offset >= -left) & (offset <= right)  # (t, n)
    if global_pos.size:
        allowed = allowed | np.isin(key_pos, global_pos)[None, :]  # everyone attends to them
        allowed = allowed | np.isin(query_pos, global_pos)[:, None]  # they attend to everyone
        if is_causal:
            allowed = allowed & (offset <= 0)
    return allowed  # (t, n)


def sliding_window_mask(
    T: int, window: Any, *, is_causal: bool, S: int | None = None, global_tokens: Any = None,
    causal_alignment: str = "bottom_right",
) -> np.ndarray:
    """The boolean mask of :func:`sliding_window_attention`: -> (T, S), True = may attend.

    Query i sits at position p = S - T + i (p = i when T == S, or with
    ``causal_alignment="top_left"``); key j at position j.

    - ``is_causal=True``: the W most recent keys, itself included: p - W < j ≤ p.
    - ``is_causal=False``: W must be odd; the query and (W - 1) / 2 keys on each
      side: |j - p| ≤ (W - 1) / 2.
    - ``window=(left, right)`` (FlashAttention's ``window_size``, -1 = unbounded):
      p - left ≤ j ≤ p + right, and j ≤ p too with ``is_causal``; any widths,
      even or asymmetric.
    - ``global_tokens``: key positions that every query attends to, and whose
      own query rows (if among the T queries) attend to every key; with
      ``is_causal`` both are still cut at j ≤ p.

    Rows near the edges hold fewer than W keys. A causal window of W ≥ S, or a
    symmetric one of W ≥ 2S - 1, covers everything: plain (causal) attention.

    >>> sliding_window_mask(5, 2, is_causal=True).astype(int)
    array([[1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [0, 1, 1, 0, 0],
           [0, 0, 1, 1, 0],
           [0, 0, 0, 1, 1]])
    >>> sliding_window_mask(5, 3, is_causal=False, global_tokens=[0]).astype(int)
    array([[1, 1, 1, 1, 1],
           [1, 1, 1, 0, 0],
           [1, 1, 1, 1, 0],
           [1, 0, 1, 1, 1],
           [1, 0, 0, 1, 1]])
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    is_causal = check_flag(is_causal, "is_causal")
    sides = _check_window(window, is_causal, T + S)
    global_pos = _check_positions([] if global_tokens is None else global_tokens,
                                  "global_tokens", S)
    check_alloc((T, S), np.bool_, "the sliding-window mask (T, S)", sizes)
    offset = S - T if check_causal_alignment(causal_alignment) == "bottom_right" else 0
    query_pos = np.arange(T) + offset  # (T,)
    return _window_rule(query_pos, np.arange(S), sides, is_causal, global_pos)  # (T, S)


def _window_chunk(window: int) -> int:
    """Queries per step: a chunk of c queries scores c + W - 1 keys each, so a
    small c wastes little work and a large c pays less Python overhead (W = 256
    at T = 16,384: c = 64 measured fastest, 32 and 128 within 1.5×)."""
    return int(min(128, max(32, window // 4)))


def sliding_window_attention(
    q: Any,
    k: Any,
    v: Any,
    window: Any,
    *,
    is_causal: bool,
    global_tokens: Any = None,
    key_padding: Any = None,
    scale: float | None = None,
    causal_alignment: str = "bottom_right",
) -> np.ndarray:
    """Sliding-window attention (Longformer; Mistral when causal), without the T × S matrix.

    Shapes:
        q           (..., T, D)
        k           (..., S, D)
        v           (..., S, Dv)
        window      W ≥ 1: keys per query (see :func:`sliding_window_mask`);
                    odd when ``is_causal=False``; or (left, right) as
                    FlashAttention's ``window_size`` (-1 = unbounded)
        is_causal   True: the W most recent keys; False: W centred on the query.
                    Required: the same W means different keys in the two cases.
        global_tokens  key positions attended by all and attending to all (or None)
        key_padding (..., S) bool, True = a real key (or None)
        ->          (..., T, Dv)

    Equivalent to the plain computation (which builds the T × S mask)::

        mask = sliding_window_mask(T, W, is_causal=causal, S=S, global_tokens=global_tokens)
        if key_padding is not None:
            mask = mask & key_padding[..., None, :]       # (..., T, S)
        out = scaled_dot_product_attention(q, k, v, mask, scale=scale)

    Here queries go in chunks of c; each chunk scores only the c + W - 1 keys
    its window can reach plus the G global keys, and the G global query rows
    are scored against all S keys. Time O(T·(c + W + G)·D + G·S·D), extra
    memory O(c·(c + W + G)) per batch item: linear in T for fixed W and G.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((6, 4))
    >>> sliding_window_attention(x, x, x, 3, is_causal=True).shape
    (6, 4)
    """
    inputs = check_inputs(q, k, v, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, batch, scale_value, out_dtype = (
        inputs.q, inputs.k, inputs.v, inputs.batch, inputs.scale, inputs.out_dtype
    )
    T, S, Dv = q_arr.shape[-2], k_arr.shape[-2], v_arr.shape[-1]
    is_causal = check_flag(is_causal, "is_causal")
    sides = _check_window(window, is_causal, T + S)
    global_pos = _check_positions([] if global_tokens is None else global_tokens,
                                  "global_tokens", S)
    padding = check_key_padding(key_padding, batch, S)

    out = np.zeros((*batch, T, Dv), dtype=q_arr.dtype)  # (..., T, Dv)
    alignment = check_causal_alignment(causal_alignment)
    offset = S - T if alignment == "bottom_right" else 0  # query i sits at position offset + i
    left, right = sides  # keys reachable before the query, and after it
    chunk = _window_chunk(min(left + right + 1, max(S, 1)))
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        query_pos = np.arange(start, stop) + offset  # (c,)
        low = max(0, int(query_pos[0]) - left)
        high = min(S, int(query_pos[-1]) + right + 1)  # band keys: [low, high)
        if high <= low:
            low = high = 0  # the whole chunk lies before the first key (T > S, causal)
        extra = global_pos[(global_pos < low) | (global_pos >= high)]
        keys: Any
        if extra.size:
            keys = np.concatenate([np.arange(low, high), extra])  # (n,)
            key_pos = keys
            k_sel, v_sel = k_arr[..., keys, :], v_arr[..., keys, :]  # (..., n, D), (..., n, Dv)
        else:
            keys = slice(low, high)  # a view, no copy
            key_pos = np.arange(low, high)
            k_sel, v_sel = k_arr[..., keys, :], v_arr[..., keys, :]
        allowed = _window_rule(query_pos, key_pos, sides, is_causal, global_pos)  # (c, n)
        allowed = _with_padding(allowed, padding, keys)  # (..., c, n)
        out[..., start:stop, :] = attend_subset(
            q_arr[..., start:stop, :], k_sel, v_sel, allowed, scale_value
        )

    # Global queries attend to every key: their rows are redone against all S keys.
    global_rows = global_pos[(global_pos >= offset) & (global_pos < offset + T)] - offset
    if global_rows.size:
        allowed = _window_rule(global_rows + offset, np.arange(S), sides, is_causal, global_pos)
        allowed = _with_padding(allowed, padding, slice(None))  # (..., G, S)
        out[..., global_rows, :] = attend_subset(
            q_arr[..., global_rows, :], k_arr, v_arr, allowed, scale_value
        )
    return out.astype(out_dtype, copy=False)
