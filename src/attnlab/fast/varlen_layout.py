"""The packed layout of variable-length batches: cu_seqlens, their checks, the grouping.

Dimension legend: B sequences, H query heads, Hkv key/value heads, T_b / S_b
sequence b's query / key length, D head dim, Dv value dim.

A batch of B sequences packed along one token axis, FlashAttention's varlen
layout (see :mod:`attnlab.fast.varlen`)::

    q (total_q, H, D)    k (total_k, Hkv, D)    v (total_k, Hkv, Dv)
    cu_seqlens_q (B + 1,) int: sequence b's queries are rows cu_seqlens_q[b] : cu_seqlens_q[b + 1]
    cu_seqlens_k (B + 1,) int: its keys and values are rows cu_seqlens_k[b] : cu_seqlens_k[b + 1]

Here: building cu_seqlens from lengths, checking packed inputs once at the
public boundary (:func:`check_varlen_inputs` -> :class:`VarlenInputs`), and
what the forward and backward passes of both paths (plain and flash) share:
grouping sequences of equal lengths, each sequence's mask and its views.
The NumPy-free checks (:func:`check_sequences`, :func:`check_varlen_shapes`,
:func:`length_groups`) are also the torch twin's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import (
    as_array,
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    check_scale,
    describe,
    shape_str,
)
from ..errors import AttnlabError, ShapeError
from ..kernel import abs_max, check_score_range, check_softcap, low_precision_dtype
from ..masks import band_mask
from ..messages import msg
from ..shapes import attention_band, check_window_pair

__all__ = [
    "VarlenInputs",
    "check_cu_seqlens",
    "check_group_scores",
    "check_max_seqlen",
    "check_sequences",
    "check_varlen_inputs",
    "check_varlen_shapes",
    "cu_seqlens_from_lengths",
    "group_views",
    "grouped_view",
    "length_groups",
    "packed_groups",
    "sequence_allowed",
    "sequences_with_keys",
]


@dataclass(frozen=True)
class VarlenInputs:
    """Validated varlen inputs: packed arrays of one float dtype and checked sequence bounds."""

    q: np.ndarray  # (total_q, H, D)
    k: np.ndarray  # (total_k, Hkv, D)
    v: np.ndarray  # (total_k, Hkv, Dv)
    cu_seqlens_q: np.ndarray  # (B + 1,) int64
    cu_seqlens_k: np.ndarray  # (B + 1,) int64
    scale: float
    is_causal: bool
    out_dtype: np.dtype  # float16 / bfloat16 inputs compute in float32 and return as given
    window: tuple[int | None, int | None] | None = None  # (left, right), None = unbounded
    softcap: float | None = None

    @property
    def window_pair(self) -> tuple[int, int] | None:
        """The window as FlashAttention's (left, right), -1 = unbounded."""
        if self.window is None:
            return None
        left, right = self.window
        return (-1 if left is None else left, -1 if right is None else right)

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[1])


def cu_seqlens_from_lengths(lengths: Any) -> np.ndarray:  # (B,) -> (B + 1,) int64
    """``[0, l0, l0 + l1, ...]``: the cumulative sequence lengths of sequences of ``lengths``.

    >>> cu_seqlens_from_lengths([3, 1, 4]).tolist()
    [0, 3, 4, 8]
    """
    arr = as_array(lengths, "lengths", "a list of lengths")
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise AttnlabError(f"lengths: expected a 1-D list of integers, got {describe(lengths)}")
    if arr.size and arr.min() < 0:
        raise AttnlabError(f"lengths: expected lengths >= 0, got {int(arr.min())}")
    total = sum(int(n) for n in arr.tolist())  # Python ints: np.cumsum would wrap negative
    if total > np.iinfo(np.int64).max:
        raise AttnlabError(msg("varlen.total_int64", limit=np.iinfo(np.int64).max, got=total))
    return np.concatenate([[0], np.cumsum(arr, dtype=np.int64)]).astype(np.int64)


