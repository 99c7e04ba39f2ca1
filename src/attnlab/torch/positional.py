"""Positional information in PyTorch: the sinusoidal table, RoPE and ALiBi.

Each function behaves identically to its namesake in :mod:`attnlab.positional`
(the NumPy core) and is tested against it: tables and angles are computed in
float64 and rounded once to the requested dtype.

Dimension legend: H heads, T query length, S key length, D head dim, E model width.
Positions are absolute token indices starting at 0; with a KV cache the T new
queries sit at S - T .. S - 1 (the library's bottom-right alignment).

Checks: shapes, dtypes and devices always; NaN/Inf in the inputs and negative
positions in a tensor only under :func:`attnlab.torch.debug_checks`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..checks import check_alloc, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..positional import SinusoidalPositionalEncoding
from ..positional_relative import check_rope_head_dim
from . import debug
from .checks import as_float_tensor, check_positive_float, check_probability, check_same_device
from .kernel import compute_dtype

__all__ = [
    "sinusoidal_encoding",
    "PositionalEncoding",
    "rope_angles",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "alibi_values",
    "rotate",
]


def _float_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AttnlabError(f"dtype: expected a torch float dtype, got {dtype!r}")
    return dtype


def sinusoidal_encoding(
    max_len: int,
    d_model: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
    device: Any = None,
) -> torch.Tensor:  # -> (max_len, E)
    """The sine/cosine table of seed 001; behaves identically to
    :func:`attnlab.positional.sinusoidal_encoding` (odd E included)::

        pe[p, 2i]     = sin(p / base**(2i / E))
        pe[p, 2i + 1] = cos(p / base**(2i / E))

    >>> sinusoidal_encoding(50, 8).shape
    torch.Size([50, 8])
    >>> sinusoidal_encoding(1, 4)[0].tolist()
    [0.0, 1.0, 0.0, 1.0]
    """
    max_len = check_positive_int(max_len, "max_len")
    d_model = check_positive_int(d_model, "d_model")
    base = check_positive_float(base, "base")
    out_dtype = _float_dtype(dtype)
    check_alloc((max_len, d_model), torch.float64, "the table (max_len, E)", "max_len, d_model")
    f64 = {"dtype": torch.float64, "device": device}
    position = torch.arange(max_len, **f64)[:, None]  # (max_len, 1)
    even_columns = torch.arange(0, d_model, 2, **f64)  # (ceil(E/2),)
    div_term = torch.exp(even_columns * -(math.log(base) / d_model))  # (ceil(E/2),)
    angles = position * div_term  # (max_len, ceil(E/2))
    pe = torch.zeros(max_len, d_model, **f64)  # (max_len, E)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # odd E: the last sine has no partner
    return pe.to(out_dtype)


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table: ``dropout(x + pe[offset : offset + T])`` (seed 001).

    Behaves identically to :class:`attnlab.positional.SinusoidalPositionalEncoding`
    (plus dropout). ``pe`` is a registered buffer of shape (1, max_len, E), as in
    the seed, kept in float64 (unless ``dtype`` says otherwise) and rounded once to
    the input's dtype, so ``.double()`` inputs get the exact table.

    Shapes: x (..., T, E) -> (..., T, E). ``offset``: the absolute position of
    ``x[..., 0, :]`` (decoding with a KV cache). ``dropout`` (keyword) is applied
    after the addition, in training mode.

    >>> enc = PositionalEncoding(8, max_len=16)
    >>> enc(torch.zeros(2, 5, 8)).shape
    torch.Size([2, 5, 8])
    """

    pe: torch.Tensor

    def __init__(
        self,
        d_model: int,
        max_len: int = 5000,
        *,
        base: float = 10000.0,
        dropout: float = 0.0,
        device: Any = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int(d_model, "d_model")
        self.max_len = check_positive_int(max_len, "max_len")
        self.base = check_positive_float(base, "base")
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))
        table = sinusoidal_encoding(
            self.max_len, self.d_model, base=self.base, dtype=dtype, device=device
        )  # (max_len, E)
        self.register_buffer("pe", table.unsqueeze(0))  # (1, max_len, E)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"

    def forward(self, x: torch.Tensor, *, offset: int = 0) -> torch.Tensor:  # (..., T, E)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise AttnlabError(f"x: expected a float torch.Tensor, got {got}")
        if x.ndim < 2 or x.shape[-1] != self.d_model:
            raise ShapeError(
                f"x: expected (..., T, E) with E = d_model = {self.d_model}, "
                f"got {shape_str(x.shape)}"
            )
        check_same_device(self.pe, "the module", x, "x")
        T = x.shape[-2]
        offset = check_positive_int(offset, "offset", allow_zero=True)
        if offset + T > self.max_len:
            raise AttnlabError(
                f"x: positions {offset}..{offset + T - 1} (offset={offset}, T={T}) "
                f"do not fit in max_len={self.max_len}; expected offset + T <= {self.max_len}"
            )
        if debug.debug_checks_enabled():
            debug.check_finite([("x", x)])
        work = compute_dtype(x.dtype)
        rows = self.pe[0, offset : offset + T].to(work)  # (T, E)
        return self.dropout((x.to(work) + rows).to(x.dtype))  # (..., T, E)

    @classmethod
    def from_numpy(
        cls, encoding: SinusoidalPositionalEncoding, *, dropout: float = 0.0, device: Any = None
    ) -> PositionalEncoding:
        """The module for a NumPy ``SinusoidalPositionalEncoding`` (same size and base)."""
        if not isinstance(encoding, SinusoidalPositionalEncoding):
            raise AttnlabError(
                "encoding: expected an attnlab.positional.SinusoidalPositionalEncoding, "
                f"got {type(encoding).__name__}"
            )
        return cls(encoding.d_model, encoding.max_len, base=encoding.base, dropout=dropout,
                   device=device)

    def to_numpy(self) -> SinusoidalPositionalEncoding:
        """The NumPy ``SinusoidalPositionalEncoding`` with the same size and base (no dropout)."""
        return SinusoidalPositionalEncoding(self.d_model, self.max_len, base=self.base)


