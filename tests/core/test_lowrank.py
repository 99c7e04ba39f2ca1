"""Linformer, Nyström and Performer: their exact limits, their plain twins, their errors.

Tolerances, and why:
- exact limits in float64 (Linformer E = F = I, Nyström m = T with an exact or
  converged pseudo-inverse): 1e-12 absolute, as for the sparse paths; the
  computations differ from dense attention only in rounding (~1e-15);
- Performer's linear-time path against its quadratic plain twin: 1e-12, the
  same sums in another order;
- Performer's approximation error: a statistical statement, see the test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnlab import AttnlabError, ShapeError, causal_mask, scaled_dot_product_attention, softmax
from attnlab.fast.lowrank import (
    iterative_pinv,
    linformer_attention,
    linformer_projection,
    nystrom_attention,
    segment_means,
)
from attnlab.fast.performer import (
    orthogonal_random_features,
    performer_attention,
    performer_features,
)

TOL = 1e-12


def qkv(T, S, D=8, Dv=5, batch=(2,), seed=0, amplitude=1.0):
    rng = np.random.default_rng(seed)
    q = amplitude * rng.standard_normal((*batch, T, D))
    k = amplitude * rng.standard_normal((*batch, S, D))
    v = rng.standard_normal((*batch, S, Dv))
    return q, k, v


def relative_error(out, ref):
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


# ------------------------------------------------------------------------ Linformer


def test_linformer_identity_projection_is_exact():
    q, k, v = qkv(30, 30, batch=(2, 3))
    eye = np.eye(30)
    np.testing.assert_allclose(linformer_attention(q, k, v, eye, eye),
                               scaled_dot_product_attention(q, k, v), rtol=0, atol=TOL)
    np.testing.assert_allclose(linformer_attention(q, k, v, eye),  # F defaults to E
                               scaled_dot_product_attention(q, k, v), rtol=0, atol=TOL)


def test_linformer_is_its_formula():
    """softmax(Q (E K)ᵀ / √D) (F V), with separate per-head projections (broadcast)."""
    q, k, v = qkv(12, 40, batch=(2, 3))
    E = np.stack([linformer_projection(40, 6, seed=s) for s in range(3)])  # (H, k, S)
    F = linformer_projection(40, 6, seed=9)
    expected = softmax(q @ np.swapaxes(E @ k, -1, -2) / np.sqrt(8)) @ (F @ v)
    np.testing.assert_allclose(linformer_attention(q, k, v, E, F), expected, rtol=0, atol=TOL)


def test_linformer_projection_statistics():
    E = linformer_projection(4000, 50, seed=1)
    assert E.shape == (50, 4000)
    assert abs(E.var() * 50 - 1) < 0.02  # entries N(0, 1/k): var·k = 1 within 2%
    assert np.array_equal(E, linformer_projection(4000, 50, seed=1))


def test_linformer_refuses_causal_and_bad_shapes():
    q, k, v = qkv(10, 10)
    with pytest.raises(AttnlabError, match="causal: Linformer has no causal form"):
        linformer_attention(q, k, v, np.eye(10), is_causal=True)
    with pytest.raises(ShapeError,
                       match=r"key_proj: expected \(\.\.\., r, S\) with S = 10, got \(4, 9\)"):
        linformer_attention(q, k, v, np.ones((4, 9)))
    with pytest.raises(ShapeError, match="value_proj: expected"):
        linformer_attention(q, k, v, np.ones((4, 10)), np.ones((3, 10)))


# -------------------------------------------------------------------------- Nyström


def test_segment_means_uneven_segments():
    """T = 10, m = 4: segments of 2, 3, 2, 3 rows ([⌊s·10/4⌋, ⌊(s+1)·10/4⌋)), each row once."""
    x = np.arange(10.0)[:, None] * np.array([1.0, -2.0])  # (10, 2)
    means = segment_means(x, 4)
    expected = np.array([x[0:2].mean(0), x[2:5].mean(0), x[5:7].mean(0), x[7:10].mean(0)])
    np.testing.assert_allclose(means, expected, rtol=0, atol=TOL)
    np.testing.assert_array_equal(segment_means(x, 10), x)  # m = n: the rows themselves
    with pytest.raises(AttnlabError, match=r"num_segments: expected 1\.\.10"):
        segment_means(x, 11)


def test_iterative_pinv_converges_to_the_pseudo_inverse():
    rng = np.random.default_rng(0)
    a = softmax(rng.standard_normal((3, 16, 16)))  # row-stochastic, like Nyström's kernel
    z = iterative_pinv(a, 40)
    np.testing.assert_allclose(z, np.linalg.pinv(a), rtol=0, atol=1e-9)
    # A singular matrix (rank 3): the iteration reaches a⁺ (10 steps here), then
    # drifts: rounding errors ε in the null space grow ×3.25 a step (p(x) ≈ 13x/4
    # near 0), so after ~log(1/ε)/log 3.25 ≈ 30 more steps Z inverts noise.
    low_rank = rng.standard_normal((10, 3)) @ rng.standard_normal((3, 10))
    pinv = np.linalg.pinv(low_rank)
    assert relative_error(iterative_pinv(low_rank, 10), pinv) < 1e-10
    assert relative_error(iterative_pinv(low_rank, 45), pinv) > 1


def test_nystrom_all_landmarks_exact_pinv_is_exact():
    """m = T = S: landmarks are the rows, so F̃ = Ã = B̃ = A and A A⁺ A V = A V."""
    q, k, v = qkv(40, 40, batch=(2, 3))
    np.testing.assert_allclose(nystrom_attention(q, k, v, 40, pinv_iterations=None),
                               scaled_dot_product_attention(q, k, v), rtol=0, atol=TOL)


def test_nystrom_all_landmarks_iterative_pinv_is_exact_within_its_residual():
    """With the iterative pseudo-inverse Z: out − A V = (A Z − I) A V, so

        ‖out − AV‖_F ≤ ‖I − A Z‖₂ ‖AV‖_F.

    The paper's 6 steps leave ‖I − A Z‖₂ near 1 for this A (condition number
    ~1e3: a singular value σ needs ~log(1/σ²)/log 3.25 steps before the cubic
    convergence starts), so its output is far off while the bound still holds;
    40 steps take the residual to rounding level, and the output to 1e-12.
    """
    T = 64
    q, k, v = qkv(T, T, D=16, batch=())
    a = softmax(q @ k.T / 4)  # (T, T) exact attention weights
    exact = a @ v
    assert np.linalg.cond(a) > 100  # not a trivial case
    for steps in (6, 40):
        residual = np.linalg.norm(np.eye(T) - a @ iterative_pinv(a, steps), 2)
        error = np.linalg.norm(nystrom_attention(q, k, v, T, pinv_iterations=steps) - exact)
        assert error <= residual * np.linalg.norm(exact) * (1 + 1e-9) + 1e-13
    assert residual < 1e-12  # after 40 steps
    np.testing.assert_allclose(nystrom_attention(q, k, v, T, pinv_iterations=40), exact,
                               rtol=0, atol=TOL)


def test_nystrom_uneven_segments_is_its_formula():
    """T = 50, S = 37 with m = 8 (divides neither): the formula with explicit segments."""
    q, k, v = qkv(50, 37, batch=(2,))

    def means(x, m):
        n = x.shape[-2]
        return np.stack([x[..., s * n // m:(s + 1) * n // m, :].mean(-2) for s in range(m)], -2)

    ql, kl = means(q, 8), means(k, 8)
    scale = 1 / np.sqrt(8)
    f = softmax(q @ np.swapaxes(kl, -1, -2) * scale)
    a = softmax(ql @ np.swapaxes(kl, -1, -2) * scale)
    b = softmax(ql @ np.swapaxes(k, -1, -2) * scale)
    expected = f @ np.linalg.pinv(a) @ (b @ v)
    np.testing.assert_allclose(nystrom_attention(q, k, v, 8, pinv_iterations=None), expected,
                               rtol=0, atol=1e-10)


def test_nystrom_validation():
    q, k, v = qkv(10, 10)
    with pytest.raises(AttnlabError, match=r"num_landmarks: expected 1\.\.min\(T, S\) = 10"):
        nystrom_attention(q, k, v, 11)
    with pytest.raises(AttnlabError, match="causal: Nyström attention has no causal form"):
        nystrom_attention(q, k, v, 4, is_causal=True)


# ------------------------------------------------------------------------ Performer


def performer_plain(q, k, v, omega, *, causal=False, key_padding=None):
    """The docstring's plain computation: the T × S kernel matrix, then normalise."""
    phi_q, phi_k = performer_features(q, k, omega, key_padding=key_padding)
    kernel = phi_q @ np.swapaxes(phi_k, -1, -2)  # (..., T, S)
    if causal:
        kernel = np.where(causal_mask(q.shape[-2], k.shape[-2]), kernel, 0)
    total = kernel.sum(-1, keepdims=True)
    return (kernel @ v) / np.where(total == 0, 1, total)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(300, 300), (100, 300), (300, 100), (1, 1), (129, 129)])
