"""Tests of attnlab.positional against independent references, NumPy only.

References used (none of them calls attnlab):
- scalar ``math`` loops over the textbook formulas;
- the ALiBi paper's reference ``get_slopes``.

The torch references (seed 001's ``PositionalEncoding``, Hugging Face's and Meta's
RoPE) are in tests/torch/test_positional_vs_torch.py.
"""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.positional as positional
import attnlab.positional_relative as positional_relative
from attnlab.errors import AttnlabError, ShapeError
from attnlab.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from attnlab.positional_relative import (
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_angles,
)

# --------------------------------------------------------------------------- references


def paper_get_slopes(n: int) -> list[float]:
    """ALiBi reference code (ofirpress/attention_with_linear_biases), verbatim."""

    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + paper_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


@pytest.mark.parametrize("module", [positional, positional_relative])
def test_doctests_pass(module) -> None:
    results = doctest.testmod(module)
    assert results.attempted > 0
    assert results.failed == 0


# --------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_hand_values() -> None:
    pe = sinusoidal_encoding(10, 4)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # sin(0), cos(0): exact
    # 1e-15: a single sin/cos of a float64 argument, off by at most an ulp.
    assert pe[1, 0] == pytest.approx(math.sin(1.0), abs=1e-15)
    assert pe[1, 1] == pytest.approx(math.cos(1.0), abs=1e-15)
    assert pe[2, 2] == pytest.approx(math.sin(2 / 10000 ** (2 / 4)), abs=1e-15)
    assert pe[2, 3] == pytest.approx(math.cos(2 / 10000 ** (2 / 4)), abs=1e-15)


def test_sinusoidal_odd_width_follows_the_formula() -> None:
    # (The seed's torch code cannot build an odd-width table at all: tests/torch.)
    pe = sinusoidal_encoding(10, 7)
    assert pe.shape == (10, 7)
    for p in range(10):
        for c in range(7):
            angle = p / 10000.0 ** ((c - c % 2) / 7)
            expected = math.sin(angle) if c % 2 == 0 else math.cos(angle)
            assert pe[p, c] == pytest.approx(expected, abs=1e-14)  # a few ulps of exp/log


def test_sinusoidal_base_changes_the_frequencies() -> None:
    pe = sinusoidal_encoding(4, 4, base=100.0)
    assert pe[3, 2] == pytest.approx(math.sin(3 / 100 ** (2 / 4)), abs=1e-15)  # one sin


def test_sinusoidal_offset_continues_the_sequence() -> None:
    enc = SinusoidalPositionalEncoding(8, max_len=20)
    x = np.random.default_rng(1).standard_normal((3, 10, 8))
    full = enc(x)
    np.testing.assert_array_equal(enc(x[:, 6:], offset=6), full[:, 6:])  # same additions
    np.testing.assert_array_equal(enc(x[:, 9:10], offset=9), full[:, 9:10])


def test_sinusoidal_call_keeps_dtype() -> None:
    enc = SinusoidalPositionalEncoding(4, max_len=8)
    assert enc(np.zeros((3, 4), dtype=np.float32)).dtype == np.float32
    assert enc(np.zeros((3, 4), dtype=np.float16)).dtype == np.float16
    assert enc(np.zeros((3, 4), dtype=np.int64)).dtype == np.float64
    assert enc([[0, 0, 0, 0]]).tolist() == [[0.0, 1.0, 0.0, 1.0]]


def test_sinusoidal_errors() -> None:
    enc = SinusoidalPositionalEncoding(8, max_len=16)
    with pytest.raises(AttnlabError, match=r"offset=10, T=8.*max_len=16.*offset \+ T <= 16"):
        enc(np.zeros((8, 8)), offset=10)
    with pytest.raises(AttnlabError, match=r"T=17.*max_len=16"):
        enc(np.zeros((17, 8)))
    with pytest.raises(ShapeError, match=r"x: expected \(\.\.\., T, E\) with E = d_model = 8"):
        enc(np.zeros((4, 6)))
    with pytest.raises(ShapeError, match=r"x: expected \(\.\.\., T, E\), got \(8\)"):
        enc(np.zeros(8))
    with pytest.raises(AttnlabError, match=r"offset: expected an integer >= 0, got -1"):
        enc(np.zeros((2, 8)), offset=-1)
    with pytest.raises(AttnlabError, match=r"x: expected finite values"):
        enc(np.full((2, 8), np.nan))
    with pytest.raises(AttnlabError, match=r"max_len: expected an integer >= 1, got 0"):
        sinusoidal_encoding(0, 8)
    with pytest.raises(AttnlabError, match=r"d_model: expected an integer, got float 2.5"):
        sinusoidal_encoding(4, 2.5)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"base: expected a finite number > 0, got -1"):
        sinusoidal_encoding(4, 8, base=-1)
    with pytest.raises(AttnlabError, match=r"base: expected a number, got str"):
        SinusoidalPositionalEncoding(8, base="big")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"dtype: expected float16, float32 or float64"):
        sinusoidal_encoding(4, 8, dtype=np.int32)
    with pytest.raises(AttnlabError, match=r"dtype: expected a NumPy float dtype"):
        sinusoidal_encoding(4, 8, dtype="no-such-dtype")


