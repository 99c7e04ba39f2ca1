"""Block-sparse attention (BigBird): a block layout, its mask and the fast path.

The sliding window (Longformer) is in :mod:`attnlab.fast.sparse`, whose inner
step (:func:`~attnlab.fast.sparse.attend_subset`) this module shares.

Exact for its pattern, linear in T for a fixed block budget, with the positions,
the dimension legend and the mask convention (True = may attend; ``key_padding``
True for a real key; a query with no key left gets 0) of :mod:`attnlab.fast.sparse`:
each function equals :func:`attnlab.scaled_dot_product_attention` with the boolean
mask :func:`block_sparse_mask` returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_array, check_alloc, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..kernel import check_inputs, check_key_padding
from .sparse import attend_subset

__all__ = [
    "bigbird_layout",
    "block_sparse_mask",
    "block_sparse_attention",
]


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
    inputs = check_inputs(q, k, v, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, batch, scale_value, out_dtype = (
        inputs.q, inputs.k, inputs.v, inputs.batch, inputs.scale, inputs.out_dtype
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
            out[..., rows[part], :, :] = attend_subset(
                q_blocks[..., rows[part], :, :],  # (..., g, b, D)
                k[..., key_pos, :],  # (..., g, r·b, D)
                v[..., key_pos, :],  # (..., g, r·b, Dv)
                allowed, scale,
            )
    return out.reshape(*batch, n_q * b, Dv)[..., :T, :]  # (..., T, Dv)
