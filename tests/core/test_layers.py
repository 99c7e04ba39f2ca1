"""LayerNorm, gelu, Dropout, FeedForward and the attention layers: NumPy only.

Against formulas written out here (math.erf, statistics of the draws) and the
layers' own consistency; the comparisons with torch's modules are in
tests/torch/test_layers_vs_torch.py.

Tolerances: float64 results agree to a few ulps of O(1) values (1e-12 leaves a
wide margin) and float32 ones to a few ulps of 1.2e-7 (1e-6 relative, and 1e-6
absolute for entries near 0 where a relative bound means nothing).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from tests.support.modules import randomise_attention

import attnlab
from attnlab.nn.layers import (
    Dropout,
    EncoderBlock,
    FeedForward,
    LayerNorm,
    SelfAttentionLayer,
    gelu,
    layer_norm_inplace,
)
from attnlab.nn.multihead import linear
from attnlab.special import erf, gelu_erf

F64 = {"rtol": 1e-12, "atol": 1e-12}  # float64: reordered O(E) sums, a few ulps
F32 = {"rtol": 1e-6, "atol": 1e-6}  # float32: reordered O(E) sums, a few ulps of 1.2e-7


# ------------------------------------------------------------------------------ LayerNorm


def test_layer_norm_default_parameters_normalise():
    """gamma = 1, beta = 0: every row has mean 0 and (biased) variance 1/(1 + eps/var)."""
    rng = np.random.default_rng(2)
    x = 4.0 + 2.0 * rng.standard_normal((5, 32))
    y = LayerNorm(32, eps=1e-5)(x)
    var = x.var(axis=-1)
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-14)  # mean of 32 O(1) values
    np.testing.assert_allclose(y.var(axis=-1), var / (var + 1e-5), rtol=1e-12)


@pytest.mark.parametrize("dtype, big", [(np.float32, 1.0), (np.float32, 1e37), (np.float64, 1.0),
                                        (np.float64, 1e200)])
def test_layer_norm_inplace_equals_layer_norm(dtype, big):
    """The in-place kernel (BLAS row sums) against LayerNorm (NumPy row reductions).

    ``big`` = 1e37 / 1e200 makes the squares overflow, taking the rescaled branch.
    Tolerances: the same sums in another order, a few ulps of O(1) outputs.
    """
    rng = np.random.default_rng(7)
    x = (big * (3.0 + rng.standard_normal((3, 5, 16)))).astype(dtype)  # mean far from 0
    norm = LayerNorm(16, 1e-12, gamma=rng.standard_normal(16).astype(dtype),
                     beta=rng.standard_normal(16).astype(dtype))
    expected = norm(x)
    buffer = x.copy()
    assert layer_norm_inplace(buffer, norm.gamma, norm.beta, norm.eps) is buffer
    np.testing.assert_allclose(buffer, expected, **(F32 if dtype == np.float32 else F64))


# ----------------------------------------------------------------------------------- gelu


def test_gelu_tanh_is_close_to_exact():
    """The approximation is within 1e-3 of the exact GELU (known max error ~2e-4 for x ~ 2)."""
    x = np.linspace(-6.0, 6.0, 121)
    np.testing.assert_allclose(gelu(x, "tanh"), gelu(x), atol=1e-3)


def test_erf_float32_is_within_8_ulps_of_math_erf():
    """The float32 rational, against math.erf (double precision) on a dense grid.

    Measured: at most 6.3 float32 ulps of the result on this grid (at x = ±3.64),
    and 7.4 on a 100x denser one over [0, 4.2] (the raw Eigen coefficients gave
    7.9 there); the error is the float32 rounding of the ~25 operations, the
    rational itself is within 1.1 ulps. Tiny x down to 1e-30 keep their relative
    accuracy (erf(x) ~ 2x/sqrt(pi), no underflow to 0).
    """
    x = np.concatenate([np.linspace(-6.0, 6.0, 400_001, dtype=np.float32),
                        np.geomspace(1e-30, 1.0, 2001, dtype=np.float32)])
    ref = np.array([math.erf(v) for v in x.tolist()])  # float64, correctly rounded-ish
    ours = erf(x)
    assert ours.dtype == np.float32
    ulps = np.abs(ours - ref) / np.spacing(np.abs(ref).astype(np.float32))
    assert ulps.max() <= 8.0, (ulps.max(), x[np.argmax(ulps)])
    # The float64 path (Cody's rational) is good to a few float64 ulps of 1.
    np.testing.assert_allclose(erf(x.astype(np.float64)), ref, rtol=0, atol=4e-16)


def test_gelu_erf_with_bias_in_place_equals_the_plain_formula():
    """gelu_erf(x, b, out=x) is (x + b)/2 (1 + erf((x + b)/sqrt 2)), chunk edges included.

    Reference: the formula in float64 with math.erf. Bound: 6 * 2**-24 * max(|h|, 1)
    (measured 3.6): for h >> 0 a few float32 ulps of h; for h << 0 the formula's
    own cancellation in 1 + erf leaves ~|h| * 2**-24 absolute, as in torch's GELU.
    """
    rng = np.random.default_rng(11)
    for shape in [(100, 1536), (3, 70_000), (7,)]:  # partial last chunk; rows wider than one
        x = (4.0 * rng.standard_normal(shape)).astype(np.float32)
        b = rng.standard_normal(shape[-1]).astype(np.float32)
        h = (x + b).astype(np.float64)
        ref = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
                        for v in h.ravel().tolist()]).reshape(shape)
        fresh = gelu_erf(x, b)
        in_place = x.copy()
        assert gelu_erf(in_place, b, out=in_place) is in_place
        np.testing.assert_array_equal(in_place, fresh)
        assert fresh.dtype == np.float32
        assert (np.abs(fresh - ref) <= 6 * 2.0**-24 * np.maximum(np.abs(h), 1.0)).all()
    grid = np.linspace(-12.0, 12.0, 200_001, dtype=np.float32)
    np.testing.assert_array_equal(gelu(grid), gelu_erf(grid))  # the public op uses it


def test_in_place_kernels_refuse_a_non_contiguous_output():
    """Reshaping a strided array copies it: the result would be silently lost."""
    strided = np.zeros((4, 6), dtype=np.float32)[:, ::2]  # (4, 3), not C-contiguous
    with pytest.raises(attnlab.AttnlabError, match="x: expected a C-contiguous array"):
        layer_norm_inplace(strided, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5)
    with pytest.raises(attnlab.AttnlabError, match=r"out: expected a C-contiguous array "
                                                   r"of x's shape \(4, 3\)"):
        gelu_erf(np.ones((4, 3), np.float32), out=strided)
    with pytest.raises(attnlab.AttnlabError, match="out: expected a C-contiguous array"):
        linear(np.ones((4, 2), np.float32), np.ones((2, 3), np.float32), None, out=strided)


# ---------------------------------------------------------------------- SelfAttentionLayer


def test_self_attention_layer_unbatched_matches_batched():
    rng = np.random.default_rng(5)
    layer = SelfAttentionLayer(8, 2, seed=0)
    randomise_attention(layer, rng)
    x = rng.standard_normal((4, 8))
    # Same arithmetic on the same numbers; only the batch loop differs: 1e-14.
    np.testing.assert_allclose(layer(x), layer(x[None])[0], rtol=0, atol=1e-14)


# -------------------------------------------------------------------------------- Dropout


def test_dropout_is_identity_in_eval_mode():
    x = np.random.default_rng(8).standard_normal((4, 6))
    drop = Dropout(0.5, seed=0)
    assert not drop.training  # starts in eval mode
    np.testing.assert_array_equal(drop(x), x)  # exact: nothing is touched


def test_dropout_zeroes_about_p_and_scales_survivors():
    p = 0.3
    x = 1.0 + np.random.default_rng(9).random((200, 500))  # in [1, 2): no zero of its own
    drop = Dropout(p, seed=0)
    drop.training = True
    y = drop(x)

    dropped = y == 0
    # n = 1e5 Bernoulli(p) draws: std of the fraction = sqrt(p (1-p) / n) = 1.45e-3,
    # so 0.01 is ~7 standard deviations (and the seed makes the test deterministic anyway).
    assert abs(dropped.mean() - p) < 0.01
    # Survivors are scaled by exactly 1/(1-p): the same single float op on both sides.
    np.testing.assert_array_equal(y[~dropped], x[~dropped] / (1.0 - p))
    assert y.dtype == x.dtype


def test_dropout_float32_stays_float32():
    drop = Dropout(0.5, seed=0)
    drop.training = True
    assert drop(np.ones((3, 4), dtype=np.float32)).dtype == np.float32


def test_dropout_same_seed_same_mask_and_fresh_masks_per_call():
    x = np.ones((50, 40))
    a, b, c = Dropout(0.5, seed=11), Dropout(0.5, seed=11), Dropout(0.5, seed=12)
    for d in (a, b, c):
        d.training = True
    first_a, first_b, first_c = a(x), b(x), c(x)
    np.testing.assert_array_equal(first_a, first_b)  # same seed -> same mask
    assert not np.array_equal(first_a, first_c)  # other seed -> other mask
    assert not np.array_equal(first_a, a(x))  # the next call draws a new mask


def test_dropout_zero_probability_is_identity_in_training():
    x = np.random.default_rng(10).standard_normal((3, 4))
    drop = Dropout(0.0, seed=0)
    drop.training = True
    np.testing.assert_array_equal(drop(x), x)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), True, "0.1", None])
def test_dropout_probability_outside_range_raises(p):
    match = re.escape("p: expected a probability in [0, 1)")
    with pytest.raises(attnlab.AttnlabError, match=match):
        Dropout(p)


@pytest.mark.parametrize("cls", [SelfAttentionLayer, EncoderBlock])
def test_train_and_eval_toggle_dropout(cls):
    args = (8, 2, 16) if cls is EncoderBlock else (8, 2)
    layer = cls(*args, dropout=0.5, seed=0)
    x = np.random.default_rng(11).standard_normal((2, 3, 8))

    eval_out = layer(x)
    np.testing.assert_array_equal(layer(x), eval_out)  # eval: deterministic

    assert layer.train() is layer and layer.training
    train_1, train_2 = layer(x), layer(x)
    assert not np.allclose(train_1, eval_out)  # dropout at p = 0.5 changes the output
    assert not np.allclose(train_1, train_2)  # and draws a fresh mask every call

    assert layer.eval() is layer and not layer.training
    np.testing.assert_array_equal(layer(x), eval_out)  # back to the eval answer

    layer.train(False)
    assert not layer.training


def test_layers_with_same_seed_give_same_training_outputs():
    x = np.random.default_rng(12).standard_normal((2, 3, 8))
    a = EncoderBlock(8, 2, 16, dropout=0.5, seed=4).train()
    b = EncoderBlock(8, 2, 16, dropout=0.5, seed=4).train()
    np.testing.assert_array_equal(a(x), b(x))  # same seed: same weights and same masks


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: LayerNorm(0), "d_model: expected an integer >= 1, got 0"),
        (lambda: LayerNorm(4, eps=0.0), "eps: expected a positive number, got 0.0"),
        (lambda: LayerNorm(4, eps=-1e-5), "eps: expected a positive number"),
        (lambda: LayerNorm(4, eps="1e-5"), "eps: expected a positive number"),
        (lambda: LayerNorm(4, gamma=np.ones(3)), re.escape("gamma: expected (4,), got (3)")),
        (lambda: LayerNorm(4, beta=np.ones((1, 4))), re.escape("beta: expected (4,), got (1, 4)")),
        (lambda: LayerNorm(4)(np.ones((2, 3))), re.escape("x: expected (..., 4), got (2, 3)")),
        (lambda: LayerNorm(4)(np.full(4, np.inf)), "x: expected finite values"),
        (lambda: FeedForward(8, 16, activation="swish"), "activation: expected one of"),
        (lambda: FeedForward(8, 0), "d_ff: expected an integer >= 1, got 0"),
        (lambda: FeedForward(8, 16, scheme="he"), "scheme: expected one of"),
        (lambda: SelfAttentionLayer(8, 2, norm="sandwich"), "norm: expected 'post' or 'pre'"),
        (lambda: SelfAttentionLayer(8, 3), "d_model: expected a multiple of num_heads = 3"),
        (lambda: SelfAttentionLayer(8, 4, num_kv_heads=3), "num_kv_heads: expected a divisor"),
        (lambda: SelfAttentionLayer(8, 2, dropout=1.0), re.escape("p: expected a probability")),
        (lambda: SelfAttentionLayer(8, 2, seed=-1), "rng: expected an int seed >= 0, got -1"),
        (lambda: SelfAttentionLayer(8, 2)(np.ones((2, 3, 6))), re.escape("x: expected (B, T, 8)")),
        (
            lambda: SelfAttentionLayer(8, 2)(np.ones((2, 3, 8)), mask=np.ones((3, 3))),
            "mask: expected a bool array",
        ),
        (lambda: EncoderBlock(8, 2, 16, activation="tanh"), "activation: expected one of"),
        (lambda: EncoderBlock(8, 2, 16, norm="middle"), "norm: expected 'post' or 'pre'"),
        (lambda: EncoderBlock(8, 2, 16)(np.ones((2, 3, 4))), re.escape("x: expected (B, T, 8)")),
    ],
)
def test_validation_errors(make, match):
    with pytest.raises(attnlab.AttnlabError, match=match):
        make()


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e200), (np.float32, 3e38)])
def test_layer_norm_of_huge_values_is_not_zero(dtype, big):
    """The variance overflowed to inf and the row came out all zeros."""
    x = np.array([[big, -big, 0.0, big / 2], [1.0, 2.0, 3.0, 4.0]], dtype=dtype)
    out = LayerNorm(4)(x)
    ref = LayerNorm(4)(x / np.abs(x).max(axis=-1, keepdims=True))  # scale-invariant
    assert out.dtype == dtype and np.isfinite(out).all()
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5)
    np.testing.assert_allclose(out[1], LayerNorm(4)(x[1:])[0], rtol=1e-6)
    same = LayerNorm(4)(np.full((1, 4), big, dtype=dtype))  # a constant row stays 0
    assert (same == 0).all()
