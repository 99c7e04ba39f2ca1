"""Performer (FAVOR+): softmax attention estimated with positive random features.

Like the other approximations in :mod:`attnlab.fast.lowrank`, it does not equal
softmax attention for any mask, and :mod:`attnlab.studies.approx` measures by how
much it misses it. Its limiting case, which the tests check: the estimate is
unbiased, and its error falls like 1/√(features).

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim; ``...`` is any number of leading (batch) dims. M (Performer
features) is the knob.

Mask convention: True = may attend. Performer takes ``key_padding`` (..., S),
True = a real key, and has a causal form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_float_array, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..kernel import check_inputs, check_key_padding

__all__ = [
    "orthogonal_random_features",
    "performer_features",
    "performer_attention",
]


def orthogonal_random_features(num_features: int, D: int, *, seed: int = 0) -> np.ndarray:
    """Performer's orthogonal random projection ω: -> (M, D) float64.

    Rows come in blocks of D mutually orthogonal directions (QR of a Gaussian
    matrix; the last block is cut to fit M), each row rescaled to the length of
    a D-dimensional Gaussian vector (chi with D degrees of freedom), so every
    row is marginally N(0, I_D) as the unbiased estimator needs, while rows in
    a block are orthogonal, which lowers the variance (Choromanski et al. 2021,
    §2.4; the ``scaling=0`` option of their implementation).

    >>> w = orthogonal_random_features(8, 4)
    >>> w.shape, bool(np.allclose((w[:4] @ w[:4].T)[~np.eye(4, dtype=bool)], 0))
    ((8, 4), True)
    """
    M = check_positive_int(num_features, "num_features")
    D = check_positive_int(D, "D")
    seed = check_positive_int(seed, "seed", allow_zero=True)
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(-(-M // D)):
        orthogonal, triangular = np.linalg.qr(rng.standard_normal((D, D)))  # (D, D) each
        # QR fixes the signs of R's diagonal, which skews Q's columns (LAPACK makes the
        # first column's first entry always negative); multiplying column i by the sign
        # of R[i, i] makes Q Haar-distributed (Mezzadri 2007), the directions uniform.
        orthogonal = orthogonal * np.sign(np.diag(triangular))[None, :]
        blocks.append(orthogonal.T)  # rows orthonormal
    directions = np.concatenate(blocks)[:M]  # (M, D)
    lengths = np.linalg.norm(rng.standard_normal((M, D)), axis=1)  # (M,)
    return directions * lengths[:, None]  # (M, D)


def _check_features(projection: Any, D: int, dtype: np.dtype) -> np.ndarray:
    arr = as_float_array(projection, "projection")
    if arr.ndim != 2 or arr.shape[1] != D or arr.shape[0] == 0:
        raise ShapeError(f"projection: expected (M, {D}) with M ≥ 1 to match the head dim "
                         f"D = {D}, got {shape_str(arr.shape)}")
    return arr.astype(dtype, copy=False)


def _positive_features(
    x: np.ndarray, projection: np.ndarray, axes: tuple[int, ...],
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """φ(x) = exp(ωx − ‖x‖²/2 − c) / √M, with c the max over ``axes`` (of kept rows).

    Shapes: x (..., n, D), projection (M, D), keep (..., n) bool -> (..., n, M).
    The constant c cancels between Performer's numerator and denominator; it
    keeps every exponent ≤ 0, so large logits cannot overflow.
    """
    logits = x @ projection.T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)  # (..., n, M)
    if keep is not None:
        logits = np.where(keep[..., None], logits, -np.inf)  # padded rows: exp(-inf) = 0
    if logits.size:
        top = np.max(logits, axis=axes, keepdims=True)
        logits = logits - np.where(np.isneginf(top), 0.0, top)
    return np.exp(logits) / np.sqrt(projection.shape[0])  # (..., n, M)


def performer_features(
    q: Any,
    k: Any,
    projection: Any,
    *,
    key_padding: Any = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FAVOR+ positive random features of queries and keys: -> φ(Q) (..., T, M), φ(K) (..., S, M).

    With x = q·√scale, y = k·√scale and ω ~ ``projection`` rows,
    φ(x) = exp(ωx − ‖x‖²/2) / √M has E[φ(x)ᵀφ(y)] = exp(scale · q·k): the
    softmax kernel, estimated with positive terms only (Choromanski et al.
    2021, Lemma 1). As in the paper's code, each query row subtracts its own
    max and the keys one shared max (over real keys only): constants that
    cancel in attention and keep every exp() ≤ 1. Padded keys (``key_padding``
    False) get φ = 0, so they add to neither the numerator nor the denominator.
    """
    q_arr = as_float_array(q, "q")
    k_arr = as_float_array(k, "k")
    if q_arr.ndim < 2 or k_arr.ndim < 2 or q_arr.shape[-1] != k_arr.shape[-1]:
        raise ShapeError(f"q, k: expected (..., T, D) and (..., S, D) with the same D, got "
                         f"{shape_str(q_arr.shape)} and {shape_str(k_arr.shape)}")
    inputs = check_inputs(q_arr, k_arr, k_arr[..., :1], scale=scale, tiled=True)
    q_arr, k_arr, batch, scale_value = inputs.q, inputs.k, inputs.batch, inputs.scale
    padding = check_key_padding(key_padding, batch, k_arr.shape[-2])
    omega = _check_features(projection, q_arr.shape[-1], q_arr.dtype)
    root = np.asarray(np.sqrt(scale_value), dtype=q_arr.dtype)
    phi_q = _positive_features(q_arr * root, omega, axes=(-1,))  # (..., T, M)
    phi_k = _positive_features(k_arr * root, omega, axes=(-2, -1), keep=padding)  # (..., S, M)
    return phi_q, phi_k


