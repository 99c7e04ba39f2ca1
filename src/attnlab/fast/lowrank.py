"""Low-rank and kernel approximations of attention: Linformer, Nyström, Performer.

Performer (FAVOR+) is in :mod:`attnlab.fast.performer`.

Unlike :mod:`attnlab.fast.sparse`, these are *approximations*: they do not equal
softmax attention for any mask, and :mod:`attnlab.studies.approx` measures by how
much they miss it. Each is exact in one limiting case, which the tests check:

- Linformer with E = F = identity (k = S) is plain attention;
- Nyström with m = T = S landmarks is plain attention (the pseudo-inverse
  cancels: A A⁺ A = A), up to how far the iterative pseudo-inverse converged;
- Performer's estimate is unbiased, and its error falls like 1/√(features).

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim; ``...`` is any number of leading (batch) dims. k (Linformer
rows), m (Nyström landmarks) and M (Performer features) are the knobs.

Mask convention: True = may attend. Only Performer takes ``key_padding``
(..., S), True = a real key; Linformer and Nyström mix keys together before the
softmax, so no mask applies to them exactly, and they have no causal form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..attention import scaled_dot_product_attention
from ..checks import as_float_array, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..kernel import check_inputs
from ..masked_softmax import stable_softmax

__all__ = [
    "linformer_projection",
    "linformer_attention",
    "segment_means",
    "iterative_pinv",
    "nystrom_attention",
]


def _no_causal(is_causal: Any, method: str, why: str) -> None:
    if check_flag(is_causal, "is_causal"):
        raise AttnlabError(f"is_causal: {method} has no causal form ({why}); got is_causal=True")



# ------------------------------------------------------------------------ Linformer


def linformer_projection(
    S: int, rank: int, *, kind: str = "gaussian", seed: int = 0, dtype: Any = np.float64
) -> np.ndarray:
    """A fixed Linformer projection: -> (r, S) with r = ``rank``.

    - ``kind="gaussian"``: entries N(0, 1/rank) from ``seed`` (Wang et al. 2020,
      §4: the Johnson–Lindenstrauss argument, and the usual initialisation);
    - ``kind="pool"``: row s averages the keys of segment s (the segments of
      :func:`segment_means`), i.e. mean pooling along the sequence, one of the
      paper's alternative projections (§5); E K is then K's segment means.

    Linformer *learns* E and F; pass learned matrices of the same shape to
    :func:`linformer_attention` when you have them. Untrained, the Gaussian
    projection is a poor approximation (see the study).

    >>> linformer_projection(100, 8).shape
    (8, 100)
    >>> linformer_projection(5, 2, kind="pool").round(2).tolist()
    [[0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.33, 0.33, 0.33]]
    """
    S = check_positive_int(S, "S")
    rank = check_positive_int(rank, "rank")
    seed = check_positive_int(seed, "seed", allow_zero=True)
    if kind == "gaussian":
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((rank, S)) / np.sqrt(rank)).astype(dtype)  # (rank, S)
    if kind == "pool":
        if rank > S:
            raise AttnlabError(f"rank: expected 1..{S} segments for kind='pool', got {rank}")
        bounds = (np.arange(rank + 1) * S) // rank  # (rank + 1,) segment edges, as segment_means
        segment = np.searchsorted(bounds, np.arange(S), side="right") - 1  # (S,)
        pool = (segment[None, :] == np.arange(rank)[:, None]).astype(np.float64)  # (rank, S)
        return (pool / pool.sum(axis=1, keepdims=True)).astype(dtype)
    raise AttnlabError(f"kind: expected 'gaussian' or 'pool', got {kind!r}")


def _check_projection(E: Any, name: str, S: int, dtype: np.dtype) -> np.ndarray:
    arr = as_float_array(E, name)
    if arr.ndim < 2 or arr.shape[-1] != S:
        raise ShapeError(f"{name}: expected (..., r, S) with S = {S}, got {shape_str(arr.shape)}")
    return arr.astype(dtype, copy=False)


def linformer_attention(
    q: Any,
    k: Any,
    v: Any,
    key_proj: Any,
    value_proj: Any = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Linformer attention: keys and values projected along the sequence to k rows.

    Shapes:
        q  (..., T, D)
        k  (..., S, D)
        v  (..., S, Dv)
        key_proj    (..., r, S)  E, projects the keys (learned, or :func:`linformer_projection`)
        value_proj  (..., r, S)  F, projects the values; None = E (the paper's shared one)
        -> (..., T, Dv)

    Formula (Wang et al. 2020, eq. 7)::

        K̄ = E K                                   (..., k, D)
        V̄ = F V                                   (..., k, Dv)
        out = softmax(Q K̄ᵀ · scale) V̄           (..., T, Dv)

    Time O(T·k·D + k·S·D), memory O(T·k): linear in T for a fixed k. With
    E = F = I (k = S) it is plain attention. Each projected key mixes all S
    positions, so a query would see the future: ``is_causal=True`` is an error.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((6, 4))
    >>> bool(np.allclose(linformer_attention(x, x, x, np.eye(6)),
    ...                  scaled_dot_product_attention(x, x, x)))
    True
    """
    _no_causal(is_causal, "Linformer", "each of its k rows mixes all S positions, future included")
    inputs = check_inputs(q, k, v, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, scale_value, out_dtype = (
        inputs.q, inputs.k, inputs.v, inputs.scale, inputs.out_dtype
    )
    S = k_arr.shape[-2]
    E_arr = _check_projection(key_proj, "key_proj", S, q_arr.dtype)
    F_arr = E_arr if value_proj is None else _check_projection(
        value_proj, "value_proj", S, q_arr.dtype
    )
    if F_arr.shape[-2] != E_arr.shape[-2]:
        raise ShapeError(
            f"value_proj: expected (..., {E_arr.shape[-2]}, {S}) to match key_proj's rank "
                f"r = {E_arr.shape[-2]}, "
            f"got {shape_str(F_arr.shape)}"
        )
    keys = E_arr @ k_arr  # (..., k, D)
    values = F_arr @ v_arr  # (..., k, Dv)
    out = scaled_dot_product_attention(q_arr, keys, values, scale=scale_value)  # (..., T, Dv)
    return out.astype(out_dtype, copy=False)


# ------------------------------------------------------------------------- Nyström


def segment_means(x: Any, num_segments: int) -> np.ndarray:
    """Means of m contiguous segments along the sequence: (..., n, D) -> (..., m, D).

    Segment s covers rows [⌊s·n/m⌋, ⌊(s+1)·n/m⌋): when m does not divide n the
    segments differ in length by one, and every row belongs to exactly one.

    >>> segment_means(np.arange(5.0)[:, None], 2).ravel().tolist()
    [0.5, 3.0]
    """
    arr = as_float_array(x, "x")
    if arr.ndim < 2:
        raise ShapeError(f"x: expected (..., n, D), got {shape_str(arr.shape)}")
    n = arr.shape[-2]
    m = check_positive_int(num_segments, "num_segments")
    if m > n:
        raise AttnlabError(f"num_segments: expected 1..{n} (the sequence length), got {m}")
    bounds = (np.arange(m + 1) * n) // m  # (m + 1,) segment edges
    sums = np.add.reduceat(arr, bounds[:-1], axis=-2)  # (..., m, D)
    return sums / np.diff(bounds)[:, None].astype(arr.dtype)  # (..., m, D)


def iterative_pinv(a: Any, num_iterations: int = 6) -> np.ndarray:
    """Moore–Penrose pseudo-inverse by the iteration of Nyströmformer (Xiong et al. 2021, eq. 13).

    Shapes: a (..., m, m) -> (..., m, m).

    Formula::

        Z₀ = aᵀ / (‖a‖₁ ‖a‖∞)                       (max column sum × max row sum)
        Zⱼ₊₁ = ¼ Zⱼ (13 I − a Zⱼ (15 I − a Zⱼ (7 I − a Zⱼ)))

    With X = a Z, each step maps the eigenvalues x of X (all in (0, 1] from Z₀
    on) through p(x) = (13x − 15x² + 7x³ − x⁴)/4, which fixes 1 with zero first
    and second derivative: the residual ‖I − a Z‖ on the range of a falls
    cubically once it is below 1, while a singular value σ needs about
    log(‖a‖₁‖a‖∞ / σ²) / log 3.25 steps to get there. The paper's 6 steps
    suit well-conditioned landmark kernels; ill-conditioned ones need more
    (see the tests). On a *singular* matrix more is not better: the iteration
    reaches a⁺, then rounding errors in the null space grow ×3.25 a step until,
    ~30 steps later, Z inverts noise. Keep the count small, as the paper does.

    >>> a = np.array([[2.0, 1.0], [1.0, 3.0]])
    >>> bool(np.allclose(iterative_pinv(a, 20), np.linalg.inv(a)))
    True
    """
    arr = as_float_array(a, "a")
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2]:
        raise ShapeError(f"a: expected square matrices (..., m, m), got {shape_str(arr.shape)}")
    steps = check_positive_int(num_iterations, "num_iterations", allow_zero=True)
    magnitude = np.abs(arr)
    norm_1 = magnitude.sum(axis=-2).max(axis=-1)  # (...,) max column sum
    norm_inf = magnitude.sum(axis=-1).max(axis=-1)  # (...,) max row sum
    denominator = (norm_1 * norm_inf)[..., None, None]
    z = np.swapaxes(arr, -1, -2) / np.where(denominator == 0, 1, denominator)  # (..., m, m)
    identity = np.eye(arr.shape[-1], dtype=arr.dtype)  # (m, m)
    for _ in range(steps):
        az = arr @ z  # (..., m, m)
        z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


