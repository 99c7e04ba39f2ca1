"""Relative positional information: RoPE (rotary) and ALiBi.

The absolute tables (sinusoidal and learned) are in :mod:`attnlab.positional`,
whose module docstring describes where each kind puts position in:

- RoPE (rotary): rotates queries and keys of every head, ``(..., T, D)``;
- ALiBi: an additive bias on the scores, ``(H, T, S)``, passed as ``bias``.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width.

Positions are absolute token indices starting at 0. For cached decoding the
new tokens do not start at 0: pass ``positions=`` (RoPE), or rely on ALiBi's
bottom-right alignment (query ``i`` sits at ``S - T + i``).

Everything here is NumPy only. Angles are computed in float64 and rounded once
to the dtype of the input, so float32 stays float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import (
    as_array,
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    shape_str,
)
from .errors import AttnlabError, ShapeError
from .positional import as_input, check_base, float_dtype, input_with_width

__all__ = [
    "rope_angles",
    "apply_rope",
    "RotaryEmbedding",
    "check_rope_head_dim",
    "alibi_slopes",
    "alibi_bias",
]


# --------------------------------------------------------------------------- RoPE


def check_rope_head_dim(head_dim: Any) -> int:
    """``head_dim`` as an even int > 0 (RoPE turns pairs of features), or an error."""
    head_dim = check_positive_int(head_dim, "head_dim")
    if head_dim % 2:
        raise AttnlabError(
            f"head_dim: RoPE rotates pairs of features, expected an even D, got {head_dim}"
        )
    return head_dim


def _as_positions(positions: Any, length: int | None) -> np.ndarray:  # -> (T,) int64
    """Positions as a 1-D int array; ``length`` (if given) is the T it must match.

    ``None`` means ``arange(T)``; an int ``p`` means ``p + arange(T)``.
    """
    if positions is None or isinstance(positions, (int, np.integer)):
        if length is None:
            raise AttnlabError(f"positions: expected an int array of shape (T,), got {positions!r}")
        offset = 0 if positions is None else check_positive_int(
            positions, "positions", allow_zero=True
        )
        return offset + np.arange(length, dtype=np.int64)  # (T,)
    arr = as_array(positions, "positions")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise AttnlabError(
            f"positions: expected integer positions, got dtype {arr.dtype}"
        )
    expected = "(T,)" if length is None else f"(T,) = ({length},)"
    if arr.ndim != 1 or (length is not None and arr.shape[0] != length):
        raise ShapeError(f"positions: expected shape {expected}, got {shape_str(arr.shape)}")
    if arr.size and arr.min() < 0:
        raise AttnlabError(f"positions: expected positions >= 0, got min {arr.min()}")
    return arr.astype(np.int64)


def rope_angles(
    positions: Any, head_dim: int, *, base: float = 10000.0, interleaved: bool = False
) -> tuple[np.ndarray, np.ndarray]:  # (T,) -> (T, D), (T, D)
    """Cosines and sines of the rotary angles ``positions[t] * theta_i``, float64.

    ``theta_i = base**(-2i / D)`` for ``i = 0 .. D/2 - 1`` (RoFormer; the
    ``inv_freq`` of Hugging Face). ``positions`` is an int array of shape (T,).
    The D columns follow the pairing of :func:`apply_rope`:

    - ``interleaved=False`` (GPT-NeoX / LLaMA): feature ``i`` is paired with
      ``i + D/2``, columns ``[theta_0 .. theta_{D/2-1}, theta_0 .. theta_{D/2-1}]``;
    - ``interleaved=True`` (RoFormer / GPT-J): feature ``2i`` is paired with
      ``2i + 1``, columns ``[theta_0, theta_0, theta_1, theta_1, ...]``.

    >>> cos, sin = rope_angles(np.arange(3), 4)
    >>> cos.shape, sin.shape
    ((3, 4), (3, 4))
    >>> cos[0].tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    head_dim = check_rope_head_dim(head_dim)
    base = check_base(base)
    interleaved = check_flag(interleaved, "interleaved")
    pos = _as_positions(positions, None).astype(np.float64)  # (T,)
    check_alloc((len(pos), head_dim), np.float64, "the angles (T, D)", "head_dim")
    inv_freq = base ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (D/2,)
    angles = pos[:, None] * inv_freq[None, :]  # (T, D/2)
    if interleaved:
        angles = np.repeat(angles, 2, axis=-1)  # (T, D)
    else:
        angles = np.concatenate([angles, angles], axis=-1)  # (T, D)
    return np.cos(angles), np.sin(angles)