# --------------------------------------------------------------------------- learned


def test_learned_table_init_and_call() -> None:
    emb = LearnedPositionalEmbedding(1024, 64, seed=3)
    assert emb.table.shape == (1024, 64)
    assert (emb.max_len, emb.d_model) == (1024, 64)
    # 65536 draws: the sample std of N(0, 0.02^2) has relative spread 1/sqrt(2n) = 0.28%;
    # 2% is 7 sigma.
    assert emb.table.std() == pytest.approx(0.02, rel=0.02)
    x = np.random.default_rng(0).standard_normal((2, 5, 64))
    np.testing.assert_array_equal(emb(x, offset=7), x + emb.table[7:12])  # exact same sum


def test_learned_same_seed_same_table() -> None:
    a = LearnedPositionalEmbedding(8, 4, seed=5).table
    b = LearnedPositionalEmbedding(8, 4, seed=np.random.default_rng(5)).table
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, LearnedPositionalEmbedding(8, 4, seed=6).table)
    assert LearnedPositionalEmbedding(8, 4, std=0.0).table.tolist() == [[0.0] * 4] * 8


def test_learned_from_table_copies() -> None:
    source = np.arange(12, dtype=np.float32).reshape(6, 2)
    emb = LearnedPositionalEmbedding.from_table(source)
    source[0, 0] = 100.0
    assert emb.table[0, 0] == 0.0
    assert emb.table.dtype == np.float32
    out = emb(np.zeros((2, 2), dtype=np.float32), offset=4)
    assert out.tolist() == [[8.0, 9.0], [10.0, 11.0]]
    assert out.dtype == np.float32


def test_learned_errors() -> None:
    with pytest.raises(ShapeError, match=r"table: expected \(max_len, E\).*got \(5\)"):
        LearnedPositionalEmbedding.from_table(np.zeros(5))
    with pytest.raises(ShapeError, match=r"table: expected \(max_len, E\).*got \(0, 3\)"):
        LearnedPositionalEmbedding.from_table(np.zeros((0, 3)))
    with pytest.raises(AttnlabError, match=r"table: expected finite values"):
        LearnedPositionalEmbedding.from_table(np.array([[1.0, np.inf]]))
    with pytest.raises(AttnlabError, match=r"std: expected a finite number >= 0, got -0.1"):
        LearnedPositionalEmbedding(4, 4, std=-0.1)
    with pytest.raises(AttnlabError, match=r"std: expected a number, got str"):
        LearnedPositionalEmbedding(4, 4, std="0.02")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"rng: expected a numpy.random.Generator"):
        LearnedPositionalEmbedding(4, 4, seed="0")  # type: ignore[arg-type]
    emb = LearnedPositionalEmbedding(4, 4)
    with pytest.raises(AttnlabError, match=r"offset \+ T <= 4"):
        emb(np.zeros((3, 4)), offset=2)
    with pytest.raises(ShapeError, match=r"E = d_model = 4, got \(3, 5\)"):
        emb(np.zeros((3, 5)))


# --------------------------------------------------------------------------- RoPE


def test_rope_layouts_differ_only_by_a_feature_permutation() -> None:
    x = np.random.default_rng(2).standard_normal((5, 8))  # (T, D)
    evens_then_odds = np.r_[0:8:2, 1:8:2]  # interleaved pair (2i, 2i+1) -> (i, i + D/2)
    inverse = np.argsort(evens_then_odds)
    half_layout = apply_rope(x[:, evens_then_odds])
    # Same products and sums, in the same order: only the storage order differs.
    np.testing.assert_allclose(
        half_layout[:, inverse], apply_rope(x, interleaved=True), rtol=0, atol=1e-15
    )


