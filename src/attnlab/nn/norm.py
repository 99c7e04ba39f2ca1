"""Layer normalisation: the checked module, its overflow-safe statistics and an in-place kernel.

Dimension legend: E model width; ``...`` any leading dims (B, T).

    y = (x - mean) / sqrt(var + eps) * gamma + beta      (biased variance, as torch)

:class:`LayerNorm` is the checked public op; :func:`layer_norm_stats` the
statistics every LayerNorm in attnlab uses (the forward, the backward in
:mod:`attnlab.nn.backward`), safe from overflow; :func:`layer_norm_inplace` the
unchecked in-place kernel of the fused encoder, equal to the module up to the
rounding of its row sums.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_float_array, as_vector, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..hooks import HookSite

__all__ = ["LayerNorm", "layer_norm_stats", "layer_norm_inplace"]


class LayerNorm:
    """Layer normalisation over the last dim.

    Shapes: x (..., E) -> (..., E)

    y = (x - mean) / sqrt(var + eps) * gamma + beta, with the biased variance
    (divide by E), as in ``torch.nn.LayerNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, *, gamma: Any = None, beta: Any = None):
        self.d_model = check_positive_int(d_model, "d_model")
        if isinstance(eps, bool) or not (isinstance(eps, (int, float, np.floating)) and eps > 0):
            raise AttnlabError(f"eps: expected a positive number, got {eps!r}")
        self.eps = float(eps)
        self.gamma = np.ones(d_model) if gamma is None else as_vector(gamma, "gamma", d_model)
        self.beta = np.zeros(d_model) if beta is None else as_vector(beta, "beta", d_model)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_normalized`` (..., E): the output, after gamma and beta."""
        return ["hook_normalized"]

    def __call__(self, x: Any) -> np.ndarray:
        x_arr = as_float_array(x, "x")
        if x_arr.ndim < 1 or x_arr.shape[-1] != self.d_model:
            raise ShapeError(f"x: expected (..., {self.d_model}), got {shape_str(x_arr.shape)}")
        return self.forward(x_arr)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The normalisation of a checked x (..., E) -> (..., E); no checks."""
        centred, std, _ = layer_norm_stats(x, self.eps)  # (..., E), (..., 1)
        normed = centred / std  # (..., E)
        out = (normed * self.gamma + self.beta).astype(x.dtype, copy=False)
        return out if self.hook_site is None else self.hook_site("hook_normalized", out)


def layer_norm_stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm's statistics over the last axis, safe from overflow.

    Shapes: x (..., E) -> centred (..., E), std (..., 1), m (..., 1), with
    ``centred / std`` the normalised x, and ``m * std`` = √(var(x) + eps).

    Usually centred = x − mean, std = √(var + eps) and m = 1. In a row whose
    squares overflow (|x| near the dtype's largest value, e.g. 1e160 in float64)
    the variance would be inf and the row silently all zeros; there the row is
    divided by m = its largest |x| first (LayerNorm is scale-invariant but for
    eps, which becomes eps / m²).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        centred = x - mean  # (..., E)
        var = np.mean(centred * centred, axis=-1, keepdims=True)  # (..., 1)
    m = np.ones_like(var)  # (..., 1)
    bad = ~np.isfinite(var)  # (..., 1)
    if bad.any():
        m = np.where(bad, np.max(np.abs(x), axis=-1, keepdims=True), m)  # (..., 1)
        xs = x / m  # (..., E), |xs| <= 1 in the rescaled rows
        cs = xs - xs.mean(axis=-1, keepdims=True)  # (..., E)
        with np.errstate(over="ignore"):
            eps_scaled = eps / (m * m)  # (..., 1); m² may overflow: eps / inf = 0
        var_scaled = np.mean(cs * cs, axis=-1, keepdims=True)  # (..., 1)
        # A constant row (its sum overflowed) has var 0 exactly: back to m = 1, std = √eps.
        constant = bad & (var_scaled == 0)
        m = np.where(constant, 1.0, m).astype(var.dtype, copy=False)
        centred = np.where(bad, cs, centred)
        var = np.where(bad, var_scaled, var)
        return centred, np.sqrt(var + np.where(bad & ~constant, eps_scaled, eps)), m
    return centred, np.sqrt(var + eps), m


def layer_norm_inplace(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> np.ndarray:
    """LayerNorm over the last axis, written into ``x`` itself; returns ``x``.

    Shapes: x (..., E) C-contiguous, gamma (E,), beta (E,) -> x. An unchecked
    kernel for a loop that owns its buffers (the checked public op is
    :class:`LayerNorm`). Efficient implementation equivalent to the following,
    up to the rounding of the row sums::

        centred, std, _ = layer_norm_stats(x, eps)
        x[...] = centred / std * gamma + beta

    The row sums are one matrix-vector product and one einsum instead of a
    NumPy reduction per row (about 4x faster for E = 384); a row whose squares
    overflow takes :func:`layer_norm_stats`' rescaling path, as LayerNorm does.
    """
    if not x.flags.c_contiguous:  # reshape would copy, and the result be lost
        raise AttnlabError("x: expected a C-contiguous array to normalise in place")
    E = x.shape[-1]
    rows = x.reshape(-1, E)  # (N, E), a view of x
    with np.errstate(over="ignore", invalid="ignore"):
        mean = rows @ np.ones(E, dtype=rows.dtype)  # (N,) row sums
        mean /= E
        centred = rows - mean[:, None]  # (N, E); x is kept for the overflow path
        var = np.einsum("ij,ij->i", centred, centred)  # (N,) sums of squares
        var /= E
    if not np.isfinite(var).all():
        stats_centred, std, _ = layer_norm_stats(x, eps)  # (..., E), (..., 1)
        np.divide(stats_centred, std, out=x)
    else:
        var += eps
        np.divide(centred, np.sqrt(var)[:, None], out=rows)  # (N, E)
    x *= gamma
    x += beta
    return x