def apply_rope(
    x: Any, positions: Any = None, *, base: float = 10000.0, interleaved: bool = False
) -> np.ndarray:  # (..., T, D) -> (..., T, D)
    """Rotate each pair of features of ``x`` by ``positions[t] * theta_i`` (RoPE).

    Apply it to queries and keys (not values), per head, before the scores.
    Because a rotation by ``m*theta`` followed by the transposed rotation by
    ``n*theta`` is a rotation by ``(m - n)*theta``,
    ``apply_rope(q, m) . apply_rope(k, n)`` depends only on ``m - n``: relative
    position without any table. Rotations keep norms.

    Equivalent to (``interleaved=False``, Hugging Face's ``rotate_half``)::

        cos, sin = rope_angles(positions, D)                  # (T, D)
        rotated = concatenate([-x[..., D//2:], x[..., :D//2]], -1)
        return x * cos + rotated * sin

    and (``interleaved=True``, RoFormer / GPT-J) to the complex product
    ``(x[..., 0::2] + 1j * x[..., 1::2]) * exp(1j * positions[:, None] * theta)``
    with real and imaginary parts written back to the even and odd features.

    Args:
        x: ``(..., T, D)``, D even. Any leading dims, e.g. ``(B, H, T, D)``.
        positions: ``None`` for ``0 .. T-1``; an int ``p`` for ``p .. p+T-1``
            (the offset of new tokens in cached decoding); or an int array (T,).
        base: ``theta_i = base**(-2i / D)``.
        interleaved: pairing of features, see above. Weights trained with one
            layout give wrong results with the other.

    Returns ``(..., T, D)`` in the dtype of ``x`` (angles are computed in float64).

    >>> q = np.ones((2, 4, 3, 8), dtype=np.float32)   # (B, H, T, D)
    >>> out = apply_rope(q, positions=5)
    >>> out.shape, out.dtype
    ((2, 4, 3, 8), dtype('float32'))
    >>> bool(np.allclose(np.linalg.norm(out, axis=-1), np.sqrt(8)))
    True
    """
    arr, out_dtype = as_input(x, "(..., T, D)")
    length, head_dim = arr.shape[-2], arr.shape[-1]
    if head_dim % 2:
        raise ShapeError(
            f"x: RoPE rotates pairs of features, expected (..., T, D) with D even, "
            f"got {shape_str(arr.shape)}"
        )
    pos = _as_positions(positions, length)  # (T,)
    cos, sin = rope_angles(pos, head_dim, base=base, interleaved=interleaved)  # (T, D) each
    cos, sin = cos.astype(arr.dtype), sin.astype(arr.dtype)
    if interleaved:
        # (x0, x1) -> (-x1, x0) for every pair (2i, 2i+1)
        rotated = np.stack([-arr[..., 1::2], arr[..., 0::2]], axis=-1)  # (..., T, D/2, 2)
        rotated = rotated.reshape(arr.shape)  # (..., T, D)
    else:
        half = head_dim // 2
        rotated = np.concatenate([-arr[..., half:], arr[..., :half]], axis=-1)  # (..., T, D)
    return (arr * cos + rotated * sin).astype(out_dtype, copy=False)


class RotaryEmbedding:
    """RoPE with its settings fixed: ``RotaryEmbedding(D)(q, positions)``.

    Call: ``x (..., T, D) -> (..., T, D)``; see :func:`apply_rope`.

    >>> rope = RotaryEmbedding(8, interleaved=True)
    >>> rope(np.zeros((3, 8))).shape
    (3, 8)
    """

    def __init__(
        self, head_dim: int, base: float = 10000.0, interleaved: bool = False
    ) -> None:
        self.head_dim = check_rope_head_dim(head_dim)
        self.base = check_base(base)
        self.interleaved = check_flag(interleaved, "interleaved")

    def __call__(self, x: Any, positions: Any = None) -> np.ndarray:  # (..., T, D) -> same
        input_with_width(x, self.head_dim, "(..., T, D)", "D = head_dim")
        return apply_rope(x, positions, base=self.base, interleaved=self.interleaved)

    def __repr__(self) -> str:
        return (
            f"RotaryEmbedding(head_dim={self.head_dim}, base={self.base}, "
            f"interleaved={self.interleaved})"
        )


# --------------------------------------------------------------------------- ALiBi


