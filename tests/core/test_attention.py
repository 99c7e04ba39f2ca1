"""scaled_dot_product_attention and softmax: edge cases, validation, a float64 reference.

NumPy only. The comparisons with torch's SDPA and softmax, with their tolerances,
are in tests/torch/test_attention_vs_torch.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.properties import check

import attnlab
from attnlab import AttnlabError, ShapeError, scaled_dot_product_attention, softmax
from attnlab.attention import MAX_SCORE_ELEMENTS

REFERENCE_SHAPES = [  # (batch dims, T, S, D, Dv)
    ((), 1, 1, 1, 1),
    ((), 3, 3, 4, 4),
    ((2,), 5, 7, 8, 3),
    ((2, 3), 6, 4, 16, 16),
    ((1, 2), 9, 9, 5, 11),
    ((4,), 2, 13, 32, 8),
]


@pytest.mark.parametrize("masking", ["none", "mask", "causal"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch,T,S,D,Dv", REFERENCE_SHAPES)
def test_matches_the_plain_float64_reference(batch, T, S, D, Dv, dtype, masking):
    """Against attention written out in float64 (tests/support/properties.py), within the
    rounding bound derived there for the dtype: the torch-free twin of the comparisons
    with torch's SDPA."""
    rng = np.random.default_rng(T * 100 + S)
    q = rng.standard_normal((*batch, T, D)).astype(dtype)
    k = rng.standard_normal((*batch, S, D)).astype(dtype)
    v = rng.standard_normal((*batch, S, Dv)).astype(dtype)
    mask = rng.random((*batch, T, S)) < 0.6 if masking == "mask" else None
    # Bottom-right causal, built independently of attnlab.causal_mask.
    causal = np.tril(np.ones((T, S), dtype=bool), S - T) if masking == "causal" else None
    out = scaled_dot_product_attention(q, k, v, mask, is_causal=masking == "causal")
    assert out.dtype == dtype and out.shape == (*batch, T, Dv)
    check(out, q, k, v, mask if causal is None else causal, None, 1 / np.sqrt(D), dtype)


def test_bias_minus_inf_equals_mask():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((4, 4)) for _ in range(3))
    mask = rng.random((4, 4)) < 0.5
    mask[:, 1] = True
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, bias=attnlab.mask_to_bias(mask)),
        scaled_dot_product_attention(q, k, v, mask), atol=0)


def test_empty_keys_give_zero_output():
    q = np.ones((2, 3))
    out, weights = scaled_dot_product_attention(q, np.ones((0, 3)), np.ones((0, 5)),
                                                return_weights=True)
    assert out.shape == (2, 5) and weights.shape == (2, 0)
    np.testing.assert_array_equal(out, 0.0)


def test_large_logits_are_stable():
    q = np.array([[100.0, 0.0], [-100.0, 0.0]])
    k = np.array([[100.0, 0.0], [0.0, 100.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0]])
    out = scaled_dot_product_attention(q, k, v, scale=1.0)  # scores up to 1e4
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [[1.0, 0.0], [0.0, 1.0]], atol=1e-12)


# ---- softmax -----------------------------------------------------------------


# ---- validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,match",
    [
        ((2, 7, 64), (2, 7, 32), (2, 7, 8), r"k: expected \(\.\.\., S, 64\) to match q's last dim "
                                            r"64, got \(2, 7, 32\)"),
        ((5, 4), (6, 4), (5, 4), r"v: expected \(\.\.\., 6, Dv\) to match k's length S = 6"),
        ((4,), (6, 4), (6, 4), r"q: expected \(\.\.\., T, D\), got \(4\)"),
        ((2, 5, 4), (3, 6, 4), (3, 6, 4), r"leading \(batch\) dims that broadcast"),
    ],
)
def test_shape_errors(q_shape, k_shape, v_shape, match):
    with pytest.raises(ShapeError, match=match):
        scaled_dot_product_attention(np.zeros(q_shape), np.zeros(k_shape), np.zeros(v_shape))


