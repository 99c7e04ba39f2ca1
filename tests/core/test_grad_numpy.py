"""NumPy backward passes against central finite differences (float64).

Every check uses the scalar loss L = Σ out ⊙ G with a fixed random G, so
∂L/∂out = G, and compares the hand-written gradient with

    (L(θ + h) − L(θ − h)) / 2h,   h = 1e-6.

Tolerance: the truncation error of the central difference is h²/6 · |L'''| ≈ 1e-13
here, and the rounding error is about ε · |L| / h ≈ 2.2e-16 · 10 / 1e-6 ≈ 2e-9
(|L| ≲ 10 on these shapes). atol = 1e-7 (+ rtol = 1e-6) leaves a 50× margin over
that, while a wrong formula is off by O(0.1) or more.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from attnlab import LayerNorm, MultiHeadAttention, ShapeError, scaled_dot_product_attention
from attnlab.attention import softmax
from attnlab.backward import sdpa_backward, softmax_backward
from attnlab.masks import causal_mask
from attnlab.nn.backward import layer_norm_backward, mha_backward

STEP = 1e-6
FD_TOL = {"rtol": 1e-6, "atol": 1e-7}  # see the module docstring


def numeric_grad(loss: Callable[[], float], arr: np.ndarray) -> np.ndarray:
    """Central differences of ``loss()`` with respect to every entry of ``arr`` (in place)."""
    grad = np.zeros_like(arr)
    for index in np.ndindex(arr.shape):
        original = arr[index]
        arr[index] = original + STEP
        plus = loss()
        arr[index] = original - STEP
        minus = loss()
        arr[index] = original
        grad[index] = (plus - minus) / (2 * STEP)
    return grad


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# ----------------------------------------------------------------------- softmax


def test_softmax_backward_matches_finite_differences(rng):
    x = rng.standard_normal((3, 5))
    x[1, 2] = -np.inf  # a masked entry: zero gradient there
    G = rng.standard_normal((3, 5))
    analytic = softmax_backward(softmax(x), G)
    finite = np.isfinite(x)
    numeric = numeric_grad(lambda: float(np.sum(softmax(x) * G)), x)
    np.testing.assert_allclose(analytic[finite], numeric[finite], **FD_TOL)
    assert analytic[1, 2] == 0.0


def test_softmax_backward_other_axis_and_fully_masked_row(rng):
    x = rng.standard_normal((4, 3))
    G = rng.standard_normal((4, 3))
    numeric = numeric_grad(lambda: float(np.sum(softmax(x, axis=0) * G)), x)
    np.testing.assert_allclose(softmax_backward(softmax(x, axis=0), G, axis=0), numeric, **FD_TOL)
    blocked = np.full((2, 3), -np.inf)
    assert np.array_equal(softmax_backward(softmax(blocked), np.ones((2, 3))), np.zeros((2, 3)))


def test_softmax_backward_refuses_mismatched_shapes():
    with pytest.raises(ShapeError, match="dweights: expected the shape of weights"):
        softmax_backward(np.ones((2, 3)) / 3, np.ones((3, 2)))


# ------------------------------------------------------------ dot-product attention


def check_sdpa_against_fd(q, k, v, G, mask=None, bias=None, is_causal=False, scale=None):
    def loss() -> float:
        out = scaled_dot_product_attention(
            q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale
        )
        return float(np.sum(out * G))

    grads = sdpa_backward(q, k, v, G, mask, bias=bias, is_causal=is_causal, scale=scale)
    for name, arr, analytic in (("q", q, grads.dq), ("k", k, grads.dk), ("v", v, grads.dv)):
        assert analytic.shape == arr.shape, name
        np.testing.assert_allclose(analytic, numeric_grad(loss, arr), **FD_TOL, err_msg=name)
    if bias is None:
        assert grads.dbias is None
    else:
        assert grads.dbias is not None and grads.dbias.shape == bias.shape
        finite = np.isfinite(bias)  # -inf entries stay -inf under ±h: gradient 0
        numeric = numeric_grad(loss, bias)
        np.testing.assert_allclose(grads.dbias[finite], numeric[finite], **FD_TOL)
        assert np.all(grads.dbias[~finite] == 0.0)
    return grads


def test_sdpa_plain(rng):
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal(
        (2, 5, 2)
    )
    check_sdpa_against_fd(q, k, v, rng.standard_normal((2, 3, 2)))


def test_sdpa_mask_bias_and_custom_scale(rng):
    q, k, v = (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)),
               rng.standard_normal((2, 5, 3)))
    mask = rng.random((2, 3, 5)) < 0.7
    mask[:, :, 0] = True  # keep every row alive; fully masked rows are tested below
    bias = rng.standard_normal((3, 5))  # broadcast over the batch: dbias is summed over it
    bias[0, 4] = -np.inf
    check_sdpa_against_fd(q, k, v, rng.standard_normal((2, 3, 3)), mask, bias, scale=0.3)


def test_sdpa_causal_bottom_right_with_t_less_than_s(rng):
    q, k, v = rng.standard_normal((1, 2, 3)), rng.standard_normal((1, 4, 3)), rng.standard_normal(
        (1, 4, 5)
    )
    G = rng.standard_normal((1, 2, 5))
    grads = check_sdpa_against_fd(q, k, v, G, is_causal=True)
    # Bottom-right: query 0 sits at position 2 and cannot see key 3; only query 1 does,
    # so key 3's value gradient is P[1, 3] · G[1] alone.
    _, weights = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert weights[0, 0, 3] == 0.0 and weights[0, 1, 3] > 0.0
    np.testing.assert_allclose(grads.dv[0, 3], weights[0, 1, 3] * G[0, 1], rtol=1e-14)


def test_sdpa_broadcast_leading_dims(rng):
    # One k/v shared by two query batches: dk, dv are summed over the broadcast dim.
    q = rng.standard_normal((2, 3, 4))
    k, v = rng.standard_normal((1, 5, 4)), rng.standard_normal((1, 5, 2))
    bias = rng.standard_normal((1, 5))
    check_sdpa_against_fd(q, k, v, rng.standard_normal((2, 3, 2)), bias=bias)


def test_fully_masked_row_gives_zero_gradient_not_nan(rng):
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    G = rng.standard_normal((3, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False  # query 1 may attend to nothing
    bias = np.zeros((3, 5))
    grads = check_sdpa_against_fd(q, k, v, G, mask, bias)
    for grad in grads:
        assert grad is not None and np.isfinite(grad).all()
    assert np.all(grads.dq[1] == 0.0)
    assert np.all(grads.dbias[1] == 0.0)
    # k and v get exactly what they get from the other two rows alone.
    rest = sdpa_backward(q[[0, 2]], k, v, G[[0, 2]])
    np.testing.assert_allclose(grads.dk, rest.dk, rtol=0, atol=1e-15)
    np.testing.assert_allclose(grads.dv, rest.dv, rtol=0, atol=1e-15)


def test_all_minus_inf_bias_row_and_causal_t_greater_than_s(rng):
    # T = 4 > S = 3 with is_causal (bottom-right): query 0 sees nothing, query 1 sees only
    # key 0 (a one-key softmax is constant: zero gradient), query 2 sees keys 0-1.
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    bias = rng.standard_normal((4, 3))
    bias[3] = -np.inf  # and the last row is blocked by the bias
    grads = check_sdpa_against_fd(q, k, v, rng.standard_normal((4, 3)), bias=bias, is_causal=True)
    assert np.all(grads.dq[[0, 1, 3]] == 0.0)
    assert np.isfinite(grads.dq).all() and np.any(grads.dq[2] != 0.0)


def test_sdpa_backward_empty_keys_and_dtypes(rng):
    grads = sdpa_backward(np.ones((2, 3)), np.ones((0, 3)), np.ones((0, 4)), np.ones((2, 4)))
    assert grads.dq.shape == (2, 3) and np.all(grads.dq == 0.0) and grads.dk.shape == (0, 3)
    q32 = rng.standard_normal((3, 4)).astype(np.float32)
    assert sdpa_backward(q32, q32, q32, np.ones((3, 4), np.float32)).dq.dtype == np.float32
    q16 = q32.astype(np.float16)
    assert sdpa_backward(q16, q16, q16, np.ones((3, 4), np.float16)).dv.dtype == np.float16


def test_sdpa_backward_validates_dout():
    with pytest.raises(ShapeError, match=r"dout: expected the output's shape \(\.\.\., T, Dv\) "
                                         r"= \(2, 3, 5\), got \(2, 3, 4\)"):
        sdpa_backward(np.ones((2, 3, 4)), np.ones((2, 6, 4)), np.ones((2, 6, 5)),
                      np.ones((2, 3, 4)))


# ------------------------------------------------------------- multi-head attention


def gqa_cross_attention(rng: np.random.Generator) -> MultiHeadAttention:
    """H = 4 query heads sharing Hkv = 2 key/value heads, D = 3, Dv = 2, E = 6, Ekv = 5."""
    return MultiHeadAttention(
        Wq=rng.standard_normal((6, 12)) * 0.5, Wk=rng.standard_normal((5, 6)) * 0.5,
        Wv=rng.standard_normal((5, 4)), Wo=rng.standard_normal((8, 7)),
        num_heads=4, num_kv_heads=2,
        bq=rng.standard_normal(12), bk=rng.standard_normal(6), bv=rng.standard_normal(4),
        bo=rng.standard_normal(7),
    )


def check_mha_against_fd(mha, x, G, context=None, **kwargs):
    def loss() -> float:
        return float(np.sum(mha(x, context, **kwargs)[0] * G))

    grads = mha_backward(mha, x, G, context, **kwargs)
    assert list(grads.params) == list(mha.parameters())
    for name, param in mha.parameters().items():
        assert grads.params[name].shape == param.shape, name
        np.testing.assert_allclose(
            grads.params[name], numeric_grad(loss, param), **FD_TOL, err_msg=name
        )
    np.testing.assert_allclose(grads.dx, numeric_grad(loss, x), **FD_TOL, err_msg="x")
    if context is None:
        assert grads.dcontext is None
    else:
        np.testing.assert_allclose(
            grads.dcontext, numeric_grad(loss, context), **FD_TOL, err_msg="context"
        )
    return grads


def test_mha_gqa_cross_attention_with_mask_and_key_padding(rng):
    mha = gqa_cross_attention(rng)
    x, context = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 4, 5))
    key_padding = np.array([[True, True, True, False], [True, True, False, False]])
    mask = rng.random((1, 4, 3, 4)) < 0.8
    mask[..., 0] = True
    grads = check_mha_against_fd(
        mha, x, rng.standard_normal((2, 3, 7)), context, mask=mask, key_padding=key_padding
    )
    assert np.allclose(grads.params["bk"], 0.0, atol=1e-12)  # softmax is shift invariant


def test_mha_self_attention_causal_with_bias(rng):
    mha = MultiHeadAttention.init(2, 6, seed=3)
    mha.bq, mha.bv = rng.standard_normal(6), rng.standard_normal(6)
    x = rng.standard_normal((2, 4, 6))
    bias = rng.standard_normal((2, 4, 4))  # one per head (H, T, S), like ALiBi
    G = rng.standard_normal((2, 4, 6))
    grads = check_mha_against_fd(mha, x, G, bias=bias, is_causal=True)

    def loss() -> float:
        return float(np.sum(mha(x, bias=bias, is_causal=True)[0] * G))

    numeric = numeric_grad(loss, bias)
    assert grads.dbias is not None and grads.dbias.shape == (2, 4, 4)
    np.testing.assert_allclose(grads.dbias, numeric, **FD_TOL)
    assert np.all(grads.dbias[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0.0)


def test_mha_unbatched_without_biases(rng):
    mha = MultiHeadAttention.init(2, 4, use_bias=False, seed=5)
    check_mha_against_fd(mha, rng.standard_normal((3, 4)), rng.standard_normal((3, 4)))


def test_mha_backward_refuses_what_the_forward_refuses(rng):
    mha = MultiHeadAttention.init(2, 4, seed=0)
    bad_x = np.ones((2, 3, 5))
    with pytest.raises(ShapeError) as forward_error:
        mha(bad_x)
    with pytest.raises(ShapeError) as backward_error:
        mha_backward(mha, bad_x, np.ones((2, 3, 4)))
    assert str(forward_error.value) == str(backward_error.value)
    with pytest.raises(ShapeError, match=r"dout: expected the output's shape \(B, T, E_out\)"):
        mha_backward(mha, np.ones((2, 3, 4)), np.ones((2, 4, 4)))


# ---------------------------------------------------------------------- LayerNorm


def test_layer_norm_backward_matches_finite_differences(rng):
    norm = LayerNorm(5, gamma=rng.standard_normal(5), beta=rng.standard_normal(5))
    x = rng.standard_normal((2, 3, 5)) * 3 + 1
    G = rng.standard_normal((2, 3, 5))

    def loss() -> float:
        return float(np.sum(norm(x) * G))

    grads = layer_norm_backward(norm, x, G)
    np.testing.assert_allclose(grads.dx, numeric_grad(loss, x), **FD_TOL)
    np.testing.assert_allclose(grads.dgamma, numeric_grad(loss, norm.gamma), **FD_TOL)
    np.testing.assert_allclose(grads.dbeta, numeric_grad(loss, norm.beta), **FD_TOL)


def test_layer_norm_backward_of_a_constant_row_is_finite():
    # var = 0: only eps keeps 1/σ finite; the gradient must not be NaN.
    grads = layer_norm_backward(LayerNorm(4), np.full((1, 4), 2.0), np.arange(4.0)[None])
    assert np.isfinite(grads.dx).all()
    with pytest.raises(ShapeError, match=r"x: expected \(\.\.\., 4\), got \(2, 3\)"):
        layer_norm_backward(LayerNorm(4), np.ones((2, 3)), np.ones((2, 3)))


def test_causal_mask_used_by_the_backward_is_bottom_right():
    # The same gradients with is_causal=True and with the explicit bottom-right mask.
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    G = rng.standard_normal((2, 3))
    implicit = sdpa_backward(q, k, v, G, is_causal=True)
    explicit = sdpa_backward(q, k, v, G, causal_mask(2, 5))
    for a, b in zip(implicit[:3], explicit[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_layer_norm_backward_of_huge_values_matches_the_rescaled_row():
    rng = np.random.default_rng(0)
    x = np.array([[1e200, -1e200, 0.0, 1.0]])
    dy = rng.standard_normal((1, 4))
    grads = layer_norm_backward(LayerNorm(4), x, dy)
    ref = layer_norm_backward(LayerNorm(4, eps=1e-300), x / 1e200, dy)  # dx scales by 1/m
    assert np.isfinite(grads.dx).all()
    np.testing.assert_allclose(grads.dx * 1e200, ref.dx, rtol=1e-9)
    np.testing.assert_allclose(grads.dgamma, ref.dgamma, rtol=1e-9)


def test_wrong_objects_and_axes_are_named_errors():
    with pytest.raises(ValueError, match="norm: expected an attnlab.LayerNorm, got str"):
        layer_norm_backward("ln", np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="mha: expected an attnlab.MultiHeadAttention, got str"):
        mha_backward("mha", np.ones((2, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"axis: expected an int in \[-2, 1\], got 'a'"):
        softmax_backward(np.ones((2, 3)) / 3, np.ones((2, 3)), axis="a")


def test_mha_backward_with_its_own_scale(rng):
    mha = MultiHeadAttention.init(2, 6, seed=5, scale=0.7)
    x = rng.standard_normal((2, 4, 6))
    check_mha_against_fd(mha, x, rng.standard_normal((2, 4, 6)), is_causal=True)
