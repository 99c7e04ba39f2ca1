"""How multi-head attention lays out its heads: the weights' head layout, checked, the
split into heads and back, and the projection ``x @ W + b``.

Weights are stored as (in, out) and applied as ``X @ W`` like the seeds do
(``torch.nn.Linear`` stores (out, in): ``W = linear.weight.T``); the H heads of
a projection are its columns in H consecutive groups of D::

    Wq (E, H*D)   Wk (Ekv, Hkv*D)   Wv (Ev, Hkv*Dv)   Wo (H*Dv, E_out)

Dimension legend: B batch, H query heads, Hkv key/value heads (H a multiple of
Hkv), T query length, D head dim, Dv value head dim, E model width.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..checks import as_float_array, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError

__all__ = ["HeadLayout", "check_head_layout", "linear", "merge_heads", "split_heads"]


class HeadLayout(NamedTuple):
    """Checked projection weights (float arrays) and the head sizes they hold."""

    Wq: np.ndarray  # (E, H*D)
    Wk: np.ndarray  # (Ekv, Hkv*D)
    Wv: np.ndarray  # (Ev, Hkv*Dv)
    Wo: np.ndarray  # (H*Dv, E_out)
    H: int
    Hkv: int
    D: int
    Dv: int


def check_head_layout(
    Wq: Any, Wk: Any, Wv: Any, Wo: Any, num_heads: Any, num_kv_heads: Any = None
) -> HeadLayout:
    """Check the four projections against ``num_heads`` H and ``num_kv_heads`` Hkv (default
    H): each a 2-D (in, out) matrix whose widths hold whole heads. Raises naming the
    argument, the expected and the received shape."""
    H = check_positive_int(num_heads, "num_heads")
    Hkv = H if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
    if H % Hkv:
        raise AttnlabError(f"num_kv_heads: expected a divisor of num_heads = {H}, got {Hkv}")
    Wq, Wk, Wv, Wo = (_matrix(w, name) for w, name in
                      ((Wq, "Wq"), (Wk, "Wk"), (Wv, "Wv"), (Wo, "Wo")))
    D = _head_width(Wq, "Wq", "(E, H*D)", "H", H)
    if Wk.shape[1] != Hkv * D:
        raise ShapeError(
            f"Wk: expected (Ekv, Hkv*D) = (Ekv, {Hkv * D}) for Hkv = {Hkv}, D = {D}, "
            f"got {shape_str(Wk.shape)}"
        )
    Dv = _head_width(Wv, "Wv", "(Ekv, Hkv*Dv)", "Hkv", Hkv)
    if Wo.shape[0] != H * Dv:
        raise ShapeError(
            f"Wo: expected (H*Dv, E_out) = ({H * Dv}, E_out), got {shape_str(Wo.shape)}"
        )
    return HeadLayout(Wq, Wk, Wv, Wo, H, Hkv, D, Dv)


def _head_width(w: np.ndarray, name: str, layout: str, heads_name: str, heads: int) -> int:
    """The width of one head of ``w`` (in, heads*dim), refused unless the heads divide it."""
    if w.shape[1] % heads:
        raise ShapeError(
            f"{name}: expected {layout} with {heads_name} = {heads} dividing its width, "
            f"got {shape_str(w.shape)}"
        )
    return w.shape[1] // heads


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(..., T, H*D) -> (..., H, T, D)."""
    *lead, T, width = x.shape
    x = x.reshape(*lead, T, num_heads, width // num_heads)  # (..., T, H, D)
    return np.swapaxes(x, -3, -2)  # (..., H, T, D)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., H, T, D) -> (..., T, H*D)."""
    *lead, H, T, D = x.shape
    x = np.swapaxes(x, -3, -2)  # (..., T, H, D)
    return x.reshape(*lead, T, H * D)  # (..., T, H*D)


def linear(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, *, out: np.ndarray | None = None
) -> np.ndarray:
    """x @ w + b over the last dim: (..., in) -> (..., out).

    The leading dims are flattened first: NumPy's matmul of a stack (B, T, in)
    by a matrix runs B small products, one (T, in) @ (in, out) product is
    ~1.5x faster. ``out`` (C-contiguous, shape (..., out)) receives the result
    instead of a new array, so that a loop over layers can reuse its buffers.
    """
    rows = x.reshape(-1, x.shape[-1])  # (N, in)
    if out is None:
        y = (rows @ w).reshape(*x.shape[:-1], w.shape[1])  # (..., out)
    else:
        if not out.flags.c_contiguous:  # reshape would copy, and the result be lost
            raise AttnlabError("out: expected a C-contiguous array")
        y = out
        np.matmul(rows, w, out=out.reshape(rows.shape[0], w.shape[1]))  # (N, out)
    if b is not None:
        y += b
    return y


def _matrix(w: Any, name: str) -> np.ndarray:
    arr = as_float_array(w, name)
    if arr.ndim != 2:
        raise ShapeError(f"{name}: expected a 2-D (in, out) matrix, got {shape_str(arr.shape)}")
    return arr