def check_cu_seqlens(cu_seqlens: Any, name: str, total: int, total_name: str) -> np.ndarray:
    """``cu_seqlens`` as an int64 array (B + 1,): starts at 0, never decreases, ends at ``total``.

    ``total_name`` names where ``total`` comes from in the message (``"q.shape[0]"``).
    """
    if hasattr(cu_seqlens, "detach") and hasattr(cu_seqlens, "tolist"):  # a torch tensor
        cu_seqlens = np.asarray(cu_seqlens.detach().cpu().tolist())
    arr = as_array(cu_seqlens, name, "a 1-D array of integers")
    if arr.size == 0:
        raise AttnlabError(f"{name}: expected (B + 1,) cumulative lengths starting at 0, "
                           "got an empty array")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
        raise AttnlabError(
            f"{name}: expected a 1-D integer array (B + 1,) of cumulative sequence lengths "
            f"starting at 0, got {describe(cu_seqlens)}"
        )
    arr = arr.astype(np.int64)
    if arr[0] != 0:
        raise AttnlabError(f"{name}: expected the first entry to be 0, got {int(arr[0])}")
    steps = np.diff(arr)
    if steps.size and steps.min() < 0:
        at = int(np.argmax(steps < 0))
        raise AttnlabError(
            f"{name}: expected non-decreasing cumulative lengths, got {int(arr[at])} then "
            f"{int(arr[at + 1])} at entries {at} and {at + 1}"
        )
    if arr[-1] != total:
        raise AttnlabError(
            f"{name}: expected the last entry to equal {total_name} = {total} (the packed "
            f"total), got {int(arr[-1])}"
        )
    return arr


def check_max_seqlen(value: Any, name: str, cu_seqlens: np.ndarray, cu_name: str) -> int:
    """``max_seqlen`` as an int, at least the longest sequence of ``cu_seqlens``."""
    max_value = check_positive_int(value, name, allow_zero=True)
    longest = int(np.diff(cu_seqlens).max()) if cu_seqlens.size > 1 else 0
    if max_value < longest:
        at = int(np.argmax(np.diff(cu_seqlens)))
        raise AttnlabError(
            f"{name}: expected at least the longest sequence of {cu_name}, {longest} "
            f"(sequence {at}), got {max_value}"
        )
    return max_value


