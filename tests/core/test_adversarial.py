"""Inputs chosen to break things: each gives the right result or one clear AttnlabError.

Every test here failed before its fix with a bare exception (IndexError,
MemoryError, RuntimeError, UnicodeEncodeError, ...), a NaN, silently wrong
numbers or a CLI "internal error". Errors are matched on the argument they name
and on what they say was expected, so a message that starts blaming the wrong
argument fails too.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.errors import AttnlabError
from attnlab.report.text import to_markdown, to_text

# The torch twin's cases are in tests/torch/test_adversarial_torch.py; the views,
# files and CLI ones in tests/report/test_adversarial_report.py.


# ---------------------------------------------------------------- H, I. flags and scalars


def test_other_flags_are_checked_not_truth_tested():
    x = np.ones((1, 3, 8))
    mha = attnlab.MultiHeadAttention.init(2, 8, seed=0)
    with pytest.raises(AttnlabError, match=r"^return_weights: expected True or False, got 'no'$"):
        mha(x, return_weights="no")
    with pytest.raises(AttnlabError, match=r"^interleaved: expected True or False, got 'yes'$"):
        attnlab.apply_rope(np.ones((3, 4)), interleaved="yes")
    model = attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=11, d_model=8, num_heads=2))
    with pytest.raises(AttnlabError, match=r"^greedy: expected True or False, got 'False'$"):
        model.generate([1, 2], 2, greedy="False")


def test_kv_cache_refuses_a_query_with_no_heads_and_appends_nothing():
    lib, make = attnlab, np.zeros
    cache = lib.KVCache(1, 2, 4)
    k = make((1, 2, 3, 4))
    with pytest.raises(AttnlabError, match=r"^q: expected \(B, H, T, D\) = \(1, H, 3, 4\) "
                                           r"with H a positive multiple of Hkv = 2"):
        cache.attend(make((1, 0, 3, 4)), k, k)
    assert cache.length == 0  # refused before anything was written


# ---------------------------------------------------------------- D. sampling at tiny temperatures


def test_sampling_at_a_tiny_temperature_is_greedy_not_token_zero():
    model = attnlab.TinyDecoder(
        attnlab.DecoderConfig(vocab_size=50, d_model=16, num_heads=2, dtype="float64"), seed=1)
    greedy = model.generate([[3, 1, 4], [1, 5, 9]], 6)
    for temperature in (1e-310, 5e-324, 1e-300, 1e-30):
        sampled = model.generate([[3, 1, 4], [1, 5, 9]], 6, greedy=False,
                                 temperature=temperature, seed=7)
        np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
    assert (greedy.new_tokens != 0).any()  # the old NaN CDF always picked token 0


def test_sampling_at_a_huge_temperature_is_uniform_not_nan():
    model = attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=4, d_model=8, num_heads=2))
    out = model.generate(np.zeros((400, 1), dtype=np.int64), 1, greedy=False,
                         temperature=1e308, seed=0)
    counts = np.bincount(out.new_tokens.ravel(), minlength=4)
    # 400 uniform draws over 4 tokens: each count is 100 ± 8.7 (one sigma); 40 is 7 sigmas.
    assert (np.abs(counts - 100) < 40).all(), counts


# ---------------------------------------------------------------- E. sizes from arguments


LIMIT = r"more than attnlab's limit of 2,147,483,648 \(attnlab\.checks\.MAX_ELEMENTS\)"

HUGE = [
    (lambda: attnlab.causal_mask(10**6), r"T: the causal mask \(T, S\) = \(1000000, 1000000\)"),
    (lambda: attnlab.causal_mask(3, 10**10), r"T, S: the causal mask \(T, S\)"),
    (lambda: attnlab.sliding_window_mask(10**6, 3, is_causal=True),
     r"T: the sliding-window mask \(T, S\)"),
    (lambda: attnlab.block_sparse_mask(10**6, 64), r"T: the block-sparse mask \(T, S\)"),
    (lambda: attnlab.fast.block_sparse.bigbird_layout(10**6),
     r"num_blocks: the block layout \(n, n\)"),
    (lambda: attnlab.alibi_bias(8, 10**5), r"num_heads, T: the bias \((B, )?H, T, S\)"),
    (lambda: attnlab.alibi_slopes(10**10), r"num_heads: the slopes \(H,\)"),
    (lambda: attnlab.sinusoidal_encoding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: attnlab.SinusoidalPositionalEncoding(512, 10**9), r"max_len, d_model: the table"),
    (lambda: attnlab.LearnedPositionalEmbedding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: attnlab.init_weight(10**6, 10**6, rng=0), r"fan_in, fan_out: the weight"),
    (lambda: attnlab.MultiHeadAttention.init(1, 10**6), r"fan_in, fan_out: the weight"),
    (lambda: attnlab.KVCache(1, 8, 64, capacity=10**9), r"capacity: the cache's buffer"),
    (lambda: attnlab.KVCache(1, 8, 64, max_len=10**9), r"max_len: the cache's buffer"),
    (lambda: attnlab.SlidingWindowKVCache(1, 8, 64, window=10**9), r"window: the cache's"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=10**9)),
     r"vocab_size, d_model: the embedding \(V, E\)"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=16, d_model=8, num_heads=2))
     .generate([1, 2], 10**9), r"max_new_tokens: the logits \(B, N, V\)"),
]


@pytest.mark.parametrize("call,message", HUGE, ids=[m.split(":")[0] + f"-{i}"
                                                      for i, (_, m) in enumerate(HUGE)])
def test_a_huge_size_is_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


def test_a_kv_cache_refuses_to_grow_past_the_limit(monkeypatch):
    monkeypatch.setattr(attnlab.checks, "MAX_ELEMENTS", 1000)
    lib, make = attnlab, np.zeros
    cache = lib.KVCache(1, 2, 4, capacity=100)  # (1, 2, 100, 4): 800 elements
    cache.append(make((1, 2, 100, 4)), make((1, 2, 100, 4)))
    with pytest.raises(AttnlabError, match=r"^k: the cache's buffer \(B, Hkv, length, D\) = "
                                           r"\(1, 2, 200, 4\) would hold 1,600 elements"):
        cache.append(make((1, 2, 1, 4)), make((1, 2, 1, 4)))
    assert cache.length == 100


# ---------------------------------------------------------------- G. traces


@pytest.mark.parametrize("precision", [-1, 1.5, True, 18, "4"])
def test_trace_text_refuses_a_bad_precision(precision):
    trace = attnlab.explain()
    for render in (to_text, to_markdown):
        with pytest.raises(AttnlabError, match=r"^precision: expected an integer number of "
                                               r"decimals in 0\.\.17, got "):
            render(trace, "en", precision=precision)


def test_trace_text_takes_the_extreme_precisions():
    trace = attnlab.explain()
    assert "0.6652" not in to_text(trace, precision=0)
    assert to_text(trace, precision=np.int64(17)).count(".") > 10


# ---------------------------------------------------------------- found by test_property_errors.py


def test_scale_zero_with_scores_that_overflow_before_scaling_is_refused():
    """q·kᵀ overflows float32 before the scale 0 is applied: inf·0 was NaN."""
    q, k, v = np.float32([[1e20]]), np.float32([[1e20]]), np.float32([[1.0]])
    for attention in (attnlab.scaled_dot_product_attention, attnlab.flash_attention):
        with pytest.raises(AttnlabError, match=r"^q, k: the scores q·kᵀ could reach 1e\+40 "
                                               r"before scaling"):
            attention(q, k, v, scale=0.0)


def test_a_finite_bias_that_overflows_the_scores_blocks_the_key_without_a_warning():
    import warnings

    q, k = np.float32([[61.0]]), np.float32([[-2.5e30], [0.0]])  # scores -1.5e32, 0
    v = np.float32([[1.0], [2.0]])
    bias = np.float32([np.finfo(np.float32).min, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = attnlab.scaled_dot_product_attention(q, k, v, bias=bias)
    assert out.tolist() == [[2.0]]  # key 0: score + finfo.min overflows to -inf, weight 0


# ---------------------------------------------------------------- found by a sweep of bad arguments


def test_an_error_about_an_array_stays_on_one_line():
    q = np.ones((3, 4))
    with pytest.raises(AttnlabError) as info:
        attnlab.scaled_dot_product_attention(q, q, q, return_weights=np.ones((4, 4)))
    assert str(info.value) == ("return_weights: expected True or False, got ndarray of shape "
                               "(4, 4) and dtype float64")
    assert "\n" not in str(AttnlabError("x: got array([[1],\n       [2]])"))


@pytest.mark.parametrize("call,name", [
    (lambda: attnlab.apply_rope(np.ones((2, 4)), positions=[[0, 1], [2]]), "positions"),
    (lambda: attnlab.sliding_window_mask(4, 3, is_causal=True, global_tokens=[[0], [1, 2]]),
     "global_tokens"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=16, d_model=8, num_heads=2))
     .generate([[1, 2], [3]], 2), "prompt_ids"),
    (lambda: attnlab.alibi_bias(2, 3, dtype="\udce9"), "dtype"),
], ids=["rope-ragged", "global-ragged", "ids-ragged", "alibi-dtype-surrogate"])
def test_unreadable_arguments_are_named(call, name):
    with pytest.raises(AttnlabError, match=rf"^{name}: "):
        call()


@pytest.mark.parametrize("call,message", [
    (lambda: attnlab.block_sparse_attention(*[np.ones((2, 3, 4))] * 3, 10**12),
     r"block_size: the rows padded to whole blocks"),
    (lambda: attnlab.token_embeddings(["a", "b"], 10**12), r"d_model: the embeddings \(T, E\)"),
    (lambda: attnlab.positional_relative.rope_angles(np.arange(3), 10**12),
     r"head_dim: the angles \(T, D\)"),
])
def test_more_huge_sizes_are_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


@pytest.mark.parametrize("flag", [True, np.bool_(False)])
def test_sliding_window_takes_a_0d_key_padding(flag):
    x = np.random.default_rng(0).standard_normal((2, 5, 4))
    out = attnlab.sliding_window_attention(x, x, x, 3, is_causal=True, key_padding=flag)
    plain = attnlab.scaled_dot_product_attention(
        x, x, x, attnlab.sliding_window_mask(5, 3, is_causal=True) & flag)
    np.testing.assert_allclose(out, plain, rtol=1e-12, atol=1e-12)  # float64, chunked vs plain