def alibi_slopes(num_heads: int) -> np.ndarray:  # -> (H,)
    """The per-head slopes of ALiBi (Press et al., 2022), float64.

    For ``H`` a power of two: the geometric sequence starting at and with ratio
    ``2**(-8 / H)``, i.e. ``2**(-8 * h / H)`` for ``h = 1 .. H``
    (8 heads: ``1/2, 1/4, ..., 1/256``).

    Otherwise (the paper's reference code, Hugging Face's ``build_alibi_tensor``):
    take the ``n = 2**floor(log2(H))`` slopes for ``n`` heads, then append the
    first ``H - n`` of the *odd-numbered* slopes for ``2n`` heads,
    ``2**(-8 * h / (2n))`` for ``h = 1, 3, 5, ...`` -- they fall between the
    ones already taken.

    >>> alibi_slopes(8).tolist()
    [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    >>> alibi_slopes(12).shape
    (12,)
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    check_alloc((num_heads,), np.float64, "the slopes (H,)", "num_heads")
    closest = 1 << (num_heads.bit_length() - 1)  # largest power of two <= H, exact for any int
    # 2**(-8h/n) in one rounding per slope (base**h would compound it): exact
    # whenever 8h/n is an integer, e.g. all slopes for H <= 8.
    slopes = 2.0 ** (-8.0 * np.arange(1, closest + 1) / closest)  # (closest,)
    n_extra = num_heads - closest
    if n_extra:
        odd_powers = np.arange(1, 2 * n_extra, 2)  # (H - closest,)
        extra = 2.0 ** (-8.0 * odd_powers / (2 * closest))  # (H - closest,)
        slopes = np.concatenate([slopes, extra])  # (H,)
    return slopes


def alibi_bias(
    num_heads: int, T: int, S: int | None = None, *, slopes: Any = None, dtype: Any = np.float64
) -> np.ndarray:  # -> (H, T, S), or (B, H, T, S) for slopes (B, H)
    """The ALiBi bias to add to the scores: ``bias[h, i, j] = -slope[h] * |pos_i - j|``.

    Query ``i`` sits at absolute position ``pos_i = S - T + i`` and key ``j`` at
    ``j`` (``S`` defaults to ``T``). This is the library's bottom-right causal
    alignment: with a KV cache of ``S - T`` earlier tokens, the ``T`` new queries
    are the last ``T`` positions, and the bias equals the rows ``S-T .. S-1`` of
    ``alibi_bias(H, S, S)``. For keys with ``j <= pos_i`` the bias is the paper's
    ``slope * (j - pos_i)``; for ``j > pos_i`` it is the symmetric
    ``-slope * (j - pos_i)`` (used by bidirectional ALiBi encoders).

    ALiBi is a *bias*, not a mask: it never blocks a key. For a causal model pass
    ``attnlab.masks.causal_mask(T, S)`` (bool, True = may attend, same alignment)
    as ``mask`` as well, and this array as ``bias``; it broadcasts to (B, H, T, S).
    (Hugging Face's ``build_alibi_tensor`` adds ``slope * j`` instead; on each row
    it differs from ``slope * (j - pos_i)`` by a constant, which softmax ignores.)
    When ``T > S``, the first ``T - S`` queries sit at negative positions.

    ``slopes``: your own, (H,) or per batch item (B, H) as FlashAttention's
    ``alibi_slopes`` (H = ``num_heads``); the default is :func:`alibi_slopes`.
    The attention functions also take them directly (``alibi_slopes=``), and
    flash then makes the bias tile by tile, never (T, S).

    >>> bias = alibi_bias(8, 2, 5)          # 2 new queries, 5 keys (3 cached)
    >>> bias.shape
    (8, 2, 5)
    >>> (bias[0] * 2).tolist()              # head 0 has slope 1/2
    [[-3.0, -2.0, -1.0, 0.0, -1.0], [-4.0, -3.0, -2.0, -1.0, 0.0]]
    """
    if slopes is None:
        slope_arr = alibi_slopes(num_heads)  # (H,)
    else:
        H = check_positive_int(num_heads, "num_heads")
        slope_arr = as_float_array(slopes, "slopes").astype(np.float64)
        if slope_arr.ndim not in (1, 2) or slope_arr.shape[-1] != H:
            raise ShapeError(
                f"slopes: expected ({H},) or (B, {H}) for num_heads = {H}, "
                f"got {shape_str(slope_arr.shape)}"
            )
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "num_heads, T" if S is None else "num_heads, T, S"  # to blame for a huge bias
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    out_dtype = float_dtype(dtype)
    what = "the bias (H, T, S)" if slope_arr.ndim == 1 else "the bias (B, H, T, S)"
    check_alloc((*slope_arr.shape, T, S), np.float64, what, sizes)
    query_positions = (S - T) + np.arange(T)  # (T,)
    key_positions = np.arange(S)  # (S,)
    distance = np.abs(query_positions[:, None] - key_positions[None, :])  # (T, S)
    bias = slope_arr[..., None, None] * -distance  # (..., H, T, S)
    return bias.astype(out_dtype)