def check_varlen_shapes(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> None:
    """q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), H a multiple of Hkv."""
    for shape, name, layout in ((q, "q", "(total_q, H, D)"), (k, "k", "(total_k, Hkv, D)"),
                                (v, "v", "(total_k, Hkv, Dv)")):
        if len(shape) != 3:
            raise ShapeError(f"{name}: expected the packed layout {layout}, "
                             f"got {shape_str(shape)}")
    H, D = int(q[1]), int(q[2])
    total_k, Hkv = int(k[0]), int(k[1])
    if int(k[2]) != D:
        raise ShapeError(f"k: expected (total_k, Hkv, {D}) to match q's head dim D = {D}, "
                         f"got {shape_str(k)}")
    if (int(v[0]), int(v[1])) != (total_k, Hkv):
        raise ShapeError(f"v: expected ({total_k}, {Hkv}, Dv) to match k's (total_k, Hkv), "
                         f"got {shape_str(v)}")
    if Hkv == 0 or H % Hkv:
        raise ShapeError(f"k: expected Hkv key/value heads dividing q's H = {H}, "
                         f"got Hkv = {Hkv} (k {shape_str(k)})")


def check_sequences(
    cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any, total_q: int,
    total_k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Both cu_seqlens (B + 1,) int64, checked against the totals, each other and max_seqlen."""
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", int(total_q), "q.shape[0]")
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", int(total_k), "k.shape[0]")
    if cu_q.size != cu_k.size:
        raise AttnlabError(
            f"cu_seqlens_k: expected as many sequences as cu_seqlens_q, {cu_q.size - 1} "
            f"({cu_q.size} entries), got {cu_k.size - 1} ({cu_k.size} entries)"
        )
    check_max_seqlen(max_seqlen_q, "max_seqlen_q", cu_q, "cu_seqlens_q")
    check_max_seqlen(max_seqlen_k, "max_seqlen_k", cu_k, "cu_seqlens_k")
    return cu_q, cu_k


def check_varlen_inputs(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
    max_seqlen_k: Any, *, is_causal: Any = False, scale: Any = None, window: Any = None,
    softcap: Any = None,
) -> VarlenInputs:
    """Validate packed varlen inputs, before any math.

    Shapes: q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) with H a
    multiple of Hkv; cu_seqlens_q, cu_seqlens_k (B + 1,) integers. Raises
    :class:`attnlab.AttnlabError` naming the argument, what was expected and
    what was received.
    """
    low_precision = low_precision_dtype(q, k, v)  # float16 / bfloat16: returned as given
    q_arr, k_arr, v_arr = (as_float_array(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    check_varlen_shapes(q_arr.shape, k_arr.shape, v_arr.shape)
    cu_q, cu_k = check_sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 q_arr.shape[0], k_arr.shape[0])
    D = q_arr.shape[2]
    is_causal = check_flag(is_causal, "is_causal")
    pair = check_window_pair(window, is_causal)
    cap = check_softcap(softcap)
    dtype = np.result_type(q_arr, k_arr, v_arr)
    q_arr, k_arr, v_arr = (a.astype(dtype, copy=False) for a in (q_arr, k_arr, v_arr))
    scale_value = check_scale(scale, D)
    check_score_range(abs_max(q_arr), abs_max(k_arr), D, scale_value, dtype)
    out_dtype = dtype if low_precision is None else low_precision
    return VarlenInputs(q_arr, k_arr, v_arr, cu_q, cu_k, scale_value, is_causal, out_dtype,
                        pair, cap)


def length_groups(cu_q: np.ndarray, cu_k: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Sequence indices grouped by their (T_b, S_b), in order of first appearance."""
    groups: dict[tuple[int, int], list[int]] = {}
    for b, lengths in enumerate(zip(np.diff(cu_q).tolist(), np.diff(cu_k).tolist(),
                                         strict=True)):
        groups.setdefault(lengths, []).append(b)
    return {lengths: np.asarray(members) for lengths, members in groups.items()}


def packed_groups(
    cu_q: np.ndarray, cu_k: np.ndarray
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """The groups of :func:`length_groups` that have queries (T_b > 0), each as T, S and
    the packed rows of its n sequences: rows_q (n, T), rows_k (n, S)."""
    for (T, S), members in length_groups(cu_q, cu_k).items():
        if T == 0:
            continue  # no queries: nothing to compute, no row to write
        rows_q = cu_q[members][:, None] + np.arange(T)  # (n, T) packed row indices
        rows_k = cu_k[members][:, None] + np.arange(S)  # (n, S)
        yield T, S, rows_q, rows_k


def sequence_allowed(
    T: int, S: int, is_causal: bool, window: tuple[int | None, int | None] | None
) -> np.ndarray | None:  # -> (T, S) or None
    """What a sequence's T queries may attend of its S keys: the bottom-right causal rule
    and the window (a checked (left, right)); None if everything."""
    band = attention_band(T, S, is_causal=is_causal, window=window,
                          causal_alignment="bottom_right")
    return None if band is None else band_mask(band, T, S)


def grouped_view(arr: np.ndarray, Hkv: int) -> np.ndarray:
    """(n, L, H, ·) rows of n sequences -> (n, Hkv, G, L, ·) with head h = g·G + j."""
    n, L, H, width = arr.shape
    return arr.reshape(n, L, Hkv, H // Hkv, width).transpose(0, 2, 3, 1, 4)


def group_views(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, rows_q: np.ndarray, rows_k: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The n sequences of one :func:`packed_groups` group as batched arrays: q
    (n, Hkv, G, T, D), k (n, Hkv, 1, S, D), v (n, Hkv, 1, S, Dv), key/value heads not copied."""
    q_g = grouped_view(q[rows_q], k.shape[1])  # (n, Hkv, G, T, D)
    k_g = k[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, D)
    v_g = v[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, Dv)
    return q_g, k_g, v_g


def check_group_scores(inputs: VarlenInputs) -> None:
    """Refuse a group of equal-length sequences whose scores would exceed attnlab's limit."""
    H = inputs.num_heads
    for (T, S), members in length_groups(inputs.cu_seqlens_q, inputs.cu_seqlens_k).items():
        check_alloc((len(members), H, T, S), inputs.q.dtype,
                    f"the score matrices of the {len(members)} sequences of lengths "
                    f"T = {T}, S = {S} (n, H, T, S)", "cu_seqlens_q")


def sequences_with_keys(
    inputs: VarlenInputs,
) -> Iterator[tuple[slice, slice, np.ndarray, np.ndarray, np.ndarray]]:
    """Each sequence with queries and keys (the others have nothing to attend to, so
    no output and no gradient): its rows and its q (Hkv, G, T, D), k (Hkv, 1, S, D),
    v (Hkv, 1, S, Dv) views."""
    for b in range(inputs.cu_seqlens_q.size - 1):
        rows_q = slice(int(inputs.cu_seqlens_q[b]), int(inputs.cu_seqlens_q[b + 1]))
        rows_k = slice(int(inputs.cu_seqlens_k[b]), int(inputs.cu_seqlens_k[b + 1]))
        if rows_q.stop == rows_q.start or rows_k.stop == rows_k.start:
            continue
        q_b = grouped_view(inputs.q[None, rows_q], inputs.num_kv_heads)[0]  # (Hkv, G, T, D)
        k_b = inputs.k[rows_k].transpose(1, 0, 2)[:, None]  # (Hkv, 1, S, D)
        v_b = inputs.v[rows_k].transpose(1, 0, 2)[:, None]  # (Hkv, 1, S, Dv)
        yield rows_q, rows_k, q_b, k_b, v_b
