"""Tests of attnlab.init: bounds and variances from the Glorot formulas, seeding, errors."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import attnlab.init as init_module
from attnlab.errors import AttnlabError
from attnlab.init import (
    INIT_SCHEMES,
    as_rng,
    init_qkv,
    init_weight,
    normal,
    xavier_normal,
    xavier_uniform,
)

FAN_IN, FAN_OUT = 400, 600  # 240,000 draws: statistical checks below are ~5 sigma


def test_doctests_pass() -> None:
    results = doctest.testmod(init_module)
    assert results.attempted > 0
    assert results.failed == 0


def test_xavier_uniform_bound_and_variance() -> None:
    weights = xavier_uniform(FAN_IN, FAN_OUT, rng=0)
    assert weights.shape == (FAN_IN, FAN_OUT)
    bound = math.sqrt(6.0 / (FAN_IN + FAN_OUT))
    assert np.abs(weights).max() <= bound  # hard bound, no tolerance
    # With n = 240,000 uniform draws, P(max|w| < 0.999 bound) = 0.999**n ~ e**-240.
    assert np.abs(weights).max() > 0.999 * bound
    # Var U(-a, a) = a^2/3 = 2/(fan_in+fan_out). Var(w^2) = a^4/5 - a^4/9, so the sample
    # variance has relative std 3*sqrt(4/45)/sqrt(n) = 0.89/sqrt(n) = 0.18%; 1% is 5.5 sigma.
    assert weights.var() == pytest.approx(2.0 / (FAN_IN + FAN_OUT), rel=0.01)
    # Mean: std a/sqrt(3n) = 5e-5; 3e-4 is 6 sigma.
    assert abs(weights.mean()) < 3e-4


def test_xavier_normal_variance() -> None:
    weights = xavier_normal(FAN_IN, FAN_OUT, rng=0)
    # Sample variance of a normal: relative std sqrt(2/n) = 0.29%; 1.5% is 5 sigma.
    assert weights.var() == pytest.approx(2.0 / (FAN_IN + FAN_OUT), rel=0.015)
    assert abs(weights.mean()) < 5 * math.sqrt(2.0 / (FAN_IN + FAN_OUT) / weights.size)


def test_normal_std_like_seed_randn() -> None:
    weights = normal(FAN_IN, FAN_OUT, rng=0)
    assert weights.var() == pytest.approx(1.0, rel=0.015)  # as above: 5 sigma
    small = normal(FAN_IN, FAN_OUT, std=0.1, rng=0)
    np.testing.assert_allclose(small, 0.1 * weights, rtol=1e-15)  # same draws, scaled


def test_gain_scales_the_same_draws() -> None:
    # uniform(-2a, 2a) and 2 * uniform(-a, a) from one stream: equal up to rounding.
    np.testing.assert_allclose(
        xavier_uniform(5, 7, gain=2.0, rng=3), 2.0 * xavier_uniform(5, 7, rng=3), rtol=1e-14
    )
    np.testing.assert_allclose(
        xavier_normal(5, 7, gain=0.5, rng=3), 0.5 * xavier_normal(5, 7, rng=3), rtol=1e-15
    )


def test_same_seed_same_matrix_and_no_global_rng() -> None:
    np.random.seed(1234)
    global_state_before = np.random.get_state()[1].copy()  # type: ignore[index]
    for scheme in INIT_SCHEMES:
        first = init_weight(6, 4, scheme, rng=42)
        np.testing.assert_array_equal(first, init_weight(6, 4, scheme, rng=42))
        np.testing.assert_array_equal(
            first, init_weight(6, 4, scheme, rng=np.random.default_rng(42))
        )
        assert not np.array_equal(first, init_weight(6, 4, scheme, rng=43))
    np.testing.assert_array_equal(np.random.get_state()[1], global_state_before)  # type: ignore[index]


def test_generator_is_used_and_advanced() -> None:
    generator = np.random.default_rng(0)
    assert as_rng(generator) is generator
    first = xavier_uniform(3, 3, rng=generator)
    assert not np.array_equal(first, xavier_uniform(3, 3, rng=generator))
    assert isinstance(as_rng(np.int64(7)), np.random.Generator)


def test_none_gives_fresh_entropy_without_touching_the_global_rng() -> None:
    np.random.seed(99)
    global_state_before = np.random.get_state()[1].copy()  # type: ignore[index]
    first, second = normal(4, 4, rng=None), normal(4, 4, rng=None)
    # Two 16-value draws from independent OS-seeded streams: equal with probability ~0.
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(np.random.get_state()[1], global_state_before)  # type: ignore[index]


def test_init_weight_dispatch() -> None:
    np.testing.assert_array_equal(init_weight(4, 3, rng=5), xavier_uniform(4, 3, rng=5))
    np.testing.assert_array_equal(
        init_weight(4, 3, "xavier_normal", gain=2.0, rng=5), xavier_normal(4, 3, gain=2.0, rng=5)
    )
    np.testing.assert_array_equal(
        init_weight(4, 3, "normal", std=0.3, rng=5), normal(4, 3, std=0.3, rng=5)
    )


@pytest.mark.parametrize("scheme", INIT_SCHEMES)
def test_v_gain_scales_only_v(scheme: str) -> None:
    w_q, w_k, w_v = init_qkv(8, 6, 6, 4, scheme=scheme, rng=11)
    assert (w_q.shape, w_k.shape, w_v.shape) == ((8, 6), (8, 6), (8, 4))
    assert not np.array_equal(w_q, w_k)  # separate draws
    small_q, small_k, small_v = init_qkv(8, 6, 6, 4, scheme=scheme, v_gain=0.5, rng=11)
    np.testing.assert_array_equal(small_q, w_q)
    np.testing.assert_array_equal(small_k, w_k)
    np.testing.assert_array_equal(small_v, 0.5 * w_v)  # x0.5 is exact in binary


def test_init_qkv_draws_in_order_q_k_v() -> None:
    generator = np.random.default_rng(9)
    expected = [init_weight(8, width, rng=generator) for width in (6, 6, 4)]
    for got, want in zip(init_qkv(8, 6, 6, 4, rng=9), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_errors() -> None:
    with pytest.raises(
        AttnlabError,
        match=r"scheme: expected one of 'xavier', 'xavier_normal', 'normal', got 'kaiming'",
    ):
        init_weight(4, 3, "kaiming", rng=0)
    with pytest.raises(AttnlabError, match=r"fan_in: expected an integer >= 1, got 0"):
        xavier_uniform(0, 3, rng=0)
    with pytest.raises(AttnlabError, match=r"fan_out: expected an integer, got float 2.5"):
        normal(4, 2.5, rng=0)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"gain: expected a finite number >= 0, got -1"):
        xavier_uniform(4, 3, gain=-1, rng=0)
    with pytest.raises(AttnlabError, match=r"gain: expected a finite number >= 0, got nan"):
        xavier_normal(4, 3, gain=float("nan"), rng=0)
    with pytest.raises(AttnlabError, match=r"std: expected a number, got str"):
        normal(4, 3, std="1", rng=0)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"rng: expected a numpy.random.Generator, .* str '1'"):
        xavier_uniform(4, 3, rng="1")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"rng: .* got float 1.0"):
        xavier_uniform(4, 3, rng=1.0)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"rng: expected an int seed >= 0, got -1"):
        as_rng(-1)
    with pytest.raises(AttnlabError, match=r"rng: .* got RandomState"):
        as_rng(np.random.RandomState(0))  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"rng: .* got bool True"):
        as_rng(True)
    with pytest.raises(AttnlabError, match=r"d_q, d_k: expected equal widths .* d_q=6, d_k=4"):
        init_qkv(8, 6, 4, 4, rng=0)
    with pytest.raises(AttnlabError, match=r"v_gain: expected a finite number >= 0, got -0.5"):
        init_qkv(8, 4, 4, 4, v_gain=-0.5, rng=0)
    with pytest.raises(AttnlabError, match=r"d_model: expected an integer >= 1, got 0"):
        init_qkv(0, 4, 4, 4, rng=0)
    with pytest.raises(AttnlabError, match=r"d_v: expected an integer >= 1, got -4"):
        init_qkv(8, 4, 4, -4, rng=0)


def test_init_qkv_validates_before_drawing() -> None:
    generator = np.random.default_rng(0)
    reference = np.random.default_rng(0).random()
    with pytest.raises(AttnlabError, match=r"scheme: expected one of"):
        init_qkv(8, 4, 4, 4, scheme="orthogonal", rng=generator)
    with pytest.raises(AttnlabError, match=r"std: expected a finite number >= 0, got inf"):
        init_qkv(8, 4, 4, 4, scheme="normal", std=math.inf, rng=generator)
    assert generator.random() == reference  # nothing was drawn by the failed calls


def test_huge_gains_give_finite_weights_or_a_named_error():
    w = xavier_uniform(3, 3, gain=1e308, rng=0)  # U(-a, a) with 2a = inf: OverflowError
    assert np.isfinite(w).all() and np.abs(w).max() > 1e306
    with pytest.raises(AttnlabError, match="std: expected a value whose weights fit float64"):
        normal(30, 30, std=1e308, rng=0)
