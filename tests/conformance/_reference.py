"""Plain NumPy attention references shared by the conformance tests.

Written from the formula, independently of attnlab's own code: one matmul for
the scores, additive bias, blocked entries at -inf, a softmax and a second
matmul. Each peer file builds its peer's masks and conventions on top of
these two functions and says how they map onto attnlab's.

Layout: q (..., T, D), k (..., S, D), v (..., S, Dv), all with the same
leading dims (peers that share key/value heads repeat them first, as their
own references do). ``allowed`` is bool, True = may attend, broadcastable to
(..., T, S); ``bias`` is added to the scaled scores. A row with no allowed
key gets weights 0, output 0 and log-sum-exp -inf: attnlab's rule. Peers
that differ there (NaN, a uniform average, a finite log-sum-exp) are mapped
in the test that mirrors them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "assert_close",
    "assert_two_x_rule",
    "max_abs_err",
    "reference_attention",
    "reference_backward",
]


def reference_attention(
    q: Any, k: Any, v: Any, allowed: Any = None, bias: Any = None, scale: float | None = None,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax attention in ``dtype``: -> out (..., T, Dv), weights (..., T, S), lse (..., T)."""
    dt = np.dtype(dtype)
    q_arr, k_arr, v_arr = (np.asarray(a).astype(dt) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q_arr.shape[-1])
    scores = np.matmul(q_arr, np.swapaxes(k_arr, -1, -2)) * dt.type(scale)
    if bias is not None:
        scores = scores + np.asarray(bias).astype(dt)
    if allowed is not None:
        keep = np.broadcast_to(np.asarray(allowed, dtype=bool), scores.shape)
        scores = np.where(keep, scores, dt.type(-np.inf))
    row_max = np.max(scores, axis=-1, keepdims=True)
    empty = np.isneginf(row_max)
    shift = np.where(empty, dt.type(0), row_max)
    with np.errstate(over="ignore", invalid="ignore"):
        exps = np.exp(scores - shift)
    total = np.sum(exps, axis=-1, keepdims=True)
    safe_total = np.where(total == 0, dt.type(1), total)
    weights = exps / safe_total
    out = np.matmul(weights, v_arr)
    lse = np.where(empty, -np.inf, shift.astype(np.float64) + np.log(safe_total.astype(np.float64)))
    return out, weights, lse[..., 0]


def reference_backward(
    q: Any, k: Any, v: Any, dout: Any, allowed: Any = None, bias: Any = None,
    scale: float | None = None, dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`reference_attention` by the chain rule: -> dq, dk, dv, dscores.

    With P the weights: dv = Pᵀ dout, dP = dout vᵀ, dZ = P ⊙ (dP − Σ_S dP ⊙ P),
    dq = dZ k · scale, dk = dZᵀ q · scale; dZ is also the gradient of an additive
    bias. Inputs must share their leading dims (no broadcasting to undo).
    """
    dt = np.dtype(dtype)
    q_arr, k_arr, v_arr, g = (np.asarray(a).astype(dt) for a in (q, k, v, dout))
    if scale is None:
        scale = 1.0 / np.sqrt(q_arr.shape[-1])
    _, weights, _ = reference_attention(q_arr, k_arr, v_arr, allowed, bias, scale, dt)
    dv = np.matmul(np.swapaxes(weights, -1, -2), g)
    dweights = np.matmul(g, np.swapaxes(v_arr, -1, -2))
    dscores = weights * (dweights - np.sum(dweights * weights, axis=-1, keepdims=True))
    dq = np.matmul(dscores, k_arr) * dt.type(scale)
    dk = np.matmul(np.swapaxes(dscores, -1, -2), q_arr) * dt.type(scale)
    return dq, dk, dv, dscores


def max_abs_err(actual: Any, expected: Any) -> float:
    """max |actual - expected| in float64 (0.0 for empty arrays)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    return float(np.max(np.abs(a - e))) if a.size else 0.0


def assert_close(actual: Any, expected: Any, *, atol: Any, rtol: float = 0.0,
                 what: str = "") -> None:
    """|actual - expected| <= atol + rtol·|expected| everywhere, and no NaN in ``actual``.

    ``atol`` may be an array broadcasting against the result (per-row tolerances).
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    assert not np.isnan(a).any(), f"{what}: NaN in the result"
    err = np.abs(a - e)
    bound = atol + rtol * np.abs(e)
    bad = err > bound
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), a.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.size} entries off; worst at {tuple(map(int, worst))}: "
            f"got {a[worst]!r}, expected {e[worst]!r} "
            f"(atol {float(np.broadcast_to(atol, a.shape)[worst]):g}, rtol {rtol:g})"
        )


def assert_two_x_rule(actual: Any, baseline: Any, golden: Any, *, factor: float = 2.0,
                      slack: float = 0.0, what: str = "") -> None:
    """FlashAttention's rule: error(actual) <= factor · error(baseline) + slack, both vs golden.

    ``golden`` is a float64 reference on the same (rounded) inputs, ``baseline`` a plain
    reference computed in the low precision.
    """
    a = np.asarray(actual, dtype=np.float64)
    assert not np.isnan(a).any(), f"{what}: NaN in the result"
    err = max_abs_err(a, golden)
    base = max_abs_err(baseline, golden)
    assert err <= factor * base + slack, (
        f"{what}: error {err:.3g} > {factor:g} x the plain reference's {base:.3g} + {slack:g}"
    )