def nystrom_attention(
    q: Any,
    k: Any,
    v: Any,
    num_landmarks: int,
    *,
    pinv_iterations: int | None = 6,
    is_causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Nyströmformer attention (Xiong et al. 2021) with m segment-mean landmarks.

    Shapes:
        q  (..., T, D)
        k  (..., S, D)
        v  (..., S, Dv)
        num_landmarks  m, 1 ≤ m ≤ min(T, S); m need not divide T or S
        pinv_iterations  steps of :func:`iterative_pinv` (the paper's 6), or
                         None for the exact ``numpy.linalg.pinv`` (an SVD)
        -> (..., T, Dv)

    Formula (eq. 14; landmarks by :func:`segment_means`)::

        Q̃, K̃ = segment_means(Q, m), segment_means(K, m)      (..., m, D)
        F̃ = softmax(Q K̃ᵀ · scale)                           (..., T, m)
        Ã = softmax(Q̃ K̃ᵀ · scale)                           (..., m, m)
        B̃ = softmax(Q̃ Kᵀ · scale)                           (..., m, S)
        out = F̃ · pinv(Ã) · (B̃ V)                            (..., T, Dv)

    Time O((T + S)·m·D + m³), memory O((T + S)·m): linear in T for fixed m.
    With m = T = S the landmarks are the rows themselves, F̃ = Ã = B̃ = A and
    A·A⁺·A·V = A·V: plain attention, to the accuracy of the pseudo-inverse.
    The landmarks average over future positions, so ``is_causal=True`` is an error.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((6, 4))
    >>> bool(np.allclose(nystrom_attention(x, x, x, 6, pinv_iterations=None),
    ...                  scaled_dot_product_attention(x, x, x)))
    True
    """
    _no_causal(is_causal, "Nyström attention", "its landmarks average over future positions")
    inputs = check_inputs(q, k, v, scale=scale, tiled=True)
    q_arr, k_arr, v_arr, scale_value, out_dtype = (
        inputs.q, inputs.k, inputs.v, inputs.scale, inputs.out_dtype
    )
    T, S = q_arr.shape[-2], k_arr.shape[-2]
    m = check_positive_int(num_landmarks, "num_landmarks")
    if m > min(T, S):
        raise AttnlabError(f"num_landmarks: expected 1..min(T, S) = {min(T, S)}, got {m}")
    if pinv_iterations is not None:
        pinv_iterations = check_positive_int(pinv_iterations, "pinv_iterations")
    scale_arr = np.asarray(scale_value, dtype=q_arr.dtype)
    q_landmarks = segment_means(q_arr, m)  # (..., m, D)
    k_landmarks = segment_means(k_arr, m)  # (..., m, D)
    k_landmarks_t = np.swapaxes(k_landmarks, -1, -2)  # (..., D, m)
    kernel_1 = stable_softmax(q_arr @ k_landmarks_t * scale_arr)  # (..., T, m)
    kernel_2 = stable_softmax(q_landmarks @ k_landmarks_t * scale_arr)  # (..., m, m)
    kernel_3 = stable_softmax(q_landmarks @ np.swapaxes(k_arr, -1, -2) * scale_arr)  # (..., m, S)
    if pinv_iterations is None:
        kernel_2_inv = np.linalg.pinv(kernel_2)  # (..., m, m)
    else:
        kernel_2_inv = iterative_pinv(kernel_2, pinv_iterations)  # (..., m, m)
    landmark_values = kernel_3 @ v_arr  # (..., m, Dv)
    out = kernel_1 @ (kernel_2_inv @ landmark_values)  # (..., T, Dv)
    return out.astype(out_dtype, copy=False)