def test_mask_must_be_bool_and_broadcastable():
    q = k = v = np.zeros((3, 4))
    with pytest.raises(AttnlabError, match=r"mask: expected a bool array \(True = may attend\), "
                                           r"got dtype int64"):
        scaled_dot_product_attention(q, k, v, np.ones((3, 3), dtype=np.int64))
    with pytest.raises(ShapeError, match=r"mask: expected a shape broadcastable to \(\.\.\., T, "
                                         r"S\) = \(3, 3\), got \(3, 4\)"):
        scaled_dot_product_attention(q, k, v, np.ones((3, 4), dtype=bool))


def test_bias_errors():
    q = k = v = np.zeros((3, 4))
    with pytest.raises(AttnlabError, match="bias: expected finite values or -inf, got NaN"):
        scaled_dot_product_attention(q, k, v, bias=np.full((3, 3), np.nan))
    with pytest.raises(ShapeError, match=r"bias: expected a shape broadcastable"):
        scaled_dot_product_attention(q, k, v, bias=np.zeros((2, 3)))


def test_nan_and_inf_inputs_are_reported():
    q = np.zeros((3, 4))
    bad = q.copy()
    bad[1, 2] = np.nan
    with pytest.raises(AttnlabError, match=r"k: expected finite values, got 1 non-finite "
                                           r"\(first: NaN at index \(1, 2\)\)"):
        scaled_dot_product_attention(q, bad, q)
    bad[1, 2] = np.inf
    with pytest.raises(AttnlabError, match=r"v: .*Inf at index \(1, 2\)"):
        scaled_dot_product_attention(q, q, bad)


def test_bad_dtypes_and_options():
    q = np.zeros((2, 2))
    with pytest.raises(AttnlabError, match="q: expected a numeric array, got dtype bool"):
        scaled_dot_product_attention(q.astype(bool), q, q)
    with pytest.raises(AttnlabError, match="q: could not be read as a numeric array"):
        scaled_dot_product_attention([[1, 2], [3]], q, q)
    with pytest.raises(AttnlabError, match="q: expected a real float or integer array"):
        scaled_dot_product_attention(q.astype(complex), q, q)
    with pytest.raises(AttnlabError, match="scale: expected a finite number, got inf"):
        scaled_dot_product_attention(q, q, q, scale=float("inf"))
    with pytest.raises(AttnlabError, match="scale: expected a real number or None"):
        scaled_dot_product_attention(q, q, q, scale="0.5")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match="is_causal: expected True or False"):
        scaled_dot_product_attention(q, q, q, is_causal=1)  # type: ignore[arg-type]


def test_refuses_a_score_matrix_over_the_limit():
    # Broadcast views: no memory is allocated to build these inputs.
    T = int(np.sqrt(MAX_SCORE_ELEMENTS)) + 1
    q = np.broadcast_to(np.zeros(1), (T, 1))
    with pytest.raises(AttnlabError, match="attnlab.flash_attention computes this tile by tile"):
        scaled_dot_product_attention(q, q, q)


def test_softmax_errors():
    with pytest.raises(AttnlabError, match="x: expected finite values or -inf, got NaN or \\+inf"):
        softmax([1.0, np.inf])
    with pytest.raises(ShapeError, match="x: expected at least 1 dimension, got a scalar"):
        softmax(1.0)
    with pytest.raises(AttnlabError, match=r"axis: expected an int in \[-2, 1\], got 2"):
        softmax(np.zeros((2, 2)), axis=2)