def test_performer_equals_its_plain_twin(causal, T, S):
    q, k, v = qkv(T, S, batch=(2, 2))
    rng = np.random.default_rng(3)
    padding = rng.random((2, 1, S)) > 0.3
    omega = orthogonal_random_features(32, 8, seed=1)
    got = performer_attention(q, k, v, projection=omega, is_causal=causal, key_padding=padding)
    expected = performer_plain(q, k, v, omega, causal=causal, key_padding=padding)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_performer_padding_is_the_same_as_dropping_the_keys():
    """Masked key features (not only V): padded keys change nothing, however large they are."""
    q, k, v = qkv(20, 30, batch=())
    padding = np.ones(30, bool)
    padding[[3, 17, 29]] = False
    k_big = k.copy()
    k_big[~padding] *= 50  # huge padded keys would dominate a shared max, or the sums
    omega = orthogonal_random_features(64, 8, seed=2)
    for causal in (False, True):
        got = performer_attention(q, k_big, v, projection=omega, key_padding=padding,
                                  is_causal=causal)
        if causal:  # keep the causal positions: compare with the plain twin instead
            expected = performer_plain(q, k, v, omega, causal=True, key_padding=padding)
        else:
            expected = performer_attention(q, k[padding], v[padding], projection=omega)
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_performer_is_stable_for_large_logits():
    """Logits of ~1e3: exp() without the max shift overflows; FAVOR+ stays finite.

    Positive features make every weight ≥ 0, so each output row is a convex
    combination of the value rows: inside their min and max.
    """
    q, k, v = qkv(50, 50, D=16, batch=(2,), amplitude=30.0)
    omega = orthogonal_random_features(64, 16, seed=0)
    x = q * 16 ** -0.25
    unshifted = x @ omega.T - 0.5 * np.sum(x * x, -1, keepdims=True)
    assert np.abs(unshifted).max() > 710  # np.exp would overflow here: the test can fail
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid-value RuntimeWarning
        for causal in (False, True):
            out = performer_attention(q, k, v, projection=omega, is_causal=causal)
            assert np.isfinite(out).all()
            assert (out >= v.min(axis=-2, keepdims=True) - 1e-9).all()
            assert (out <= v.max(axis=-2, keepdims=True) + 1e-9).all()


