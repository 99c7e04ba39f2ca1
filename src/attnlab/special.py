"""The error function, vectorised in NumPy (NumPy itself has none), and the GELU built on it.

BERT's GELU is x·Φ(x) = x/2 · (1 + erf(x/√2)) with the exact erf; calling
``math.erf`` element by element is ~100× too slow for a real model, so this is
W. J. Cody's rational Chebyshev approximation (Math. Comp. 23, 1969; the
SPECFUN routine CALERF), accurate to about 1e-16 relative in float64 on the
whole real line. Three ranges:

    |x| ≤ 0.5        erf(x)  = x · R1(x²)
    0.5 < |x| ≤ 4    erfc(x) = exp(-x²) · R2(x)
    |x| > 4          erfc(x) = exp(-x²)/x · (1/√π - R3(1/x²)/x²)

and erf = 1 - erfc with the sign of x for the outer two. exp(-x²) is split as
exp(-t²)·exp(-(x-t)(x+t)) with t = x rounded down to 1/16, as Cody does, to
keep the relative error of the exponential small.

float32 input takes a cheaper path, since float32 cannot hold more than ~7
digits anyway: erf(x) ≈ x·P(x²)/Q(x²) on x clamped to [-4, 4] (an odd rational
minimax fit, degree 13/8, the form Eigen and XLA use for float32), evaluated in
float32. Its largest error is 4.2e-7 absolute, under 7.5 float32 ulps of the
result (checked against ``math.erf`` on a dense grid in the tests); it is ~8×
faster than the float64 path, which matters because GELU runs on every element
of a BERT's feed-forward layer.

:func:`gelu_erf` evaluates the same rational for Φ(x) - ½ = ½·erf(x/√2)
directly in x (the 1/√2 and the ½ folded into the coefficients), chunk by chunk
so that the ~25 elementwise passes stay in the CPU cache, optionally adding a
bias first and writing in place: the feed-forward layer's ``act(h + b1)`` in one
sweep over h.
"""

from __future__ import annotations

import math

import numpy as np

from .checks import shape_str
from .errors import AttnlabError

__all__ = ["erf", "gelu_erf"]

_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1
_XBIG = 26.543  # erfc(x) underflows to 0 beyond this

# float32 path: erf(x) = x·P(x²)/Q(x²), P = Σ alpha_i s^i (x^1..x^13 with the x),
# Q = Σ beta_j s^j (x^0..x^8).
_ALPHA = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
          -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
          -2.72614225801306e-10)
_BETA = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
         -2.13374055278905e-04, -1.45660718464996e-05)


class _Rational:
    """c·erf(a·x) = x·N(x²)/D(x²) for |x| ≤ 4/a, as float32 coefficients.

    N_i = c·a·alpha_i·a^(2i) and D_j = beta_j·a^(2j), both divided by D's constant
    term so that D(0) = 1: on a dense grid this rounds a little better in float32
    than the raw coefficients or a monic D (at most 7.4 ulps, against 7.9 and 8.2).
    """

    def __init__(self, a: float, c: float):
        a2 = a * a
        self.bound = np.float32(4.0 / a)
        self.num = tuple(np.float32(c * a * k * a2**i / _BETA[0]) for i, k in enumerate(_ALPHA))
        self.den = tuple(np.float32(k * a2**j / _BETA[0]) for j, k in enumerate(_BETA))