# ----------------------------------------------------------- adversarial inputs


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e200), (np.float32, 1e20)])
def test_scores_that_would_overflow_are_refused_not_nan(dtype, big):
    """Finite q, k whose q·kᵀ overflows gave NaN (or, all negative, a silent row of 0)."""
    q = np.full((2, 4), big, dtype=dtype)
    k = np.array([[big] * 4, [-big] * 4], dtype=dtype)
    v = np.ones((2, 3), dtype=dtype)
    with pytest.raises(AttnlabError, match=r"q, k: the scaled scores could reach .* beyond "
                                           f"{np.dtype(dtype)}'s largest value"):
        scaled_dot_product_attention(q, k, v)
    with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
        scaled_dot_product_attention(q[:1], -k, v)  # every score -> -inf: was all zeros
    with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
        attnlab.self_attention(np.full((3, 4), 1e200), np.eye(4), np.eye(4), np.eye(4))
    # Large but representable scores still give the right answer.
    out = scaled_dot_product_attention(np.full((1, 2), 1e150), np.array([[1e150, 0.0],
                                       [0.0, 1e150]]), np.array([[1.0], [2.0]]))
    assert out.tolist() == [[1.5]]


@pytest.mark.parametrize("axis", [0.5, "0", True, None])
def test_softmax_axis_must_be_an_int(axis):
    with pytest.raises(AttnlabError, match=r"axis: expected an int in \[-2, 1\], got"):
        softmax(np.zeros((2, 3)), axis=axis)


def test_softmax_of_extreme_finite_logits_is_exact_and_quiet():
    with np.errstate(all="raise"):  # no overflow warning for -1e308 - 1e308 = -inf
        assert softmax([1e308, -1e308]).tolist() == [1.0, 0.0]


def test_ragged_and_non_bool_masks_are_named_errors():
    q = np.zeros((2, 2))
    with pytest.raises(AttnlabError, match="mask: could not be read as an array"):
        scaled_dot_product_attention(q, q, q, mask=[[True, False], [True]])
    for convert in (attnlab.from_blocked, attnlab.from_keep, attnlab.padding_mask):
        with pytest.raises(AttnlabError, match="mask: could not be read as an array"):
            convert([[1, 0], [1]])
    with pytest.raises(AttnlabError, match="mask: could not be read as an array"):
        attnlab.mask_to_bias([[True], [True, False]])
    with pytest.raises(AttnlabError, match=r"mask: expected a bool array \(True = may attend\), "
                                           r"got dtype int64\. For a 0/1 mask use"):
        attnlab.mask_to_bias(np.ones((2, 2), dtype=np.int64))
    for dtype in (int, complex, "banana"):
        with pytest.raises(AttnlabError, match="dtype: expected a float dtype"):
            attnlab.mask_to_bias(np.ones((2, 2), bool), dtype=dtype)


def test_the_one_softmax_in_place_and_new_agree_with_its_lse():
    """attnlab.masked_softmax is the one NumPy softmax: in place and into a new array give the
    same bits, along any axis, and its lse is log Σ exp over the axis."""
    from attnlab.masked_softmax import softmax_with_lse, stable_softmax

    rng = np.random.default_rng(0)
    scores = rng.standard_normal((2, 3, 5)) * 30
    scores[0, 1] = -np.inf  # a row with nothing to attend to
    scores[1, :, 2] = -np.inf  # a masked key
    for axis in (-1, 1, 0):
        fresh, lse = softmax_with_lse(scores, axis)
        inplace = scores.copy()
        weights, _ = softmax_with_lse(inplace, axis, in_place=True)
        assert weights is inplace
        np.testing.assert_array_equal(weights, fresh)  # bit for bit
        np.testing.assert_array_equal(stable_softmax(scores, axis), fresh)
        assert lse is not None and lse.shape == tuple(np.delete(scores.shape, axis % 3))
        with np.errstate(divide="ignore"):
            expected = np.log(np.sum(np.exp(scores), axis=axis))  # no overflow at |s| < 200
        np.testing.assert_allclose(lse, expected, rtol=1e-12)
    weights, lse = softmax_with_lse(scores)
    assert (weights[0, 1] == 0).all() and np.isneginf(lse[0, 1]).all()  # zeros, not NaN
    assert (weights[1, :, 2] == 0).all()
    empty, empty_lse = softmax_with_lse(np.zeros((2, 0)))
    assert empty.shape == (2, 0) and empty_lse is not None and np.isneginf(empty_lse).all()