def _as_positions(positions: Any, length: int | None, device: Any) -> torch.Tensor:  # -> (T,)
    """None = arange(T); an int p = p + arange(T); else an int tensor (T,) of positions >= 0."""
    if positions is None or (isinstance(positions, int) and not isinstance(positions, bool)):
        if length is None:
            raise AttnlabError(
                f"positions: expected an int tensor of shape (T,), got {positions!r}"
            )
        offset = 0 if positions is None else check_positive_int(
            positions, "positions", allow_zero=True
        )
        return offset + torch.arange(length, device=device)  # (T,)
    try:
        pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
    except (TypeError, ValueError, RuntimeError) as exc:  # a str, a ragged list, an object
        raise AttnlabError(
            f"positions: expected an int tensor of shape (T,), could not read "
            f"{type(positions).__name__} ({exc})"
        ) from None
    if pos.dtype == torch.bool or pos.is_floating_point() or pos.is_complex():
        raise AttnlabError(f"positions: expected integer positions, got dtype {pos.dtype}")
    expected = "(T,)" if length is None else f"(T,) = ({length},)"
    if pos.ndim != 1 or (length is not None and pos.shape[0] != length):
        raise ShapeError(f"positions: expected shape {expected}, got {shape_str(pos.shape)}")
    if debug.debug_checks_enabled() and pos.numel():
        debug.check_has_data([("positions", pos)])
        if int(pos.min()) < 0:
            raise AttnlabError(f"positions: expected positions >= 0, got min {int(pos.min())}")
    return pos.to(device=device, dtype=torch.int64)