_ERF32 = _Rational(1.0, 1.0)  # erf(x)
_PHI32 = _Rational(1.0 / math.sqrt(2.0), 0.5)  # Φ(x) - ½ = ½·erf(x/√2)
_HALF32 = np.float32(0.5)
_CHUNK = 65536  # float32 elements per chunk: 256 KiB per scratch array, four of them


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x) = 2/√π ∫₀ˣ exp(-t²) dt, elementwise.

    Shapes: (...) -> (...); float32 in -> float32 out (the fast path), anything
    else is computed and returned in float64.

    >>> erf(np.array([0.0, 0.5, 1.0, -2.0])).round(12).tolist()
    [0.0, 0.520499877813, 0.84270079295, -0.995322265019]
    """
    x = np.asarray(x)
    if x.dtype == np.float32:
        return _chunked(x, None, None, _ERF32, gelu=False)
    x = x.astype(np.float64, copy=False)
    y = np.abs(x)
    result = np.empty_like(x)

    small = y <= 0.5
    ys = y[small]
    ysq = ys * ys
    num, den = _A[4] * ysq, ysq
    for i in range(3):
        num, den = (num + _A[i]) * ysq, (den + _B[i]) * ysq
    result[small] = x[small] * (num + _A[3]) / (den + _B[3])

    mid = (y > 0.5) & (y <= 4.0)
    ym = y[mid]
    num, den = _C[8] * ym, ym
    for i in range(7):
        num, den = (num + _C[i]) * ym, (den + _D[i]) * ym
    erfc_mid = _erfc_tail(ym, (num + _C[7]) / (den + _D[7]))
    result[mid] = np.copysign(1.0 - erfc_mid, x[mid])

    big = y > 4.0
    yb = np.minimum(y[big], _XBIG)
    inv_sq = 1.0 / (yb * yb)
    num, den = _P[5] * inv_sq, inv_sq
    for i in range(4):
        num, den = (num + _P[i]) * inv_sq, (den + _Q[i]) * inv_sq
    ratio = (_INV_SQRT_PI - inv_sq * (num + _P[4]) / (den + _Q[4])) / yb
    erfc_big = np.where(y[big] >= _XBIG, 0.0, _erfc_tail(yb, ratio))
    result[big] = np.copysign(1.0 - erfc_big, x[big])

    result[np.isnan(x)] = np.nan
    return result


def _erfc_tail(y: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """exp(-y²) · ratio, with exp(-y²) computed as Cody does for accuracy."""
    t = np.trunc(y * 16.0) / 16.0
    return np.exp(-t * t) * np.exp(-(y - t) * (y + t)) * ratio


def gelu_erf(
    x: np.ndarray, bias: np.ndarray | None = None, *, out: np.ndarray | None = None
) -> np.ndarray:
    """GELU with the exact erf, of x + bias: (x + b)·Φ(x + b), elementwise.

    Shapes: x (..., F), bias (F,) or None -> (..., F). float32 in -> float32 out,
    computed as below in cache-sized chunks; anything else is computed in float64.
    ``out`` (C-contiguous, x's shape and dtype) may be x itself: the feed-forward
    layer applies its bias and activation in place on its own hidden array.

    An unchecked kernel (``attnlab.nn.layers.gelu`` is the checked public op); it
    equals the plain formula::

        h = x + bias
        return h / 2 * (1 + erf(h / sqrt(2)))
    """
    if out is not None and not (out.flags.c_contiguous and out.shape == x.shape):
        raise AttnlabError(f"out: expected a C-contiguous array of x's shape "
                           f"{shape_str(x.shape)}, got {shape_str(out.shape)}"
                           + ("" if out.flags.c_contiguous else " (not C-contiguous)"))
    if x.dtype != np.float32 or (bias is not None and bias.dtype != np.float32):
        h = x.astype(np.float64) if bias is None else x + bias
        result = 0.5 * h * (1.0 + erf(h * (1.0 / math.sqrt(2.0))))
        if out is None:
            return result
        out[...] = result
        return out
    return _chunked(x, bias, out, _PHI32, gelu=True)


def _chunked(
    x: np.ndarray, bias: np.ndarray | None, out: np.ndarray | None, rational: _Rational, *,
    gelu: bool,
) -> np.ndarray:
    """erf (``gelu=False``) or x·Φ(x) (``gelu=True``) of float32 x + bias, chunk by chunk.

    About 25 elementwise passes; doing them on a few rows at a time keeps the
    working set in the CPU cache instead of streaming a large array through
    memory 25 times.
    """
    src = np.ascontiguousarray(x)
    result = np.empty_like(src) if out is None else out
    if src.size == 0:
        return result
    width = src.shape[-1] if src.ndim else 1
    rows_in, rows_out = src.reshape(-1, width), result.reshape(-1, width)  # (R, F) views
    step = max(1, _CHUNK // width)
    scratch = np.empty((4, min(step, rows_in.shape[0]), width), dtype=np.float32)
    for start in range(0, rows_in.shape[0], step):
        chunk_in, chunk_out = rows_in[start:start + step], rows_out[start:start + step]
        clipped, squares, den, num = scratch[:, : chunk_in.shape[0]]
        if bias is not None:
            np.add(chunk_in, bias, out=chunk_out)
            chunk_in = chunk_out
        _odd_rational(chunk_in, rational, num, clipped, squares, den)
        if gelu:  # x·(½ + (Φ(x) - ½))
            num += _HALF32
            np.multiply(chunk_in, num, out=chunk_out)
        else:
            chunk_out[...] = num
    return result


def _odd_rational(x: np.ndarray, rational: _Rational, out: np.ndarray, clipped: np.ndarray,
                  squares: np.ndarray, den: np.ndarray) -> None:
    """out = c·N(c²)/D(c²) with c = x clamped to ±bound; the rest is scratch of x's shape."""
    np.clip(x, -rational.bound, rational.bound, out=clipped)
    np.multiply(clipped, clipped, out=squares)
    _horner(rational.num, squares, out)  # N(c²)
    _horner(rational.den, squares, den)  # D(c²)
    out /= den
    out *= clipped


def _horner(coefs: tuple[np.float32, ...], y: np.ndarray, out: np.ndarray) -> None:
    """out = Σ_i coefs[i] · yⁱ by Horner's rule, in place (at least two coefficients)."""
    np.multiply(y, coefs[-1], out=out)
    out += coefs[-2]
    for coef in coefs[-3::-1]:
        out *= y
        out += coef
