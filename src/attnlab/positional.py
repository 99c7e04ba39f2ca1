"""Positional information: sinusoidal and learned tables, RoPE and ALiBi.

RoPE and ALiBi are in :mod:`attnlab.positional_relative`, which shares this
module's argument checks (:func:`check_base`, :func:`float_dtype`,
:func:`as_input`, :func:`input_with_width`).

Self-attention is permutation-equivariant: shuffle the tokens and the outputs
shuffle with them. Position has to be put in from outside, and the four ways
here put it in at three different places:

- sinusoidal table (seed 001) and learned table: added to the embeddings,
  ``x (..., T, E) + table[:T] (T, E)``;
- RoPE (rotary): rotates queries and keys of every head, ``(..., T, D)``;
- ALiBi: an additive bias on the scores, ``(H, T, S)``, passed as ``bias``.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width.

Positions are absolute token indices starting at 0. For cached decoding the
new tokens do not start at 0: pass ``offset=`` (tables), ``positions=`` (RoPE),
or rely on ALiBi's bottom-right alignment (query ``i`` sits at ``S - T + i``).

Everything here is NumPy only. Tables and angles are computed in float64 and
rounded once to the dtype of the input, so float32 stays float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .checks import as_float_array, check_alloc, check_ndim, check_positive_int, shape_str
from .errors import AttnlabError, ShapeError
from .init import RngLike, as_rng

__all__ = [
    "sinusoidal_encoding",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
]


# --------------------------------------------------------------------------- helpers


def check_base(base: Any) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)):
        raise AttnlabError(f"base: expected a number, got {type(base).__name__} {base!r}")
    if not math.isfinite(base) or base <= 0:
        raise AttnlabError(f"base: expected a finite number > 0, got {base}")
    return float(base)


def float_dtype(dtype: Any) -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except (TypeError, ValueError, UnicodeError):  # not a dtype, e.g. a tensor
        raise AttnlabError(f"dtype: expected a NumPy float dtype, got {dtype!r}") from None
    if not np.issubdtype(resolved, np.floating) or resolved.itemsize > 8:
        raise AttnlabError(f"dtype: expected float16, float32 or float64, got {resolved}")
    return resolved


def as_input(x: Any, layout: str) -> tuple[np.ndarray, np.dtype]:
    """``x`` as a float array of at least 2 dims, and the dtype the result should have.

    float16 is computed in float32 (see :func:`attnlab.checks.as_float_array`) but
    handed back as float16; integer input comes back as float64.
    """
    arr = as_float_array(x, "x")
    check_ndim(arr, "x", 2, layout)
    out_dtype = np.dtype(np.float16) if getattr(x, "dtype", None) == np.float16 else arr.dtype
    return arr, out_dtype


def _check_offset(offset: Any, length: int, limit: int, limit_name: str) -> int:
    offset = check_positive_int(offset, "offset", allow_zero=True)
    if offset + length > limit:
        raise AttnlabError(
            f"x: positions {offset}..{offset + length - 1} (offset={offset}, T={length}) "
            f"do not fit in {limit_name}={limit}; expected offset + T <= {limit}"
        )
    return offset


def _add_table(table: np.ndarray, x: Any, offset: Any) -> np.ndarray:  # (..., T, E) -> same
    """``x + table[offset:offset + T]``, validated; shared by both table encodings."""
    max_len, d_model = table.shape
    arr, out_dtype = input_with_width(x, d_model, "(..., T, E)", "E = d_model")
    length = arr.shape[-2]
    offset = _check_offset(offset, length, max_len, "max_len")
    rows = table[offset : offset + length].astype(arr.dtype)  # (T, E)
    return (arr + rows).astype(out_dtype, copy=False)  # (..., T, E)


def input_with_width(
    x: Any, width: int, layout: str, width_name: str
) -> tuple[np.ndarray, np.dtype]:
    arr, out_dtype = as_input(x, layout)
    if arr.shape[-1] != width:
        raise ShapeError(
            f"x: expected {layout} with {width_name} = {width}, got {shape_str(arr.shape)}"
        )
    return arr, out_dtype


# --------------------------------------------------------------------------- sinusoidal


def sinusoidal_encoding(
    max_len: int, d_model: int, *, base: float = 10000.0, dtype: Any = np.float64
) -> np.ndarray:  # -> (max_len, E)
    """The fixed sine/cosine table of "Attention Is All You Need" (seed 001).

    With ``E = d_model`` and position ``p``::

        pe[p, 2i]     = sin(p / base**(2i / E))
        pe[p, 2i + 1] = cos(p / base**(2i / E))

    computed exactly as the seed's ``PositionalEncoding`` does
    (``div_term = exp(arange(0, E, 2) * -(log(base) / E))``), in float64, then
    rounded once to ``dtype``. Values lie in ``[-1, 1]``; row 0 is ``[0, 1, 0, 1, ...]``.

    Odd ``E``: the seed's torch code fails there (``pe[:, 1::2]`` has one column
    fewer than ``div_term``). Here the last column ``E - 1`` is even, so it is a
    sine with frequency ``base**(-(E - 1) / E)`` and has no cosine partner; every
    other column is as for even ``E`` (with ``E`` odd in the exponent).

    >>> pe = sinusoidal_encoding(50, 8)
    >>> pe.shape
    (50, 8)
    >>> pe[0].tolist()
    [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    >>> bool(np.isclose(pe[1, 0], np.sin(1.0)))
    True
    """
    max_len = check_positive_int(max_len, "max_len")
    d_model = check_positive_int(d_model, "d_model")
    base = check_base(base)
    out_dtype = float_dtype(dtype)
    check_alloc((max_len, d_model), np.float64, "the table (max_len, E)", "max_len, d_model")
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    even_columns = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(E/2),)
    div_term = np.exp(even_columns * -(math.log(base) / d_model))  # (ceil(E/2),)
    angles = position * div_term  # (max_len, ceil(E/2))
    pe = np.zeros((max_len, d_model), dtype=np.float64)  # (max_len, E)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])  # odd E: the last sine has no partner
    return pe.astype(out_dtype)


class SinusoidalPositionalEncoding:
    """Adds the sinusoidal table to embeddings: ``x + pe[offset : offset + T]``.

    NumPy twin of seed 001's ``PositionalEncoding(d_model, max_len=5000)``
    (without dropout). The table ``pe`` (``(max_len, E)``, float64) is built once.

    Call: ``x (..., T, E) -> (..., T, E)``, same dtype as ``x``. ``offset`` is the
    absolute position of ``x[..., 0, :]``; use it when decoding with a KV cache,
    where the new token at step ``t`` must get ``pe[t]``, not ``pe[0]``.

    >>> enc = SinusoidalPositionalEncoding(8, max_len=16)
    >>> x = np.zeros((2, 5, 8), dtype=np.float32)
    >>> y = enc(x)
    >>> y.shape, y.dtype
    ((2, 5, 8), dtype('float32'))
    >>> bool(np.allclose(enc(x[:, :1], offset=4), y[:, 4:5]))
    True
    """

    def __init__(self, d_model: int, max_len: int = 5000, *, base: float = 10000.0) -> None:
        self.d_model = check_positive_int(d_model, "d_model")
        self.max_len = check_positive_int(max_len, "max_len")
        self.base = check_base(base)
        self.pe = sinusoidal_encoding(self.max_len, self.d_model, base=self.base)  # (max_len, E)

    def __call__(self, x: Any, *, offset: int = 0) -> np.ndarray:  # (..., T, E) -> (..., T, E)
        return _add_table(self.pe, x, offset)

    def __repr__(self) -> str:
        return f"SinusoidalPositionalEncoding(d_model={self.d_model}, max_len={self.max_len})"


class LearnedPositionalEmbedding:
    """A trainable ``(max_len, E)`` table added to embeddings, as in BERT and GPT-2.

    ``table`` starts as ``N(0, std**2)`` (``std=0.02`` as GPT-2), drawn from
    ``seed`` (an int, a ``np.random.Generator`` or None, see
    :func:`attnlab.init.as_rng`; the global RNG is never used).
    It is a plain array attribute: training code updates it in place.
    :meth:`from_table` wraps an existing table (e.g. loaded from a checkpoint).

    Unlike the sinusoidal table it cannot extrapolate: positions ``>= max_len``
    have no row and raise.

    Call: ``x (..., T, E) -> (..., T, E)``, same dtype as ``x``, ``offset`` as in
    :class:`SinusoidalPositionalEncoding`.

    >>> emb = LearnedPositionalEmbedding(16, 8, seed=0)
    >>> emb.table.shape
    (16, 8)
    >>> emb(np.zeros((5, 8))).shape
    (5, 8)
    """

    def __init__(self, max_len: int, d_model: int, *, seed: RngLike = 0, std: float = 0.02) -> None:
        max_len = check_positive_int(max_len, "max_len")
        d_model = check_positive_int(d_model, "d_model")
        if isinstance(std, bool) or not isinstance(std, (int, float, np.integer, np.floating)):
            raise AttnlabError(f"std: expected a number, got {type(std).__name__} {std!r}")
        if not math.isfinite(std) or std < 0:
            raise AttnlabError(f"std: expected a finite number >= 0, got {std}")
        check_alloc((max_len, d_model), np.float64, "the table (max_len, E)", "max_len, d_model")
        rng = as_rng(seed)
        self.table: np.ndarray = float(std) * rng.standard_normal((max_len, d_model))

    @classmethod
    def from_table(cls, table: Any) -> LearnedPositionalEmbedding:
        """Wrap a copy of an existing ``(max_len, E)`` table (float dtype kept)."""
        arr = as_float_array(table, "table")
        if arr.ndim != 2 or 0 in arr.shape:
            raise ShapeError(
                f"table: expected (max_len, E) with both >= 1, got {shape_str(arr.shape)}"
            )
        self = cls.__new__(cls)
        self.table = arr.copy()
        return self

    @property
    def max_len(self) -> int:
        return int(self.table.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.table.shape[1])

    def __call__(self, x: Any, *, offset: int = 0) -> np.ndarray:  # (..., T, E) -> (..., T, E)
        return _add_table(self.table, x, offset)

    def __repr__(self) -> str:
        return f"LearnedPositionalEmbedding(max_len={self.max_len}, d_model={self.d_model})"