def test_rope_angles_hand_values() -> None:
    cos, sin = rope_angles(np.array([0, 1]), 4)  # theta = (1, 1/100)
    assert cos[0].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert sin[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    # One cos/sin each: exact to an ulp.
    np.testing.assert_allclose(cos[1], np.cos([1.0, 0.01, 1.0, 0.01]), rtol=0, atol=1e-15)
    cos_i, sin_i = rope_angles([1], 4, interleaved=True)
    np.testing.assert_allclose(sin_i[0], np.sin([1.0, 1.0, 0.01, 0.01]), rtol=0, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 2000),
    n=st.integers(0, 2000),
    shift=st.integers(0, 2000),
    interleaved=st.booleans(),
)
def test_rope_scores_depend_only_on_relative_position(
    m: int, n: int, shift: int, interleaved: bool
) -> None:
    rng = np.random.default_rng(m * 7919 + n)
    q, k = rng.standard_normal((2, 1, 32))  # (T=1, D) each
    def score(pos_q: int, pos_k: int) -> float:
        rotated_q = apply_rope(q, pos_q, interleaved=interleaved)
        rotated_k = apply_rope(k, pos_k, interleaved=interleaved)
        return float(rotated_q[0] @ rotated_k[0])

    # float64 angles up to 4000 rad: ~1e-12 absolute error per angle, scores ~ |q||k| ~ 32.
    assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-9)


def test_rope_preserves_norms_and_position_zero() -> None:
    x = np.random.default_rng(3).standard_normal((4, 9, 16))
    for interleaved in (False, True):
        out = apply_rope(x, 11, interleaved=interleaved)
        # A rotation: norms agree to a few ulps of sums of 16 squares.
        np.testing.assert_allclose(
            np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13
        )
    np.testing.assert_array_equal(apply_rope(x[:, :1]), x[:, :1])  # cos 0 = 1, sin 0 = 0


def test_rope_positions_forms_agree() -> None:
    x = np.random.default_rng(4).standard_normal((2, 6, 8))
    full = apply_rope(x)
    np.testing.assert_array_equal(apply_rope(x, np.arange(6)), full)
    np.testing.assert_array_equal(apply_rope(x[:, 4:], 4), full[:, 4:])  # cached decoding
    np.testing.assert_array_equal(apply_rope(x[:, 4:], [4, 5]), full[:, 4:])
    rope = RotaryEmbedding(8, interleaved=True)
    np.testing.assert_array_equal(rope(x, 2), apply_rope(x, 2, interleaved=True))


def test_rope_keeps_dtype() -> None:
    x = np.random.default_rng(5).standard_normal((3, 5, 8))
    out32 = apply_rope(x.astype(np.float32), 100)
    assert out32.dtype == np.float32
    # float32 inputs and cos/sin: each output is 2 products and a sum of values <= ~4,
    # so a few float32 ulps of 4 (~5e-7).
    np.testing.assert_allclose(out32, apply_rope(x, 100), rtol=0, atol=2e-6)
    assert apply_rope(x.astype(np.float16)).dtype == np.float16
    assert apply_rope(np.ones((2, 4), dtype=np.int32)).dtype == np.float64


def test_rope_errors() -> None:
    with pytest.raises(ShapeError, match=r"x: RoPE .* D even, got \(3, 7\)"):
        apply_rope(np.zeros((3, 7)))
    with pytest.raises(ShapeError, match=r"x: expected \(\.\.\., T, D\), got \(8\)"):
        apply_rope(np.zeros(8))
    with pytest.raises(AttnlabError, match=r"positions: expected integer .* got dtype float64"):
        apply_rope(np.zeros((3, 4)), np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ShapeError, match=r"positions: expected shape \(T,\) = \(3,\), got \(2\)"):
        apply_rope(np.zeros((3, 4)), np.array([0, 1]))
    with pytest.raises(AttnlabError, match=r"positions: expected positions >= 0, got min -2"):
        apply_rope(np.zeros((3, 4)), np.array([-2, 0, 1]))
    with pytest.raises(AttnlabError, match=r"positions: expected an integer >= 0, got -1"):
        apply_rope(np.zeros((3, 4)), -1)
    with pytest.raises(AttnlabError, match=r"base: expected a finite number > 0, got 0"):
        apply_rope(np.zeros((3, 4)), base=0)
    with pytest.raises(AttnlabError, match=r"head_dim: RoPE .* even D, got 5"):
        RotaryEmbedding(5)
    with pytest.raises(AttnlabError, match=r"head_dim: RoPE .* even D, got 3"):
        rope_angles(np.arange(2), 3)
    with pytest.raises(AttnlabError, match=r"positions: expected an int array of shape \(T,\)"):
        rope_angles(None, 4)
    with pytest.raises(ShapeError, match=r"positions: expected shape \(T,\), got \(2, 2\)"):
        rope_angles(np.zeros((2, 2), dtype=int), 4)
    with pytest.raises(ShapeError, match=r"x: expected \(\.\.\., T, D\) with D = head_dim = 8"):
        RotaryEmbedding(8)(np.zeros((3, 4)))


