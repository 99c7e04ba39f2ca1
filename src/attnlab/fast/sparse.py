"""Sparse attention: a sliding window (Longformer) and block-sparse patterns (BigBird).

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

from ..errors import (
    AttnlabError,
    ShapeError,
    as_array,
    check_alloc,
    check_flag,
    check_positive_int,
    shape_str,
)
from ..kernel import AttentionInputs, attend, check_inputs, check_key_padding

__all__ = [
    "sliding_window_mask",
    "sliding_window_attention",
    "bigbird_layout",
    "block_sparse_mask",
    "block_sparse_attention",
]


def _qkv(
    inputs: AttentionInputs,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...], float, np.dtype]:
    """q, k, v, batch dims, scale and output dtype of checked inputs (no T × S cap)."""
    return inputs.q, inputs.k, inputs.v, inputs.batch, inputs.scale, inputs.out_dtype


# ----------------------------------------------------------------------- validation


def _check_positions(positions: Any, name: str, S: int) -> np.ndarray:
    """A 1-D list of distinct key positions in [0, S), returned sorted."""
    arr = as_array(positions, name)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise AttnlabError(
            f"{name}: expected a 1-D list of integer key positions, got "
            f"{arr.dtype} {shape_str(arr.shape)}"
        )
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= S):
        raise AttnlabError(f"{name}: expected positions in [0, {S}), got {arr.tolist()}")
    if len(np.unique(arr)) != len(arr):
        raise AttnlabError(f"{name}: expected distinct positions, got {arr.tolist()}")
    return np.sort(arr)


def _check_window(window: Any, is_causal: bool) -> int:
    window = check_positive_int(window, "window")
    if not is_causal and window % 2 == 0:
        raise AttnlabError(
            "window: a symmetric window (is_causal=False) holds the query and (W - 1) / 2 keys "
            f"on each side, so W must be odd; got {window} (use {window - 1} or {window + 1})"
        )
    return window


# ------------------------------------------------------------- the shared inner step


def _attend_subset(
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
    query_pos: np.ndarray, key_pos: np.ndarray, window: int, is_causal: bool, global_pos: np.ndarray
) -> np.ndarray:
    """The sliding-window pattern on a grid of positions: (t,), (n,) -> (t, n) bool.

    The one definition used by both the mask helper and the fast path.
    """
    offset = key_pos[None, :] - query_pos[:, None]  # (t, n): key position - query position
    if is_causal:
        allowed = (offset <= 0) & (offset > -window)  # the W most recent keys, itself included
    else:
        allowed = np.abs(offset) <= (window - 1) // 2  # itself and (W - 1) / 2 each side
    if global_pos.size:
        allowed = allowed | np.isin(key_pos, global_pos)[None, :]  # everyone attends to them
        allowed = allowed | np.isin(query_pos, global_pos)[:, None]  # they attend to everyone
        if is_causal:
            allowed = allowed & (offset <= 0)
    return allowed  # (t, n)


def sliding_window_mask(
    T: int, window: int, *, is_causal: bool, S: int | None = None, global_tokens: Any = None
) -> np.ndarray:
    """The boolean mask of :func:`sliding_window_attention`: -> (T, S), True = may attend.

    Query i sits at position p = S - T + i (p = i when T == S); key j at position j.

    - ``is_causal=True``: the W most recent keys, itself included: p - W < j ≤ p.
    - ``is_causal=False``: W must be odd; the query and (W - 1) / 2 keys on each
      side: |j - p| ≤ (W - 1) / 2.
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
    window = _check_window(window, is_causal)
    global_pos = _check_positions([] if global_tokens is None else global_tokens,
                                  "global_tokens", S)
    check_alloc((T, S), np.bool_, "the sliding-window mask (T, S)", sizes)
    query_pos = np.arange(T) + (S - T)  # (T,)
    return _window_rule(query_pos, np.arange(S), window, is_causal, global_pos)  # (T, S)


