"""Variable-length batches without padding: FlashAttention's "varlen" layout, plain and tiled.

A batch of B sequences of different lengths is packed along one token axis,
with no padding, and ``cu_seqlens`` (cumulative sequence lengths) say where
each sequence starts::

    q (total_q, H, D)    k (total_k, Hkv, D)    v (total_k, Hkv, Dv)
    cu_seqlens_q (B + 1,) int: sequence b's queries are rows cu_seqlens_q[b] : cu_seqlens_q[b + 1]
    cu_seqlens_k (B + 1,) int: its keys and values are rows cu_seqlens_k[b] : cu_seqlens_k[b + 1]
    max_seqlen_q, max_seqlen_k: at least the longest query / key sequence
    -> out (total_q, H, Dv)

(the layout of FlashAttention's ``flash_attn_varlen_func``: cu_seqlens start at
0, never decrease, and end at total_q / total_k.) Attention never crosses a
sequence boundary: the result is the plain attention of each sequence alone,
the computation below (which the tests run as the reference)::

    for b in range(B):
        rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])     # T_b queries
        rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])     # S_b keys
        out[rows_q] = scaled_dot_product_attention(              # (H, T_b, Dv) -> (T_b, H, Dv)
            q[rows_q].transpose(1, 0, 2),
            repeat(k[rows_k], H // Hkv, axis=1).transpose(1, 0, 2),
            repeat(v[rows_k], H // Hkv, axis=1).transpose(1, 0, 2),
            is_causal=is_causal).transpose(1, 0, 2)

``is_causal`` applies per sequence, bottom-right aligned as everywhere in
attnlab: query i of sequence b sits at position S_b - T_b + i and sees that
sequence's keys 0 .. S_b - T_b + i. So do ``window`` (an int W, or
FlashAttention's ``window_size=(left, right)``, -1 = unbounded) and
``softcap`` (c·tanh(scores / c)), as in ``flash_attn_varlen_func``. Query
head h reads key/value head h // (H / Hkv) (GQA, as FlashAttention's varlen
accepts). A sequence with no
keys, or a causal query that sees none, gets output 0 (lse -inf; the sink's logit
with ``sinks`` (H,), one logit per query head that joins each row's softmax and
takes no value, as in :func:`attnlab.scaled_dot_product_attention`).

- :func:`varlen_attention` is the plain path: per sequence it builds the
  (H, T_b, S_b) score matrix, never a (total_q, total_k) one; sequences of the
  same lengths go through one batched product.
- :func:`flash_varlen_attention` computes each sequence tile by tile with
  :func:`attnlab.fast.flash.flash_attention`: memory O(total·Dv + tiles), no
  score matrix at all; :func:`flash_varlen_attention_backward` gives the gradients.
- :func:`varlen_attention_backward` is the plain backward, the twin of the flash one.

Dimension legend: B sequences, H query heads, Hkv key/value heads, T_b / S_b
sequence b's query / key length, D head dim, Dv value dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

import numpy as np

from ..backward import attention_backward, check_upstream
from ..errors import (
    AttnlabError,
    ShapeError,
    as_array,
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    check_scale,
    describe,
    shape_str,
)
from ..kernel import (
    abs_max,
    attend,
    check_score_range,
    check_sinks,
    check_softcap,
    low_precision_dtype,
)
from ..masks import band_mask
from ..messages import msg
from ..shapes import attention_band, check_window_pair
from .flash import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    flash_attention,
    flash_attention_backward,
    join_sinks,
)
from .flash_parts import as_forward

__all__ = [
    "VarlenGrads",
    "VarlenInputs",
    "VarlenSinkGrads",
    "attend_packed",
    "check_cu_seqlens",
    "check_max_seqlen",
    "check_sequences",
    "check_varlen_shapes",
    "check_varlen_inputs",
    "cu_seqlens_from_lengths",
    "flash_varlen_attention",
    "flash_varlen_attention_backward",
    "length_groups",
    "sequence_allowed",
    "varlen_attention",
    "varlen_attention_backward",
]

_LSE_DTYPE = np.dtype(np.float64)  # as flash_attention returns it


class VarlenGrads(NamedTuple):
    """Gradients of a varlen attention, packed like their inputs."""

    dq: np.ndarray  # (total_q, H, D)
    dk: np.ndarray  # (total_k, Hkv, D)
    dv: np.ndarray  # (total_k, Hkv, Dv)


class VarlenSinkGrads(NamedTuple):
    """Gradients of a varlen attention with ``sinks``: those of :class:`VarlenGrads` and the
    sink logits'."""

    dq: np.ndarray  # (total_q, H, D)
    dk: np.ndarray  # (total_k, Hkv, D)
    dv: np.ndarray  # (total_k, Hkv, Dv)
    dsinks: np.ndarray  # (H,)


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