def rope_angles(
    positions: Any,
    head_dim: int,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    device: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (T,) -> (T, D), (T, D)
    """Cosines and sines of ``positions[t] * theta_i``, ``theta_i = base**(-2i / D)``, float64;
    behaves identically to :func:`attnlab.positional_relative.rope_angles`.

    >>> cos, sin = rope_angles(torch.arange(3), 4)
    >>> cos.shape, sin.shape
    (torch.Size([3, 4]), torch.Size([3, 4]))
    """
    head_dim = check_rope_head_dim(head_dim)
    base = check_positive_float(base, "base")
    interleaved = check_flag(interleaved, "interleaved")
    pos = _as_positions(positions, None, device)
    check_alloc((len(pos), head_dim), torch.float64, "the angles (T, D)", "head_dim")
    return _angles(pos, head_dim, base, interleaved)


def _angles(
    pos: torch.Tensor, head_dim: int, base: float, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:  # (T,) -> (T, D), (T, D)
    even = torch.arange(0, head_dim, 2, dtype=torch.float64, device=pos.device)  # (D/2,)
    inv_freq = base ** -(even / head_dim)  # (D/2,)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)  # (T, D)
    else:
        angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(
    x: torch.Tensor, positions: Any = None, *, base: float = 10000.0, interleaved: bool = False
) -> torch.Tensor:  # (..., T, D) -> (..., T, D)
    """Rotate each pair of features of ``x`` by ``positions[t] * theta_i`` (RoPE); behaves
    identically to :func:`attnlab.positional_relative.apply_rope`.

    Equivalent to (``interleaved=False``, GPT-NeoX / LLaMA pairing i with i + D/2)::

        cos, sin = rope_angles(positions, D)                      # (T, D)
        rotated = torch.cat([-x[..., D//2:], x[..., :D//2]], -1)
        return x * cos + rotated * sin

    ``interleaved=True`` pairs 2i with 2i + 1 (RoFormer / GPT-J).
    ``positions``: None for 0 .. T-1, an int p for p .. p+T-1, or an int tensor (T,).
    float16 / bfloat16 are rotated in float32 and returned in their own dtype.

    >>> q = torch.ones(2, 4, 3, 8)   # (B, H, T, D)
    >>> out = apply_rope(q, positions=5)
    >>> out.shape, out.dtype
    (torch.Size([2, 4, 3, 8]), torch.float32)
    >>> bool(torch.allclose(out.norm(dim=-1), torch.tensor(8.0).sqrt()))
    True
    """
    arr = as_float_tensor(x, "x")
    if arr.ndim < 2:
        raise ShapeError(f"x: expected (..., T, D), got {shape_str(arr.shape)}")
    length, head_dim = arr.shape[-2], arr.shape[-1]
    if head_dim % 2:
        raise ShapeError(
            "x: RoPE rotates pairs of features, expected (..., T, D) with D even, "
            f"got shape {shape_str(arr.shape)}"
        )
    base = check_positive_float(base, "base")
    pos = _as_positions(positions, length, arr.device)  # (T,)
    if debug.debug_checks_enabled():
        debug.check_finite([("x", arr)])
    return rotate(arr, pos, base=base, interleaved=check_flag(interleaved, "interleaved"))


def rotate(
    x: torch.Tensor, pos: torch.Tensor, *, base: float, interleaved: bool
) -> torch.Tensor:  # (..., T, D) -> (..., T, D)
    """RoPE on validated inputs (``pos`` an int tensor (T,) on x's device)."""
    out_dtype = x.dtype
    arr = x.to(compute_dtype(out_dtype))
    cos, sin = _angles(pos, arr.shape[-1], base, interleaved)  # (T, D) each, float64
    cos, sin = cos.to(arr.dtype), sin.to(arr.dtype)
    if interleaved:
        # (x0, x1) -> (-x1, x0) for every pair (2i, 2i+1)
        rotated = torch.stack([-arr[..., 1::2], arr[..., 0::2]], dim=-1)  # (..., T, D/2, 2)
        rotated = rotated.flatten(-2)  # (..., T, D)
    else:
        half = arr.shape[-1] // 2
        rotated = torch.cat([-arr[..., half:], arr[..., :half]], dim=-1)  # (..., T, D)
    return (arr * cos + rotated * sin).to(out_dtype)


def alibi_slopes(num_heads: int, *, device: Any = None) -> torch.Tensor:  # -> (H,)
    """The per-head ALiBi slopes, float64; behaves identically to
    :func:`attnlab.positional_relative.alibi_slopes` (non-powers of two as in the paper's code).

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    check_alloc((num_heads,), torch.float64, "the slopes (H,)", "num_heads")
    return _slopes(num_heads, device)


def _slopes(num_heads: int, device: Any) -> torch.Tensor:  # -> (H,) float64
    f64 = {"dtype": torch.float64, "device": device}
    closest = 1 << (num_heads.bit_length() - 1)  # largest power of two <= H
    slopes = (2.0 ** (-8.0 / closest)) ** torch.arange(1, closest + 1, **f64)  # (closest,)
    n_extra = num_heads - closest
    if n_extra:
        odd_powers = torch.arange(1, 2 * n_extra, 2, **f64)  # (H - closest,)
        extra = (2.0 ** (-8.0 / (2 * closest))) ** odd_powers  # (H - closest,)
        slopes = torch.cat([slopes, extra])  # (H,)
    return slopes


def alibi_bias(
    num_heads: int,
    T: int,
    S: int | None = None,
    *,
    slopes: Any = None,
    dtype: torch.dtype = torch.float64,
    device: Any = None,
) -> torch.Tensor:  # -> (H, T, S), or (B, H, T, S) for slopes (B, H)
    """ALiBi bias ``-slope[h] * |pos_i - j|`` with query i at ``pos_i = S - T + i``; behaves
    identically to :func:`attnlab.positional_relative.alibi_bias`. Pass it as ``bias``, and a
    causal mask as ``mask`` (or ``is_causal=True``) for a causal model. ``slopes``: your
    own, (H,) or (B, H) (a tensor or an array), instead of the paper's.

    >>> alibi_bias(8, 2, 5).shape
    torch.Size([8, 2, 5])
    """
    H = check_positive_int(num_heads, "num_heads")
    check_alloc((H,), torch.float64, "the slopes (H,)", "num_heads")
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "num_heads, T" if S is None else "num_heads, T, S"  # to blame for a huge bias
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    out_dtype = _float_dtype(dtype)
    if slopes is not None:
        own = torch.as_tensor(slopes, dtype=torch.float64, device=device)
        if own.ndim not in (1, 2) or own.shape[-1] != H:
            raise ShapeError(
                f"slopes: expected ({H},) or (B, {H}) for num_heads = {H}, "
                f"got {shape_str(own.shape)}"
            )
        what = "the bias (H, T, S)" if own.ndim == 1 else "the bias (B, H, T, S)"
        check_alloc((*own.shape, T, S), torch.float64, what, sizes)
        query_positions = (S - T) + torch.arange(T, device=device)  # (T,)
        distance = (query_positions[:, None] - torch.arange(S, device=device)[None, :]).abs()
        return (own[..., None, None] * -distance.to(torch.float64)).to(out_dtype)  # (..., H, T, S)
    check_alloc((H, T, S), torch.float64, "the bias (H, T, S)", sizes)
    return alibi_values(H, T, S, dtype=out_dtype, device=device)


def alibi_values(
    H: int, T: int, S: int, *, dtype: torch.dtype, device: Any
) -> torch.Tensor:  # -> (H, T, S)
    """:func:`alibi_bias` on checked sizes (for the modules, which checked theirs)."""
    slopes = _slopes(H, device)  # (H,)
    query_positions = (S - T) + torch.arange(T, device=device)  # (T,)
    key_positions = torch.arange(S, device=device)  # (S,)
    distance = (query_positions[:, None] - key_positions[None, :]).abs()  # (T, S)
    bias = slopes[:, None, None] * -distance[None, :, :].to(torch.float64)  # (H, T, S)
    return bias.to(dtype)