# --------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_power_of_two() -> None:
    # Powers of two are exact in binary floating point.
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(1).tolist() == [2.0**-8]
    assert alibi_slopes(16).tolist()[1::2] == [2.0**-k for k in range(1, 9)]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64, 96])
def test_alibi_slopes_match_paper_reference(num_heads: int) -> None:
    # Same powers of two, grouped differently (start * ratio**i vs base**(i+1)): a few ulps.
    np.testing.assert_allclose(alibi_slopes(num_heads), paper_get_slopes(num_heads), rtol=1e-14)


def test_alibi_slopes_twelve_heads_by_hand() -> None:
    expected = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-15)  # one pow each


def test_alibi_bias_alignment_with_cache() -> None:
    num_heads, T, S = 12, 3, 8
    bias = alibi_bias(num_heads, T, S)
    assert bias.shape == (num_heads, T, S)
    slopes = paper_get_slopes(num_heads)
    for h in range(num_heads):
        for i in range(T):
            query_position = S - T + i  # bottom-right: the last T of S positions
            for j in range(S):
                expected = -slopes[h] * abs(query_position - j)
                if j <= query_position:  # the paper's causal form
                    assert expected == pytest.approx(slopes[h] * (j - query_position))
                # slope * integer distance: a few ulps of the slope's rounding
                assert bias[h, i, j] == pytest.approx(expected, rel=1e-14, abs=0)
    # The new queries see the same bias as the last rows of the full square one.
    np.testing.assert_array_equal(bias, alibi_bias(num_heads, S)[:, S - T :, :])


def test_alibi_bias_one_token_decoding_and_defaults() -> None:
    bias = alibi_bias(8, 1, 5)
    assert bias[0, 0].tolist() == [-2.0, -1.5, -1.0, -0.5, 0.0]  # slope 1/2, exact
    assert alibi_bias(4, 6).shape == (4, 6, 6)
    assert alibi_bias(4, 0, 5).shape == (4, 0, 5)
    assert alibi_bias(4, 2, 0).shape == (4, 2, 0)
    assert alibi_bias(4, 3, 5, dtype=np.float32).dtype == np.float32
    zero_distance = np.diagonal(alibi_bias(4, 3), axis1=1, axis2=2)  # (H, T)
    assert not np.signbit(zero_distance).any()  # +0.0, not -0.0, where query == key


def test_alibi_bias_equals_hugging_face_form_after_causal_softmax() -> None:
    num_heads, T, S = 6, 4, 9
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((num_heads, T, S))  # (H, T, S)
    may_attend = np.arange(S)[None, :] <= (S - T + np.arange(T))[:, None]  # (T, S) causal

    def softmax_masked(logits: np.ndarray) -> np.ndarray:
        logits = np.where(may_attend, logits, -np.inf)
        logits = logits - logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)
        return weights / weights.sum(axis=-1, keepdims=True)

    # HF build_alibi_tensor: slope * key_position, the same for every query.
    hf_bias = np.array(paper_get_slopes(num_heads))[:, None, None] * np.arange(S)  # (H, 1, S)
    # Differ by a per-row constant slope * pos_q, removed by softmax up to rounding.
    np.testing.assert_allclose(
        softmax_masked(scores + alibi_bias(num_heads, T, S)),
        softmax_masked(scores + hf_bias),
        rtol=1e-12,
        atol=1e-15,
    )


def test_alibi_errors() -> None:
    with pytest.raises(AttnlabError, match=r"num_heads: expected an integer >= 1, got 0"):
        alibi_slopes(0)
    with pytest.raises(AttnlabError, match=r"num_heads: expected an integer, got float 8.0"):
        alibi_slopes(8.0)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"T: expected an integer >= 0, got -1"):
        alibi_bias(4, -1)
    with pytest.raises(AttnlabError, match=r"S: expected an integer, got float 2.0"):
        alibi_bias(4, 2, 2.0)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match=r"dtype: expected float16, float32 or float64"):
        alibi_bias(4, 2, dtype=np.complex128)