def _window_chunk(window: int) -> int:
    """Queries per step: a chunk of c queries scores c + W - 1 keys each, so a
    small c wastes little work and a large c pays less Python overhead (W = 256
    at T = 16,384: c = 64 measured fastest, 32 and 128 within 1.5×)."""
    return int(min(128, max(32, window // 4)))


def sliding_window_attention(
    q: Any,
    k: Any,
    v: Any,
    window: int,
    *,
    is_causal: bool,
    global_tokens: Any = None,
    key_padding: Any = None,
    scale: float | None = None,
) -> np.ndarray:
    """Sliding-window attention (Longformer; Mistral when causal), without the T × S matrix.

    Shapes:
        q           (..., T, D)
        k           (..., S, D)
        v           (..., S, Dv)
        window      W ≥ 1: keys per query (see :func:`sliding_window_mask`);
                    odd when ``is_causal=False``
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
    q_arr, k_arr, v_arr, batch, scale_value, out_dtype = _qkv(
        check_inputs(q, k, v, scale=scale, tiled=True)
    )
    T, S, Dv = q_arr.shape[-2], k_arr.shape[-2], v_arr.shape[-1]
    is_causal = check_flag(is_causal, "is_causal")
    window = _check_window(window, is_causal)
    global_pos = _check_positions([] if global_tokens is None else global_tokens,
                                  "global_tokens", S)
    padding = check_key_padding(key_padding, batch, S)

    out = np.zeros((*batch, T, Dv), dtype=q_arr.dtype)  # (..., T, Dv)
    offset = S - T  # query i sits at position offset + i
    left = window - 1 if is_causal else (window - 1) // 2  # keys reachable before the query
    right = 0 if is_causal else (window - 1) // 2  # and after it
    chunk = _window_chunk(window)
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
        allowed = _window_rule(query_pos, key_pos, window, is_causal, global_pos)  # (c, n)
        allowed = _with_padding(allowed, padding, keys)  # (..., c, n)
        out[..., start:stop, :] = _attend_subset(
            q_arr[..., start:stop, :], k_sel, v_sel, allowed, scale_value
        )

    # Global queries attend to every key: their rows are redone against all S keys.
    global_rows = global_pos[global_pos >= offset] - offset  # query indices
    if global_rows.size:
        allowed = _window_rule(global_rows + offset, np.arange(S), window, is_causal, global_pos)
        allowed = _with_padding(allowed, padding, slice(None))  # (..., G, S)
        out[..., global_rows, :] = _attend_subset(
            q_arr[..., global_rows, :], k_arr, v_arr, allowed, scale_value
        )
    return out.astype(out_dtype, copy=False)


# -------------------------------------------------------------------- block sparse


def bigbird_layout(
    num_blocks: int,
    *,
    num_local_blocks: int = 3,
    num_global_blocks: int = 1,
    num_random_blocks: int = 2,
    seed: int = 0,
    is_causal: bool = False,
) -> np.ndarray:
    """BigBird's block layout: -> (n, n) bool, True = query block i attends to key block j.

    - local: the L blocks around the diagonal: |i - j| ≤ (L - 1) / 2 (L odd), or
      with ``is_causal`` the L blocks ending at the diagonal: i - L < j ≤ i;
    - global: the first G blocks attend to every block and every block to them;
    - random: each query block adds R more key blocks, drawn without
      replacement from those not yet chosen (and j ≤ i when causal) by
      ``numpy.random.default_rng(seed)``; fewer if fewer are left.

    >>> bigbird_layout(5, num_random_blocks=0).astype(int)
    array([[1, 1, 1, 1, 1],
           [1, 1, 1, 0, 0],
           [1, 1, 1, 1, 0],
           [1, 0, 1, 1, 1],
           [1, 0, 0, 1, 1]])
    """
    n = check_positive_int(num_blocks, "num_blocks", allow_zero=True)
    is_causal = check_flag(is_causal, "is_causal")
    local = check_positive_int(num_local_blocks, "num_local_blocks", allow_zero=True)
    if not is_causal and local % 2 == 0 and local > 0:
        raise AttnlabError(
            "num_local_blocks: a symmetric band (is_causal=False) holds the diagonal block and "
            f"(L - 1) / 2 on each side, so L must be odd; got {local}"
        )
    n_global = check_positive_int(num_global_blocks, "num_global_blocks", allow_zero=True)
    n_random = check_positive_int(num_random_blocks, "num_random_blocks", allow_zero=True)
    seed = check_positive_int(seed, "seed", allow_zero=True)
    check_alloc((n, n), np.int64, "the block layout (n, n)", "num_blocks")
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]  # (n, n): j - i
    if is_causal:
        layout = (offset <= 0) & (offset > -local)
    else:
        layout = np.abs(offset) <= (local - 1) // 2 if local else np.zeros((n, n), bool)
    layout[:, :n_global] = True
    layout[:n_global, :] = True
    if is_causal:
        layout &= offset <= 0
    rng = np.random.default_rng(seed)
    for i in range(n):
        candidates = np.flatnonzero(~layout[i] & ((offset[i] <= 0) if is_causal else True))
        if n_random and candidates.size:
            picked = rng.choice(candidates, size=min(n_random, candidates.size), replace=False)
            layout[i, picked] = True
    return layout  # (n, n)


def _resolve_layout(
    T: int,
    S: int,
    block_size: int,
    layout: Any,
    num_local_blocks: int | None,
    num_global_blocks: int | None,
    num_random_blocks: int | None,
    seed: int | None,
    is_causal: bool,
) -> np.ndarray:
    """The block layout (ceil(T/b), ceil(S/b)): the user's, checked, or BigBird's."""
    shape = (-(-T // block_size), -(-S // block_size))
    if layout is not None:
        given = [name for name, value in (
            ("num_local_blocks", num_local_blocks), ("num_global_blocks", num_global_blocks),
            ("num_random_blocks", num_random_blocks), ("seed", seed)) if value is not None]
        if given:
            raise AttnlabError(
                f"layout: a layout is given, so {', '.join(given)} must be left at None "
                "(they only describe BigBird's generated layout)"
            )
        arr = as_array(layout, "layout")
        if arr.dtype != np.bool_:
            raise AttnlabError(
                f"layout: expected a bool array (True = query block attends to key block), "
                f"got dtype {arr.dtype}"
            )
        if arr.shape != shape:
            raise ShapeError(
                f"layout: expected (ceil(T/b), ceil(S/b)) = {shape_str(shape)} for T = {T}, "
                f"S = {S}, b = {block_size}, got {shape_str(arr.shape)}"
            )
        return arr
    if T != S:
        raise AttnlabError(
            f"q, k: BigBird's generated layout is defined for self-attention (T == S), got "
            f"T = {T}, S = {S}; pass layout= (ceil(T/b), ceil(S/b)) for T != S"
        )
    return bigbird_layout(
        shape[0],
        num_local_blocks=3 if num_local_blocks is None else num_local_blocks,
        num_global_blocks=1 if num_global_blocks is None else num_global_blocks,
        num_random_blocks=2 if num_random_blocks is None else num_random_blocks,
        seed=0 if seed is None else seed,
        is_causal=is_causal,
    )


def _block_rule(
    layout: np.ndarray, block_size: int, query_pos: np.ndarray, key_pos: np.ndarray,
    offset: int, is_causal: bool,
) -> np.ndarray:
    """The block-sparse pattern on a grid: query indices (t,), key indices (n,) -> (t, n).

    Query index i belongs to block i // b and sits at position offset + i; the
    one definition used by both the mask helper and the fast path.
    """
    allowed = layout[np.ix_(query_pos // block_size, key_pos // block_size)]  # (t, n)
    if is_causal:
        allowed = allowed & (key_pos[None, :] <= query_pos[:, None] + offset)
    return allowed


def block_sparse_mask(
    T: int,
    block_size: int,
    *,
    S: int | None = None,
    num_local_blocks: int | None = None,
    num_global_blocks: int | None = None,
    num_random_blocks: int | None = None,
    seed: int | None = None,
    layout: Any = None,
    is_causal: bool = False,
) -> np.ndarray:
    """The boolean mask of :func:`block_sparse_attention`: -> (T, S), True = may attend.

    Query i belongs to block i // b, key j to block j // b; the last block of
    each is shorter when b does not divide T (or S). Query i may attend to key j
    when ``layout[i // b, j // b]`` and, with ``is_causal``, j ≤ S - T + i.
    ``layout`` (ceil(T/b), ceil(S/b)) bool is the user's, or BigBird's
    (:func:`bigbird_layout`; defaults L = 3 local, G = 1 global, R = 2 random
    blocks, seed 0; T == S only).

    >>> block_sparse_mask(5, 2, num_random_blocks=0, num_global_blocks=0,
    ...                   num_local_blocks=1).astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [0, 0, 1, 1, 0],
           [0, 0, 1, 1, 0],
           [0, 0, 0, 0, 1]])
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    block_size = check_positive_int(block_size, "block_size")
    is_causal = check_flag(is_causal, "is_causal")
    check_alloc((T, S), np.bool_, "the block-sparse mask (T, S)", sizes)
    grid = _resolve_layout(T, S, block_size, layout, num_local_blocks, num_global_blocks,
                           num_random_blocks, seed, is_causal)
    return _block_rule(grid, block_size, np.arange(T), np.arange(S), S - T, is_causal)  # (T, S)


def block_sparse_attention(
    q: Any,
    k: Any,
    v: Any,
    block_size: int,
    *,
    num_local_blocks: int | None = None,
    num_global_blocks: int | None = None,
    num_random_blocks: int | None = None,
    seed: int | None = None,
    layout: Any = None,
    is_causal: bool = False,
    key_padding: Any = None,
    scale: float | None = None,
) -> np.ndarray:
    """Block-sparse attention (BigBird, or any block layout) without the T × S matrix.

    Shapes:
        q           (..., T, D)
        k           (..., S, D)
        v           (..., S, Dv)
        block_size  b ≥ 1; the last block is shorter when b does not divide T or S
        layout      (ceil(T/b), ceil(S/b)) bool, True = query block attends to key
                    block; None = BigBird's (:func:`bigbird_layout` with
                    ``num_local_blocks`` L = 3, ``num_global_blocks`` G = 1,
                    ``num_random_blocks`` R = 2, ``seed`` 0; needs T == S)
        is_causal   also cut at j ≤ S - T + i inside the allowed blocks
        key_padding (..., S) bool, True = a real key (or None)
        ->          (..., T, Dv)

    Equivalent to the plain computation (which builds the T × S mask)::

        mask = block_sparse_mask(T, b, S=S, layout=layout, is_causal=causal, ...)
        if key_padding is not None:
            mask = mask & key_padding[..., None, :]       # (..., T, S)
        out = scaled_dot_product_attention(q, k, v, mask, scale=scale)

    Here each query block gathers only the key blocks its layout row allows:
    time O(T·r·b·D) and extra memory O(b·r·b) per batch item, where r is the
    number of key blocks in a row: linear in T when r is fixed (BigBird's
    global rows are the exception they are meant to be: r = S / b).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((10, 4))
    >>> block_sparse_attention(x, x, x, 4).shape   # 3 blocks: 4 + 4 + 2 rows
    (10, 4)
    """
    q_arr, k_arr, v_arr, batch, scale_value, out_dtype = _qkv(
        check_inputs(q, k, v, scale=scale, tiled=True)
    )
    T, S = q_arr.shape[-2], k_arr.shape[-2]
    block_size = check_positive_int(block_size, "block_size")
    is_causal = check_flag(is_causal, "is_causal")
    grid = _resolve_layout(T, S, block_size, layout, num_local_blocks, num_global_blocks,
                           num_random_blocks, seed, is_causal)
    width = max(q_arr.shape[-1], v_arr.shape[-1])
    for blocks in grid.shape:  # queries and keys are padded to whole blocks of b rows
        check_alloc((*batch, blocks * block_size, width), q_arr.dtype,
                    "the rows padded to whole blocks (..., n·b, D)", "block_size")
    padding = check_key_padding(key_padding, batch, S)

    return _block_sparse_core(q_arr, k_arr, v_arr, grid, block_size, is_causal, padding, batch,
                              scale_value).astype(out_dtype, copy=False)


#: Scores computed per step of the block-sparse path (elements), bounding its memory:
#: 2**18 float64 scores are 2 MiB, and a step holds about five such temporaries.
_BLOCK_STEP_ELEMENTS = 2**18


def _block_sparse_core(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, grid: np.ndarray, block_size: int,
    is_causal: bool, padding: np.ndarray | None, batch: tuple[int, ...], scale: float,
) -> np.ndarray:
    """Block-sparse attention over validated inputs: -> (..., T, Dv).

    Query blocks are grouped by how many key blocks their layout row holds
    (counts in (2^(j-1), 2^j] together), so a group gathers its key blocks into
    one (g, r·b) index array, padded to the group's largest count r with at most
    2× waste, and is computed in one batched product: BigBird's few global rows
    (r = S / b) form their own group instead of inflating all the others.
    """
    T, S, D, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    b = block_size
    n_q = grid.shape[0]
    q_blocks = np.zeros((*q.shape[:-2], n_q * b, D), dtype=q.dtype)  # (..., n_q·b, D)
    q_blocks[..., :T, :] = q
    q_blocks = q_blocks.reshape(*q.shape[:-2], n_q, b, D)  # (..., n_q, b, D)
    out = np.zeros((*batch, n_q, b, Dv), dtype=q.dtype)  # (..., n_q, b, Dv)
    counts = grid.sum(axis=1)  # (n_q,) key blocks per query block
    group_of = np.ceil(np.log2(np.maximum(counts, 1))).astype(int)
    batch_size = int(np.prod(batch, dtype=np.int64))
    within = np.arange(b)  # (b,)
    for group in np.unique(group_of[counts > 0]):
        rows = np.flatnonzero((group_of == group) & (counts > 0))  # (g,) query blocks
        r = int(counts[rows].max())
        # Each row's key blocks first (a stable sort of "not allowed"), then padding.
        order = np.argsort(~grid[rows], axis=1, kind="stable")[:, :r]  # (g, r)
        block_ok = np.take_along_axis(grid[rows], order, axis=1)  # (g, r)
        per_step = max(1, _BLOCK_STEP_ELEMENTS // max(1, batch_size * b * r * b))
        for first in range(0, rows.size, per_step):
            part = slice(first, first + per_step)
            key_pos = (order[part, :, None] * b + within).reshape(len(rows[part]), r * b)
            key_ok = (block_ok[part, :, None] & np.ones(b, bool)).reshape(key_pos.shape)
            key_ok &= key_pos < S  # (g, r·b): the last key block may be short
            key_pos = np.minimum(key_pos, S - 1)  # (g, r·b) gather indices, all in range
            allowed = key_ok[:, None, :]  # (g, 1, r·b)
            if is_causal:
                query_pos = rows[part, None] * b + within + (S - T)  # (g, b) positions
                allowed = allowed & (key_pos[:, None, :] <= query_pos[:, :, None])  # (g, b, r·b)
            if padding is not None:
                allowed = allowed & padding[..., key_pos][..., None, :]  # (..., g, b, r·b)
            out[..., rows[part], :, :] = _attend_subset(
                q_blocks[..., rows[part], :, :],  # (..., g, b, D)
                k[..., key_pos, :],  # (..., g, r·b, D)
                v[..., key_pos, :],  # (..., g, r·b, Dv)
                allowed, scale,
            )
    return out.reshape(*batch, n_q * b, Dv)[..., :T, :]  # (..., T, Dv)