def _performer_chunk() -> int:
    return 128


def performer_attention(
    q: Any,
    k: Any,
    v: Any,
    num_features: int | None = None,
    *,
    projection: Any = None,
    seed: int = 0,
    is_causal: bool = False,
    key_padding: Any = None,
    scale: float | None = None,
) -> np.ndarray:
    """Performer (FAVOR+) attention: softmax attention estimated with M positive random features.

    Shapes:
        q             (..., T, D)
        k             (..., S, D)
        v             (..., S, Dv)
        num_features  M: draw ω with :func:`orthogonal_random_features` (M, D, seed)
        projection    (M, D): use this ω instead (give one of the two)
        is_causal     query i attends to keys j ≤ S - T + i (bottom-right aligned)
        key_padding   (..., S) bool, True = a real key (or None)
        ->            (..., T, Dv)

    Equivalent to the plain computation (which builds a T × S matrix)::

        phi_q, phi_k = performer_features(q, k, ω, key_padding=key_padding, scale=scale)
        kernel = phi_q @ phi_kᵀ                                 (..., T, S)
        if is_causal:
            kernel = where(causal_mask(T, S), kernel, 0)
        out = (kernel @ v) / kernel.sum(-1, keepdims=True)      (..., T, Dv)

    Non-causal: out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1), time O((T + S)·M·Dv).
    Causal: the same with prefix sums of φ(k)vᵀ and φ(k), carried from chunk to
    chunk of 128 queries (inside a chunk, a masked 128 × 128 product), so memory
    stays O(M·Dv + 128²) instead of the O(S·M·Dv) of explicit prefix sums.

    A row whose normaliser is 0 (no real key, or every product underflowed)
    gets output 0, the library's rule for a row with nothing to attend to.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((6, 4))
    >>> performer_attention(x, x, x, 16, is_causal=True).shape
    (6, 4)
    """
    inputs = check_inputs(q, k, v, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, batch, scale_value, out_dtype = (
        inputs.q, inputs.k, inputs.v, inputs.batch, inputs.scale, inputs.out_dtype
    )
    D = q_arr.shape[-1]
    is_causal = check_flag(is_causal, "is_causal")
    if (num_features is None) == (projection is None):
        raise AttnlabError(
            "num_features, projection: expected exactly one of them (a feature count to "
            f"draw ω from seed, or ω itself), got num_features={num_features!r} and "
            f"projection={'None' if projection is None else 'an array'}"
        )
    if D == 0:
        raise ShapeError(f"q: expected a head dim D ≥ 1 for random features, got "
                         f"{shape_str(q_arr.shape)}")
    omega = (orthogonal_random_features(num_features, D, seed=seed)
             if num_features is not None else projection)
    phi_q, phi_k = performer_features(q_arr, k_arr, omega, key_padding=key_padding,
                                      scale=scale_value)  # (..., T, M), (..., S, M)
    phi_q = np.broadcast_to(phi_q, (*batch, *phi_q.shape[-2:]))
    if not is_causal:
        kv = np.swapaxes(phi_k, -1, -2) @ v_arr  # (..., M, Dv)
        numerator = phi_q @ kv  # (..., T, Dv)
        denominator = phi_q @ np.sum(phi_k, axis=-2)[..., :, None]  # (..., T, 1)
    else:
        numerator, denominator = _causal_linear_attention(phi_q, phi_k, v_arr, batch)
    out = numerator / np.where(denominator == 0, 1, denominator)  # (..., T, Dv)
    return out.astype(out_dtype, copy=False)


def _causal_linear_attention(
    phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray, batch: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Causal numerator (..., T, Dv) and denominator (..., T, 1) by chunked prefix sums.

    Query i (position S - T + i) sees keys j ≤ S - T + i. Keys before a chunk's
    first query are folded into the running state (Σ φ(k)vᵀ, Σ φ(k)); keys
    inside the chunk's span go through a small masked product.
    """
    T, M = phi_q.shape[-2:]
    S, Dv = v.shape[-2], v.shape[-1]
    dtype = phi_q.dtype
    state_kv = np.zeros((*batch, M, Dv), dtype=dtype)  # (..., M, Dv) Σ φ(k_j) v_jᵀ
    state_k = np.zeros((*batch, M, 1), dtype=dtype)  # (..., M, 1) Σ φ(k_j)
    numerator = np.zeros((*batch, T, Dv), dtype=dtype)  # (..., T, Dv)
    denominator = np.zeros((*batch, T, 1), dtype=dtype)  # (..., T, 1)
    offset, folded = S - T, 0  # keys [0, folded) are in the state
    chunk = _performer_chunk()
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        first, last = start + offset, stop - 1 + offset  # positions of the chunk's queries
        upto = min(max(first, 0), S)
        if upto > folded:
            phi_new = phi_k[..., folded:upto, :]  # (..., n, M)
            state_kv = state_kv + np.swapaxes(phi_new, -1, -2) @ v[..., folded:upto, :]
            state_k = state_k + np.sum(phi_new, axis=-2)[..., :, None]
            folded = upto
        rows = phi_q[..., start:stop, :]  # (..., c, M)
        numerator[..., start:stop, :] = rows @ state_kv
        denominator[..., start:stop, :] = rows @ state_k
        end = min(max(last + 1, 0), S)  # keys [folded, end) lie inside the chunk's span
        if end > folded:
            local = rows @ np.swapaxes(phi_k[..., folded:end, :], -1, -2)  # (..., c, n)
            key_pos = np.arange(folded, end)
            query_pos = np.arange(first, last + 1)
            local = np.where(key_pos[None, :] <= query_pos[:, None], local, 0)  # (..., c, n)
            numerator[..., start:stop, :] += local @ v[..., folded:end, :]
            denominator[..., start:stop, :] += np.sum(local, axis=-1, keepdims=True)
    return numerator, denominator
