"""attnlab.torch's KV caches against their NumPy twins and the plain computation.

The plain twin of every cached call is attention over the full sequence, written
out here: keys and values repeated per query head (GQA), the bottom-right causal
rule and, for the sliding window, the band p - W + 1 .. p. Both twins share the
slot arithmetic of :mod:`attnlab.shapes`, so their buffers must hold the same keys.

Tolerances: the cached and the full computation take the same dot products over
the same keys, grouped differently (torch's fused kernel, a query row against the
cache vs. a row of the T x S matrix), so results differ by rounding only.
float64: 1e-12; float32: 1e-5 (observed ~1e-7). Keys are stored by copying, so
the two twins' buffers compare exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError, ShapeError
from attnlab.fast.kv_cache import KVCache, SlidingWindowKVCache

TOL = {np.float64: {"rtol": 1e-12, "atol": 1e-12}, np.float32: {"rtol": 1e-5, "atol": 1e-5}}
TORCH = {np.float64: torch.float64, np.float32: torch.float32}
SCHEDULES = {
    "prefill-then-tokens": [9] + [1] * 14,
    "token-by-token": [1] * 23,
    "mixed-chunks": [5, 1, 3, 1, 7, 2, 4],
}


def band(S: int, window: int | None) -> np.ndarray:  # -> (S, S)
    """Query p may see key j iff j <= p and (no window or j >= p - W + 1)."""
    p, j = np.arange(S)[:, None], np.arange(S)[None, :]
    allowed = j <= p
    if window is not None:
        allowed &= j >= p - window + 1
    return allowed


def full_attention(q, k, v, window=None):
    """Plain twin: (B, H, S, D), (B, Hkv, S, D), (B, Hkv, S, Dv) -> (B, H, S, Dv)."""
    G = q.shape[1] // k.shape[1]
    k_all, v_all = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    return attnlab.scaled_dot_product_attention(q, k_all, v_all, band(q.shape[2], window))


def decode(cache, q, k, v, chunks):
    """Feed the sequence to ``cache`` in chunks of the given sizes; the outputs, in order."""
    outs, start = [], 0
    for size in chunks:
        sl = slice(start, start + size)
        outs.append(cache.attend(q[:, :, sl], k[:, :, sl], v[:, :, sl]))
        start += size
    return outs


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("window", [None, 1, 4, 9])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_torch_cache_equals_numpy_cache(dtype, window, schedule):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 23, 8)).astype(dtype)
    k = rng.standard_normal((2, 2, 23, 8)).astype(dtype)
    v = rng.standard_normal((2, 2, 23, 6)).astype(dtype)
    if window is None:
        np_cache = KVCache(2, 2, 8, 6, capacity=3, dtype=dtype)
        t_cache = at.KVCache(2, 2, 8, 6, capacity=3, dtype=TORCH[dtype])
    else:
        np_cache = SlidingWindowKVCache(2, 2, 8, 6, window=window, dtype=dtype)
        t_cache = at.SlidingWindowKVCache(2, 2, 8, 6, window=window, dtype=TORCH[dtype])
    expected = np.concatenate(decode(np_cache, q, k, v, SCHEDULES[schedule]), axis=2)
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    got = torch.cat(decode(t_cache, qt, kt, vt, SCHEDULES[schedule]), dim=2)
    assert got.dtype == TORCH[dtype]
    np.testing.assert_allclose(got.numpy(), expected, **TOL[dtype])
    np.testing.assert_allclose(got.numpy(), full_attention(q, k, v, window), **TOL[dtype])
    np.testing.assert_array_equal(t_cache.keys.numpy(), np_cache.keys)
    np.testing.assert_array_equal(t_cache.values.numpy(), np_cache.values)
    if window is not None:
        np.testing.assert_array_equal(t_cache.positions.numpy(), np_cache.positions)
    assert t_cache.length == np_cache.length and t_cache.nbytes == np_cache.nbytes


def test_torch_cache_with_torch_multihead_rope():
    """Cached decoding with attnlab.torch's projections and RoPE equals the module's full
    causal forward (an independent implementation of the positions)."""
    torch.manual_seed(0)
    mha = at.MultiHeadAttention(4, 16, num_kv_heads=2, rope=True, dtype=torch.float64)
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    with torch.inference_mode():
        expected, _ = mha(x, x, x, is_causal=True)
        cache = at.KVCache(2, 2, 4, dtype=torch.float64)
        outs, start = [], 0
        for size in [5, 1, 1, 9, 1]:
            chunk = x[:, start : start + size]
            q = mha.q_proj(chunk).view(2, size, 4, 4).transpose(1, 2)
            k = mha.k_proj(chunk).view(2, size, 2, 4).transpose(1, 2)
            v = mha.v_proj(chunk).view(2, size, 2, 4).transpose(1, 2)
            positions = cache.next_positions(size)
            q, k = at.apply_rope(q, positions), at.apply_rope(k, positions)
            heads = cache.attend(q, k, v)
            outs.append(mha.out_proj(heads.transpose(1, 2).reshape(2, size, 16)))
            start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, rtol=1e-12, atol=1e-12)


def test_torch_cache_errors_and_limits():
    cache = at.KVCache(1, 1, 2, max_len=3, dtype=torch.float64)
    x = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    cache.attend(x, x, x)
    with pytest.raises(AttnlabError, match=r"max_len = 3.*expected T <= 0 new tokens, got T = 1"):
        cache.append(x[:, :, :1], x[:, :, :1])
    with pytest.raises(ShapeError, match=r"v: expected \(B, Hkv, T, Dv\)"):
        at.KVCache(1, 1, 2).append(x, x[:, :, :2])
    with pytest.raises(AttnlabError, match="k: expected a torch.Tensor"):
        at.KVCache(1, 1, 2).append(np.zeros((1, 1, 1, 2)), x)
    with pytest.raises(ShapeError, match=r"q: expected \(B, H, T, D\) = \(1, H, 3, 2\) with H "
                                         r"a positive multiple of Hkv = 2"):
        at.KVCache(1, 2, 2).attend(torch.zeros(1, 3, 3, 2), torch.zeros(1, 2, 3, 2),
                                   torch.zeros(1, 2, 3, 2))
    with pytest.raises(AttnlabError, match="k: expected a tensor on the cache's device cpu, "
                                           "got meta"):
        at.KVCache(1, 1, 2).append(x.to("meta"), x.to("meta"))
    with pytest.raises(AttnlabError, match="window"):
        at.SlidingWindowKVCache(1, 1, 2, window=0)
    sw = at.SlidingWindowKVCache(1, 1, 2, window=4, dtype=torch.float32)
    before = sw.nbytes
    for _ in range(5):
        sw.append(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    assert sw.nbytes == before and sw.positions.tolist() == [11, 12, 13, 14]


def test_torch_cache_stores_detached_values():
    cache = at.KVCache(1, 1, 2, dtype=torch.float64)
    k = torch.ones(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    q = torch.ones(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    out = cache.attend(q, k, k)
    assert not cache.keys.requires_grad
    out.sum().backward()  # gradients reach the queries of this call
    assert q.grad is not None and k.grad is None


@pytest.mark.parametrize("make", [lambda: at.KVCache(1, 1, 2),
                                  lambda: at.SlidingWindowKVCache(1, 1, 2, window=3)])
def test_refused_calls_under_debug_checks_append_nothing(make):
    cache = make()
    one = torch.ones(1, 1, 2, 2)
    cache.append(one, one)
    nan = torch.full((1, 1, 1, 2), float("nan"))
    with at.debug_checks():
        for call in (lambda: cache.append(nan, one[:, :, :1]),
                     lambda: cache.attend(one[:, :, :1], one[:, :, :1], nan),
                     lambda: cache.attend(nan, one[:, :, :1], one[:, :, :1])):
            with pytest.raises(AttnlabError, match="expected finite values"):
                call()
            assert cache.length == 2
    cache.attend(nan, one[:, :, :1], one[:, :, :1])  # unchecked: whatever torch makes of NaN
    assert cache.length == 3


def test_sliding_window_keys_are_a_copy_in_position_order():
    W = 3
    cache = at.SlidingWindowKVCache(1, 1, 1, window=W, dtype=torch.float64)
    keys = torch.arange(8.0, dtype=torch.float64).reshape(1, 1, 8, 1)
    cache.append(keys[:, :, :5], keys[:, :, :5])
    held = cache.keys
    assert held[0, 0, :, 0].tolist() == [2.0, 3.0, 4.0]
    cache.append(keys[:, :, 5:], keys[:, :, 5:])
    assert held[0, 0, :, 0].tolist() == [2.0, 3.0, 4.0]  # not a view of the ring
    assert cache.keys[0, 0, :, 0].tolist() == [5.0, 6.0, 7.0]


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("T,S,W", [(5, 5, 1), (5, 5, 3), (3, 9, 5), (1, 7, 7), (0, 3, 1),
                                   (6, 2, 3), (9, 9, 21)])
@pytest.mark.parametrize("global_tokens", [None, [0], [1, 4]])
def test_sliding_window_mask_matches_numpy(is_causal, T, S, W, global_tokens):
    if global_tokens is not None and max(global_tokens) >= S:
        global_tokens = [S - 1] if S else None
    expected = attnlab.sliding_window_mask(T, W, is_causal=is_causal, S=S,
                                           global_tokens=global_tokens)
    got = at.sliding_window_mask(T, W, is_causal=is_causal, S=S, global_tokens=global_tokens)
    np.testing.assert_array_equal(got.numpy(), expected)
    as_tensor = None if global_tokens is None else torch.tensor(global_tokens)
    got_t = at.sliding_window_mask(T, W, is_causal=is_causal, S=S, global_tokens=as_tensor)
    np.testing.assert_array_equal(got_t.numpy(), expected)


@pytest.mark.parametrize("call,match", [
    (lambda: at.sliding_window_mask(4, 2, is_causal=False),
     r"^window: a symmetric window \(is_causal=False\) holds the query and \(W - 1\) / 2 keys "
     r"on each side, so W must be odd; got 2 \(use 1 or 3\)$"),
    (lambda: at.sliding_window_mask(4, 0, is_causal=True), r"^window: expected an integer >= 1"),
    (lambda: at.sliding_window_mask(4, 2, is_causal=1), r"^is_causal: expected True or False"),
    (lambda: at.sliding_window_mask(4, 3, is_causal=True, global_tokens=[4]),
     r"^global_tokens: expected positions in \[0, 4\), got \[4\]$"),
    (lambda: at.sliding_window_mask(4, 3, is_causal=True, global_tokens=[1, 1]),
     r"^global_tokens: expected distinct positions, got \[1, 1\]$"),
    (lambda: at.sliding_window_mask(4, 3, is_causal=True, global_tokens=[0.5]),
     r"^global_tokens: expected a 1-D list of integer key positions, got an element of type "
     r"float$"),
    (lambda: at.sliding_window_mask(4, 3, is_causal=True, global_tokens=torch.zeros(1, 1)),
     r"^global_tokens: expected a 1-D list of integer key positions, got torch.float32 \(1, 1\)$"),
])
def test_sliding_window_mask_errors_match_numpy(call, match):
    with pytest.raises(AttnlabError, match=match):
        call()


def test_sliding_window_mask_requires_is_causal_like_numpy():
    with pytest.raises(TypeError, match="is_causal"):
        at.sliding_window_mask(4, 3)  # type: ignore[call-arg]