def test_performer_error_falls_as_features_grow():
    """Statistical: mean relative error over 20 seeds at M = 16, 64, 256 features.

    Each kernel entry φ(q)ᵀφ(k) is a mean over M features of an unbiased
    estimate of exp(q·k/√D) (orthogonal blocks only lower its variance), so its
    standard deviation falls like 1/√M, and the normalised output's error with
    it once that is small: M = 16 → 256 should divide the error by ~4. We ask
    for 2, and for each step to help; over 20 seeds the standard error of each
    mean is ~5% of it (measured), so the margin is wide. Small logits
    (q, k ~ 0.3·N(0, 1)) keep the estimator in that regime; at larger logits
    the variance grows like exp(‖x + y‖²) and far more features are needed
    (what the study shows on peaked inputs).
    """
    q, k, v = qkv(64, 64, D=16, batch=(), amplitude=0.3, seed=7)
    exact = scaled_dot_product_attention(q, k, v)
    mean_error = {
        M: np.mean([relative_error(performer_attention(q, k, v, M, seed=s), exact)
                    for s in range(20)])
        for M in (16, 64, 256)
    }
    assert mean_error[64] < mean_error[16]
    assert mean_error[256] < mean_error[64]
    assert mean_error[256] < 0.5 * mean_error[16], mean_error


def test_orthogonal_features_are_orthogonal_and_unskewed():
    D = 8
    omega = orthogonal_random_features(3 * D, D, seed=4)
    for block in range(3):
        rows = omega[block * D:(block + 1) * D]
        gram = rows @ rows.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-12)
    # QR's sign convention would make the first coordinate of every block's first
    # direction negative; with the sign fix directions are uniform: over many
    # blocks, about half are positive.
    firsts = np.array([orthogonal_random_features(D, D, seed=s)[0, 0] for s in range(200)])
    assert 0.35 < np.mean(firsts > 0) < 0.65


def test_performer_causal_edges():
    """T > S (bottom-right): the first T - S queries see no key and get 0; fully padded too."""
    q, k, v = qkv(8, 5, batch=())
    out = performer_attention(q, k, v, 16, is_causal=True)
    assert np.all(out[:3] == 0) and np.all(out[3:] != 0)
    out = performer_attention(q, k, v, 16, key_padding=np.zeros(5, bool))
    assert np.all(out == 0)


def test_performer_validation():
    q, k, v = qkv(6, 6)
    with pytest.raises(AttnlabError, match="expected exactly one of them"):
        performer_attention(q, k, v)
    with pytest.raises(AttnlabError, match="expected exactly one of them"):
        performer_attention(q, k, v, 8, projection=np.ones((8, 8)))
    with pytest.raises(ShapeError, match=r"projection: expected \(M, 8\)"):
        performer_attention(q, k, v, projection=np.ones((8, 7)))
    with pytest.raises(AttnlabError, match="num_features: expected an integer >= 1"):
        performer_attention(q, k, v, 0)
