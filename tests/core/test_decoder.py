"""TinyDecoder: cached generation against recomputing the whole sequence at every step.

The plain twin is the model's forward without caches, which runs each layer's own
``EncoderBlock.__call__`` (``is_causal=True``, RoPE inside MultiHeadAttention, the
window as a mask); it is itself checked against a forward written out here.

Tolerances: cached and uncached logits come from the same sums grouped differently
(a new token against S cached keys vs. the last row of an S x S product), through a
few layers whose outputs are O(1)-O(10). float64: 1e-10 on the logits (observed
~1e-14; the margin covers the layer stack). float32: 1e-4 absolute on logits of size
~10 (observed ~1e-6). Tokens are compared exactly: with float64 a greedy argmax could
only differ if two logits were within ~1e-14 of each other.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError, ShapeError
from attnlab.fast.kv_cache import KVCache, SlidingWindowKVCache
from attnlab.nn.decoder import DecoderBlock, DecoderConfig, Generation, TinyDecoder
from attnlab.nn.multihead import linear

LOGIT_TOL = {"float64": {"rtol": 1e-10, "atol": 1e-10}, "float32": {"rtol": 1e-4, "atol": 1e-4}}

CONFIGS = {
    "mha-rope": dict(),
    "gqa-rope": dict(num_heads=4, num_kv_heads=2),
    "mqa-no-rope": dict(num_heads=4, num_kv_heads=1, pos="none"),
    "window-5": dict(num_kv_heads=2, window=5),
    "relu-3-layers": dict(num_layers=3, activation="relu"),
}


def small(dtype="float64", **overrides) -> DecoderConfig:
    base = dict(vocab_size=97, d_model=32, num_heads=4, num_layers=2, d_ff=64, dtype=dtype)
    base.update(overrides)
    return DecoderConfig(**base)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_and_uncached_generation_agree(name, dtype):
    model = TinyDecoder(small(dtype, **CONFIGS[name]), seed=3)
    prompt = np.random.default_rng(0).integers(0, 97, size=(2, 9))
    cached = model.generate(prompt, 16, use_cache=True)
    plain = model.generate(prompt, 16, use_cache=False)
    np.testing.assert_array_equal(cached.tokens, plain.tokens)
    np.testing.assert_array_equal(cached.tokens[:, :9], prompt)
    assert cached.logits.shape == (2, 16, 97) and cached.logits.dtype == np.dtype(dtype)
    np.testing.assert_allclose(cached.logits, plain.logits, **LOGIT_TOL[dtype])
    # greedy: every new token is the argmax of the logits it was chosen from
    np.testing.assert_array_equal(cached.new_tokens, cached.logits.argmax(-1))


def test_sampling_agrees_too():
    model = TinyDecoder(small(num_kv_heads=2), seed=1)
    prompt = [5, 6, 7]
    a = model.generate(prompt, 20, greedy=False, temperature=0.8, seed=11)
    b = model.generate(prompt, 20, greedy=False, temperature=0.8, seed=11, use_cache=False)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    c = model.generate(prompt, 20, greedy=False, temperature=0.8, seed=12)
    assert not np.array_equal(a.tokens, c.tokens)  # the seed is used
    assert a.tokens.min() >= 0 and a.tokens.max() < 97


@pytest.mark.parametrize("name", list(CONFIGS))
def test_chunked_forward_with_caches_equals_full_forward(name):
    model = TinyDecoder(small(**CONFIGS[name]), seed=2)
    ids = np.random.default_rng(1).integers(0, 97, size=(3, 21))
    full = model.forward(ids)  # (B, T, V)
    caches = model.new_caches(3)
    parts, start = [], 0
    for size in [7, 1, 1, 6, 1, 5]:
        parts.append(model.forward(ids[:, start : start + size], caches))
        start += size
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, **LOGIT_TOL["float64"])
    assert all(c.length == 21 for c in caches)


def test_uncached_forward_is_the_plain_computation():
    """The uncached path equals a forward written out here from the parts, with RoPE at
    positions 0 .. T-1 and the window as a mask (no attnlab attention code path shared
    with the cache)."""
    from attnlab.attention import scaled_dot_product_attention

    model = TinyDecoder(small(num_kv_heads=2, window=4), seed=5)
    ids = np.random.default_rng(2).integers(0, 97, size=(2, 11))
    x = model.embedding[ids]
    for block in model.blocks:
        b = block.block
        h = b.norm1(x)
        q, k, v = b.attn.project(h, h)
        q, k = b.attn.rope(q, np.arange(11)), b.attn.rope(k, np.arange(11))
        k, v = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
        p, j = np.arange(11)[:, None], np.arange(11)[None, :]
        heads = scaled_dot_product_attention(q, k, v, (j <= p) & (j > p - 4))
        x = x + linear(heads.transpose(0, 2, 1, 3).reshape(2, 11, 32), b.attn.Wo, b.attn.bo)
        x = x + b.ffn(b.norm2(x))
    expected = linear(model.norm_f(x), model.W_head, None)
    np.testing.assert_allclose(model.forward(ids), expected, rtol=1e-12, atol=1e-12)


def test_window_takes_effect_only_beyond_w():
    full = TinyDecoder(small(), seed=4)
    windowed = TinyDecoder(small(window=6), seed=4)  # same weights: same seed, same draws
    ids = np.random.default_rng(3).integers(0, 97, size=(1, 14))
    a, b = full.forward(ids), windowed.forward(ids)
    np.testing.assert_allclose(a[:, :6], b[:, :6], rtol=1e-12, atol=1e-12)
    assert not np.allclose(a[:, 6:], b[:, 6:])
    assert all(isinstance(c, SlidingWindowKVCache) for c in windowed.new_caches())
    assert all(isinstance(c, KVCache) for c in full.new_caches())


def test_sliding_window_model_memory_stays_fixed():
    model = TinyDecoder(small(window=4), seed=0)
    caches = model.new_caches(1)
    before = sum(c.nbytes for c in caches)
    model.forward(np.arange(40)[None] % 97, caches)
    assert sum(c.nbytes for c in caches) == before


def test_same_seed_same_model_and_float32_weights():
    a, b = TinyDecoder(small("float32"), seed=7), TinyDecoder(small("float32"), seed=7)
    np.testing.assert_array_equal(a.W_head, b.W_head)
    for block in a.blocks:
        mha = block.block.attn
        assert all(p.dtype == np.float32 for p in mha.parameters().values())
        assert block.block.ffn.W1.dtype == np.float32
    assert a.forward([[1, 2]]).dtype == np.float32


def test_generate_edge_cases():
    model = TinyDecoder(small(), seed=0)
    out = model.generate([3, 4], 0)
    assert isinstance(out, Generation)
    assert out.tokens.tolist() == [[3, 4]] and out.logits.shape == (1, 0, 97)
    assert model.generate([[3]], 1).tokens.shape == (1, 2)  # a one-token prompt


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (([1.5, 2.0], 3), {}, AttnlabError, "prompt_ids: expected integer token ids"),
        (([1, 97], 3), {}, AttnlabError, r"prompt_ids: expected token ids in \[0, 97\), got 97"),
        (([[[1]]], 3), {}, ShapeError, r"prompt_ids: expected \(B, T\) or \(T,\)"),
        ((np.zeros((1, 0), int), 3), {}, ShapeError, "at least one token"),
        (([1], -1), {}, AttnlabError, "max_new_tokens: expected an integer >= 0"),
        (([1], 2), {"temperature": 0.0}, AttnlabError, "temperature"),
    ],
)
def test_generate_bad_inputs(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        TinyDecoder(small(), seed=0).generate(*args, **kwargs)


def test_max_len_limits_cached_generation():
    model = TinyDecoder(small(max_len=10), seed=0)
    assert model.generate([1, 2, 3], 7).tokens.shape == (1, 10)
    with pytest.raises(AttnlabError, match=r"max_len = 10; expected max_new_tokens <= 7"):
        model.generate([1, 2, 3], 8)
    assert model.generate([1, 2, 3], 8, use_cache=False).tokens.shape == (1, 11)


def test_block_refuses_a_cache_with_another_window():
    model = TinyDecoder(small(window=3), seed=0)
    with pytest.raises(AttnlabError, match="cache: expected a cache with window = 3"):
        model.forward([[1, 2]], [KVCache(1, 4, 8) for _ in model.blocks])
    with pytest.raises(AttnlabError, match="caches: expected one cache per layer"):
        model.forward([[1, 2]], model.new_caches()[:1])
    with pytest.raises(ShapeError, match=r"ids: expected \(B, T\) with B = 2"):
        model.forward([[1, 2]], model.new_caches(2))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_kv_heads": 3}, "num_kv_heads: expected a divisor"),
        ({"d_model": 30}, "d_model: expected a multiple of num_heads"),
        ({"d_model": 12, "num_heads": 4}, "even head dim"),
        ({"dtype": "float16"}, "dtype"),
        ({"activation": "swish"}, "activation"),
        ({"window": 0}, "window"),
    ],
)
def test_bad_config(overrides, message):
    with pytest.raises(AttnlabError, match=message):
        small(**overrides)


def test_decoder_block_validation():
    from attnlab.nn.layers import EncoderBlock

    with pytest.raises(AttnlabError, match="EncoderBlock with norm='pre'"):
        DecoderBlock(EncoderBlock(8, 2, 16, norm="post"))
    with pytest.raises(AttnlabError, match="EncoderBlock with norm='pre'"):
        DecoderBlock(object())  # type: ignore[arg-type]


def test_cached_path_uses_the_attention_scale():
    """A block whose attention has its own ``scale``: the cached path scales the same way
    (and differs from the default scale, so the test can fail)."""
    model = TinyDecoder(small(**CONFIGS[next(iter(CONFIGS))]), seed=2)
    ids = np.random.default_rng(1).integers(0, 97, size=(1, 9))
    default = model.forward(ids)
    for block in model.blocks:
        block.block.attn.scale = 0.9
    full = model.forward(ids)  # (B, T, V)
    assert not np.allclose(full, default)
    caches = model.new_caches(1)
    parts = [model.forward(ids[:, :4], caches), model.forward(ids[:, 4:], caches)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, **LOGIT_TOL["float64"])