def sequence_allowed(
    T: int, S: int, is_causal: bool, window: tuple[int | None, int | None] | None
) -> np.ndarray | None:  # -> (T, S) or None
    """What a sequence's T queries may attend of its S keys: the bottom-right causal rule
    and the window (a checked (left, right)); None if everything."""
    band = attention_band(T, S, is_causal=is_causal, window=window,
                          causal_alignment="bottom_right")
    return None if band is None else band_mask(band, T, S)


def _grouped_view(arr: np.ndarray, Hkv: int) -> np.ndarray:
    """(n, L, H, ·) rows of n sequences -> (n, Hkv, G, L, ·) with head h = g·G + j."""
    n, L, H, width = arr.shape
    return arr.reshape(n, L, Hkv, H // Hkv, width).transpose(0, 2, 3, 1, 4)


def attend_packed(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray, scale: float, is_causal: bool, out: np.ndarray | None = None,
    *, window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Plain attention of every packed sequence alone, on validated arrays; no checks.

    Shapes: q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), cu_seqlens
    (B + 1,) int64, sinks (H, 1, 1) from :func:`attnlab.kernel.check_sinks` or None
    -> out (total_q, H, Dv) (written into ``out`` if given). The
    sequences of one (T_b, S_b) are gathered into one batched
    :func:`attnlab.kernel.attend`: scores (n, Hkv, H / Hkv, T_b, S_b) per group.
    """
    total_q, H, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    if out is None:
        out = np.empty((total_q, H, Dv), dtype=q.dtype)  # (total_q, H, Dv)
    group_sinks = None if sinks is None else sinks.reshape(Hkv, H // Hkv, 1, 1)  # head g·G + j
    for (T, S), members in length_groups(cu_seqlens_q, cu_seqlens_k).items():
        if T == 0:
            continue
        rows_q = cu_seqlens_q[members][:, None] + np.arange(T)  # (n, T) packed row indices
        if S == 0:  # nothing to attend to (a sink takes no value): output 0, as the plain path
            out[rows_q] = 0.0
            continue
        rows_k = cu_seqlens_k[members][:, None] + np.arange(S)  # (n, S)
        q_g = _grouped_view(q[rows_q], Hkv)  # (n, Hkv, G, T, D)
        k_g = k[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, D)
        v_g = v[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, Dv)
        allowed = sequence_allowed(T, S, is_causal, window)  # (T, S)
        result, _ = attend(q_g, k_g, v_g, allowed, None, scale, softcap=softcap,
                           sinks=group_sinks)  # (n, Hkv, G, T, Dv)
        out[rows_q] = result.transpose(0, 3, 1, 2, 4).reshape(len(members), T, H, Dv)
    return out


def _check_group_scores(inputs: VarlenInputs) -> None:
    """Refuse a group of equal-length sequences whose scores would exceed attnlab's limit."""
    H = inputs.num_heads
    for (T, S), members in length_groups(inputs.cu_seqlens_q, inputs.cu_seqlens_k).items():
        check_alloc((len(members), H, T, S), inputs.q.dtype,
                    f"the score matrices of the {len(members)} sequences of lengths "
                    f"T = {T}, S = {S} (n, H, T, S)", "cu_seqlens_q")


def varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> np.ndarray:
    """Attention over a packed batch of sequences of different lengths, without padding.

    Shapes:
        q  (total_q, H, D)     k (total_k, Hkv, D)     v (total_k, Hkv, Dv)
        cu_seqlens_q, cu_seqlens_k (B + 1,) int: start at 0, never decrease,
            end at total_q / total_k
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence
        -> out (total_q, H, Dv)

    Equals :func:`attnlab.scaled_dot_product_attention` run on each sequence
    alone (see the module docstring); ``is_causal``, ``window`` (an int W or
    FlashAttention's (left, right), -1 = unbounded), ``softcap`` and ``sinks`` (H,),
    one logit per query head, apply per sequence, bottom-right aligned. The plain
    path: each sequence's (H, T_b, S_b) scores are built whole (sequences of equal
    lengths in one batched product), never a (total_q, total_k) matrix. Dtypes as in
    scaled_dot_product_attention (float16 computes in float32 and comes back as float16).

    >>> rng = np.random.default_rng(0)
    >>> cu = cu_seqlens_from_lengths([3, 5])  # two sequences, 8 tokens
    >>> q, k, v = rng.standard_normal((3, 8, 2, 4))  # (total, H, D) each
    >>> out = varlen_attention(q, k, v, cu, cu, 5, 5, is_causal=True)
    >>> from attnlab import scaled_dot_product_attention as sdpa
    >>> alone = sdpa(*(x[3:].transpose(1, 0, 2) for x in (q, k, v)), is_causal=True)
    >>> out.shape, bool(np.allclose(out[3:], alone.transpose(1, 0, 2)))
    ((8, 2, 4), True)
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    sink_logits = check_sinks(sinks, (inputs.num_heads,), inputs.q.dtype)  # (H, 1, 1)
    _check_group_scores(inputs)
    out = attend_packed(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                        inputs.scale, inputs.is_causal, window=inputs.window,
                        softcap=inputs.softcap, sinks=sink_logits)  # (total_q, H, Dv)
    return out.astype(inputs.out_dtype, copy=False)


def varlen_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window: Any = None,
    softcap: float | None = None,
) -> VarlenGrads:
    """Gradients of :func:`varlen_attention` (recomputes the forward), the plain path.

    Shapes: q, k, v, cu_seqlens as in the forward; dout (total_q, H, Dv) = ∂L/∂out
    -> dq (total_q, H, D), dk (total_k, Hkv, D), dv (total_k, Hkv, Dv).

    Per sequence, :func:`attnlab.backward.sdpa_backward`'s formula on its
    (H, T_b, S_b) weights; a key/value head shared by G query heads gets the sum
    of their gradients.
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    _check_group_scores(inputs)
    q_arr, k_arr, v_arr = inputs.q, inputs.k, inputs.v
    cu_q, cu_k = inputs.cu_seqlens_q, inputs.cu_seqlens_k
    H, Hkv, Dv = inputs.num_heads, inputs.num_kv_heads, v_arr.shape[2]
    dout_arr = check_upstream(dout, (q_arr.shape[0], H, Dv), "(total_q, H, Dv)", q_arr.dtype)
    dq, dk, dv = np.zeros_like(q_arr), np.zeros_like(k_arr), np.zeros_like(v_arr)
    for (T, S), members in length_groups(cu_q, cu_k).items():
        if T == 0 or S == 0:
            continue  # no weights, no gradient
        n = len(members)
        rows_q = cu_q[members][:, None] + np.arange(T)  # (n, T)
        rows_k = cu_k[members][:, None] + np.arange(S)  # (n, S)
        q_g = _grouped_view(q_arr[rows_q], Hkv)  # (n, Hkv, G, T, D)
        dout_g = _grouped_view(dout_arr[rows_q], Hkv)  # (n, Hkv, G, T, Dv)
        k_g = k_arr[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, D)
        v_g = v_arr[rows_k].transpose(0, 2, 1, 3)[:, :, None]  # (n, Hkv, 1, S, Dv)
        allowed = sequence_allowed(T, S, inputs.is_causal, inputs.window)  # (T, S)
        _, weights = attend(q_g, k_g, v_g, allowed, None, inputs.scale,
                            softcap=inputs.softcap)  # (n, Hkv, G, T, S)
        cap_slope = None
        if inputs.softcap is not None:  # d/ds c·tanh(s / c) = 1 - tanh²(s / c)
            raw = (q_g @ np.swapaxes(k_g, -1, -2)) * inputs.scale / inputs.softcap
            cap_slope = 1.0 - np.square(np.tanh(raw))  # (n, Hkv, G, T, S)
        dq_g, dk_g, dv_g, _ = attention_backward(q_g, k_g, v_g, weights, dout_g, inputs.scale,
                                                 cap_slope=cap_slope)
        dq[rows_q] = dq_g.transpose(0, 3, 1, 2, 4).reshape(n, T, H, -1)  # (n, T, H, D)
        dk[rows_k] = dk_g.sum(axis=2).transpose(0, 2, 1, 3)  # (n, S, Hkv, D): heads summed
        dv[rows_k] = dv_g.sum(axis=2).transpose(0, 2, 1, 3)  # (n, S, Hkv, Dv)
    out_dtype = inputs.out_dtype
    return VarlenGrads(*(g.astype(out_dtype, copy=False) for g in (dq, dk, dv)))


def _sequence_views(
    inputs: VarlenInputs, b: int
) -> tuple[slice, slice, np.ndarray, np.ndarray, np.ndarray]:
    """Sequence b's rows and its q (Hkv, G, T, D), k (Hkv, 1, S, D), v (Hkv, 1, S, Dv) views."""
    rows_q = slice(int(inputs.cu_seqlens_q[b]), int(inputs.cu_seqlens_q[b + 1]))
    rows_k = slice(int(inputs.cu_seqlens_k[b]), int(inputs.cu_seqlens_k[b + 1]))
    q_b = _grouped_view(inputs.q[None, rows_q], inputs.num_kv_heads)[0]  # (Hkv, G, T, D)
    k_b = inputs.k[rows_k].transpose(1, 0, 2)[:, None]  # (Hkv, 1, S, D)
    v_b = inputs.v[rows_k].transpose(1, 0, 2)[:, None]  # (Hkv, 1, S, Dv)
    return rows_q, rows_k, q_b, k_b, v_b


@overload
def flash_varlen_attention(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
    max_seqlen_k: int, *, is_causal: bool = ..., scale: float | None = ..., block_q: int = ...,
    block_k: int = ..., return_lse: Literal[False] = ..., window: Any = ...,
    softcap: float | None = ..., sinks: Any = ...,
) -> np.ndarray: ...
@overload
def flash_varlen_attention(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
    max_seqlen_k: int, *, is_causal: bool = ..., scale: float | None = ..., block_q: int = ...,
    block_k: int = ..., return_lse: Literal[True], window: Any = ...,
    softcap: float | None = ..., sinks: Any = ...,
) -> tuple[np.ndarray, np.ndarray]: ...
def flash_varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    return_lse: bool = False,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """:func:`varlen_attention` computed tile by tile: no score matrix, O(total) memory.

    Shapes: as :func:`varlen_attention` -> out (total_q, H, Dv), and lse (H, total_q)
    float64 if ``return_lse`` (FlashAttention's varlen layout: heads first).

    Each sequence goes through :func:`attnlab.fast.flash.flash_attention` on views
    of the packed arrays (its heads as the batch dims, the key/value heads
    broadcast over their query heads, never copied): the most held at once is
    the output, one sequence's copy of v and a few block_q × block_k tiles.
    Efficient implementation equivalent to :func:`varlen_attention` (the same
    ``is_causal``, ``window`` and ``softcap``; flash skips the tiles outside a
    sequence's band), with the log-sum-exp of each query's scores (-inf for a
    query with nothing to attend to), which :func:`flash_varlen_attention_backward`
    needs. With ``sinks`` (H,) each sequence's output and lse are joined with the
    sinks as :func:`attnlab.fast.flash.flash_attention` joins them (lse = the sink's
    logit for a query with no key); pass the same sinks to the backward.
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    return_lse = check_flag(return_lse, "return_lse")
    total_q, H = inputs.q.shape[:2]
    Dv = inputs.v.shape[2]
    sink_logits = check_sinks(sinks, (H,), _LSE_DTYPE)  # (H, 1, 1)
    out = np.zeros((total_q, H, Dv), dtype=inputs.q.dtype)  # (total_q, H, Dv)
    lse = np.full((H, total_q), -np.inf, dtype=_LSE_DTYPE)  # (H, total_q)
    if sink_logits is not None:  # a query with no key: all its weight on the sink
        lse[:] = sink_logits[:, :, 0]
    group_sinks = None if sink_logits is None else sink_logits.reshape(
        inputs.num_kv_heads, H // inputs.num_kv_heads, 1, 1)  # (Hkv, G, 1, 1), head g·G + j
    for b in range(inputs.cu_seqlens_q.size - 1):
        rows_q, rows_k, q_b, k_b, v_b = _sequence_views(inputs, b)
        T = rows_q.stop - rows_q.start
        if T == 0 or rows_k.stop == rows_k.start:
            continue  # no queries, or nothing to attend to: out 0, lse -inf
        out_b, lse_b = flash_attention(q_b, k_b, v_b, is_causal=inputs.is_causal,
                                       scale=inputs.scale, block_q=block_q, block_k=block_k,
                                       return_lse=True, window=inputs.window_pair,
                                       softcap=inputs.softcap)  # (Hkv, G, T, Dv), (Hkv, G, T)
        if group_sinks is not None:
            out_b, lse_b = join_sinks(out_b, lse_b, group_sinks)
        out[rows_q] = out_b.reshape(H, T, Dv).transpose(1, 0, 2)  # (T, H, Dv)
        lse[:, rows_q] = lse_b.reshape(H, T)
    out = out.astype(inputs.out_dtype, copy=False)
    return (out, lse) if return_lse else out


def flash_varlen_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    window: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> VarlenGrads | VarlenSinkGrads:
    """Gradients of :func:`flash_varlen_attention`, tile by tile from its log-sum-exp.

    Shapes: q, k, v, cu_seqlens as in the forward; out (total_q, H, Dv) and
    lse (H, total_q) the forward's (``return_lse=True``); dout (total_q, H, Dv) =
    ∂L/∂out -> dq (total_q, H, D), dk (total_k, Hkv, D), dv (total_k, Hkv, Dv).

    Per sequence, :func:`attnlab.fast.flash.flash_attention_backward`: no score
    matrix is stored. Equivalent to :func:`varlen_attention_backward`. With ``sinks``
    (H,), the forward's: out and lse are the sink-joined ones, and the result is a
    :class:`VarlenSinkGrads` with dsinks (H,) too (each key/value head's G query heads
    then go through the flash backward apart, one sink per query head).
    """
    inputs = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, is_causal=is_causal, scale=scale, window=window,
                                 softcap=softcap)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    total_q, H = inputs.q.shape[:2]
    Dv = inputs.v.shape[2]
    dtype = inputs.q.dtype
    out_arr = as_forward(out, "out", (total_q, H, Dv), "(total_q, H, Dv)", dtype)
    lse_arr = as_forward(lse, "lse", (H, total_q), "(H, total_q)", _LSE_DTYPE, allow_neginf=True)
    dout_arr = check_upstream(dout, (total_q, H, Dv), "(total_q, H, Dv)", dtype)
    sink_logits = check_sinks(sinks, (H,), _LSE_DTYPE)  # (H, 1, 1)
    dq, dk, dv = (np.zeros_like(a) for a in (inputs.q, inputs.k, inputs.v))
    dsinks = np.zeros(H, dtype=_LSE_DTYPE)  # (H,)
    Hkv = inputs.num_kv_heads
    G = H // Hkv
    for b in range(inputs.cu_seqlens_q.size - 1):
        rows_q, rows_k, q_b, k_b, v_b = _sequence_views(inputs, b)
        T = rows_q.stop - rows_q.start
        if T == 0 or rows_k.stop == rows_k.start:
            continue
        out_b = _grouped_view(out_arr[None, rows_q], Hkv)[0]  # (Hkv, G, T, Dv)
        dout_b = _grouped_view(dout_arr[None, rows_q], Hkv)[0]  # (Hkv, G, T, Dv)
        lse_b = lse_arr[:, rows_q].reshape(Hkv, H // Hkv, T)  # (Hkv, G, T)
        if sink_logits is not None:  # one key/value head at a time: its G heads' G sinks
            for g in range(Hkv):
                heads = slice(g * G, (g + 1) * G)
                dq_g, dk_g, dv_g, ds_g = flash_attention_backward(
                    q_b[g], k_b[g], v_b[g], out_b[g], lse_b[g], dout_b[g],
                    is_causal=inputs.is_causal, scale=inputs.scale, block_q=block_q,
                    block_k=block_k, window=inputs.window_pair, softcap=inputs.softcap,
                    sinks=sink_logits[heads, 0, 0],
                )  # (G, T, D), (1, S, D), (1, S, Dv), (G,)
                dq[rows_q, heads] = dq_g.transpose(1, 0, 2)  # (T, G, D)
                dk[rows_k, g] = dk_g[0]  # (S, D)
                dv[rows_k, g] = dv_g[0]  # (S, Dv)
                dsinks[heads] += ds_g
            continue
        dq_b, dk_b, dv_b = flash_attention_backward(
            q_b, k_b, v_b, out_b, lse_b, dout_b, is_causal=inputs.is_causal,
            scale=inputs.scale, block_q=block_q, block_k=block_k, window=inputs.window_pair,
            softcap=inputs.softcap,
        )  # (Hkv, G, T, D), (Hkv, 1, S, D), (Hkv, 1, S, Dv): summed over the G query heads
        dq[rows_q] = dq_b.reshape(H, T, -1).transpose(1, 0, 2)  # (T, H, D)
        dk[rows_k] = dk_b[:, 0].transpose(1, 0, 2)  # (S, Hkv, D)
        dv[rows_k] = dv_b[:, 0].transpose(1, 0, 2)  # (S, Hkv, Dv)
    out_dtype = inputs.out_dtype
    dq, dk, dv = (g.astype(out_dtype, copy=False) for g in (dq, dk, dv))
    if sink_logits is None:
        return VarlenGrads(dq, dk, dv)
    return VarlenSinkGrads(dq, dk, dv, dsinks.astype(out_dtype, copy=False))
