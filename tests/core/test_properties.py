"""Properties of attention that must hold for any input (hypothesis).

Tolerance 1e-10 (float64): each property compares two computations of the same
O(1) quantities that differ only in summation order or in zero terms.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import scaled_dot_product_attention

settings.register_profile("attnlab", max_examples=60, deadline=None)
settings.load_profile("attnlab")

TOL = 1e-10


@st.composite
def problems(draw, min_s=1):
    """Random q (T, D), k (S, D), v (S, Dv), a mask (T, S) and a scale."""
    T = draw(st.integers(1, 6))
    S = draw(st.integers(min_s, 7))
    D = draw(st.integers(1, 5))
    Dv = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    magnitude = draw(st.sampled_from([0.1, 1.0, 10.0]))
    q = rng.standard_normal((T, D)) * magnitude
    k = rng.standard_normal((S, D)) * magnitude
    v = rng.standard_normal((S, Dv))
    mask = rng.random((T, S)) < draw(st.floats(0.2, 1.0))
    return q, k, v, mask, rng


@given(problems())
def test_weights_rows_sum_to_one_or_zero(problem):
    q, k, v, mask, _ = problem
    _, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    sums = weights.sum(-1)
    has_key = mask.any(-1)
    np.testing.assert_allclose(sums[has_key], 1.0, atol=TOL)
    np.testing.assert_array_equal(sums[~has_key], 0.0)  # fully masked rows: exactly 0
    assert (weights >= 0).all()


@given(problems())
def test_permuting_keys_and_values_together_changes_nothing(problem):
    q, k, v, mask, rng = problem
    perm = rng.permutation(k.shape[0])
    out = scaled_dot_product_attention(q, k, v, mask)
    permuted = scaled_dot_product_attention(q, k[perm], v[perm], mask[:, perm])
    np.testing.assert_allclose(permuted, out, atol=TOL)


@given(problems(min_s=2))
def test_masking_a_key_equals_deleting_it(problem):
    q, k, v, mask, rng = problem
    j = int(rng.integers(k.shape[0]))
    keep = np.arange(k.shape[0]) != j
    masked = mask.copy()
    masked[:, j] = False
    out = scaled_dot_product_attention(q, k, v, masked)
    deleted = scaled_dot_product_attention(q, k[keep], v[keep], mask[:, keep])
    np.testing.assert_allclose(out, deleted, atol=TOL)


@given(problems())
def test_causal_output_ignores_the_future(problem):
    q, k, v, _, rng = problem
    T = min(q.shape[0], k.shape[0])
    q, k, v = q[:T], k[:T], v[:T]  # self-attention: T == S
    i = int(rng.integers(T))
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    q2[i + 1:] = rng.standard_normal(q2[i + 1:].shape) * 5
    k2[i + 1:] = rng.standard_normal(k2[i + 1:].shape) * 5
    v2[i + 1:] = rng.standard_normal(v2[i + 1:].shape) * 5
    out2 = scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    np.testing.assert_allclose(out2[: i + 1], out[: i + 1], atol=TOL)


@given(problems())
def test_fully_masked_rows_give_zeros(problem):
    q, k, v, mask, rng = problem
    row = int(rng.integers(q.shape[0]))
    mask = mask.copy()
    mask[row] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[row], 0.0)
    np.testing.assert_array_equal(weights[row], 0.0)


@given(problems())
def test_output_is_a_convex_combination_of_values(problem):
    q, k, v, mask, _ = problem
    mask = mask.copy()
    mask[:, 0] = True
    out = scaled_dot_product_attention(q, k, v, mask)
    assert (out <= v.max(0) + TOL).all() and (out >= v.min(0) - TOL).all()
