"""KV caches against the plain computation over the whole sequence (NumPy; the torch
twins are in tests/torch/test_kv_cache_torch.py), and the slot arithmetic they share.

The plain twin of every cached call is attention over the full sequence written out
here: keys and values repeated per query head (GQA), ``is_causal=True`` and, for the
sliding window, the band mask built in this file from the definition (query p sees
keys p - W + 1 .. p). Decoding schedules: one prefill then one token at a time, and
chunks of mixed sizes, including chunks longer than the window and chunks that wrap
the rolling buffer.

Tolerances: the cached and the full computation take the same dot products over
the same keys, but the products are grouped differently (a query row against the
S cached keys vs. a row of the T x S matrix, and a single decoded token reads
the rolling buffer in slot order, not position order), so sums differ by rounding
only: a few ulps of O(1) values. float64: 1e-12. float32: 1e-5 (the bound the
issue asks for; observed errors are ~1e-7).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import shapes
from attnlab.errors import AttnlabError, ShapeError
from attnlab.fast.kv_cache import KVCache, SlidingWindowKVCache
from attnlab.fast.sparse import sliding_window_mask
from attnlab.nn.multihead import MultiHeadAttention, linear, merge_heads

TOL = {np.float64: {"rtol": 1e-12, "atol": 1e-12}, np.float32: {"rtol": 1e-5, "atol": 1e-5}}


# --------------------------------------------------------------------------- helpers


def band(S: int, window: int | None) -> np.ndarray:  # -> (S, S)
    """Query p may see key j iff j <= p and (no window or j >= p - W + 1)."""
    p = np.arange(S)[:, None]
    j = np.arange(S)[None, :]
    allowed = j <= p
    if window is not None:
        allowed &= j >= p - window + 1
    return allowed


def full_attention(q, k, v, window=None):
    """Plain twin: (B, H, S, D), (B, Hkv, S, D), (B, Hkv, S, Dv) -> (B, H, S, Dv)."""
    G = q.shape[1] // k.shape[1]
    k_all, v_all = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    return attnlab.scaled_dot_product_attention(q, k_all, v_all, band(q.shape[2], window))


def random_qkv(rng, B=2, H=4, Hkv=2, S=23, D=8, Dv=6, dtype=np.float64):
    q = rng.standard_normal((B, H, S, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, S, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Dv)).astype(dtype)
    return q, k, v


def decode(cache, q, k, v, chunks):
    """Feed the sequence to ``cache`` in chunks of the given sizes; concatenate outputs."""
    outs, start = [], 0
    for size in chunks:
        sl = slice(start, start + size)
        outs.append(cache.attend(q[:, :, sl], k[:, :, sl], v[:, :, sl]))
        start += size
    assert start == q.shape[2]
    return np.concatenate(outs, axis=2)


SCHEDULES = {
    "prefill-then-tokens": [9] + [1] * 14,
    "token-by-token": [1] * 23,
    "mixed-chunks": [5, 1, 3, 1, 7, 2, 4],
    "one-shot": [23],
}


# --------------------------------------------------------------------------- full cache


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_cached_equals_full_causal(dtype, heads, schedule):
    H, Hkv = heads
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, H=H, Hkv=Hkv, dtype=dtype)
    cache = KVCache(2, Hkv, 8, 6, capacity=4, dtype=dtype)  # capacity 4: grows 3 times
    out = decode(cache, q, k, v, SCHEDULES[schedule])
    assert out.dtype == dtype and out.shape == (2, H, 23, 6)
    np.testing.assert_allclose(out, full_attention(q, k, v), **TOL[dtype])
    np.testing.assert_array_equal(cache.keys, k)  # stored exactly, in order
    np.testing.assert_array_equal(cache.values, v)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rope", [False, True])
def test_cached_layer_equals_multihead_forward_with_rope(dtype, rope):
    """Project, rotate at the cache's absolute positions, attend, merge: equals
    ``MultiHeadAttention(x, is_causal=True)`` (which places keys at 0 .. S-1)."""
    rng = np.random.default_rng(1)
    mha = MultiHeadAttention.init(8, 32, num_kv_heads=2, rope=rope, seed=3, dtype=dtype)
    x = rng.standard_normal((2, 19, 32)).astype(dtype)
    expected, _ = mha(x, is_causal=True)
    cache = KVCache(2, 2, 4, dtype=dtype)
    outs, start = [], 0
    for size in [6, 1, 1, 4, 1, 6]:
        chunk = x[:, start : start + size]
        q, k, v = mha.project(chunk, chunk)
        if rope:
            positions = cache.next_positions(size)
            np.testing.assert_array_equal(positions, np.arange(start, start + size))
            q, k = mha.rope(q, positions), mha.rope(k, positions)
        outs.append(linear(merge_heads(cache.attend(q, k, v)), mha.Wo, mha.bo))
        start += size
    np.testing.assert_allclose(np.concatenate(outs, axis=1), expected, **TOL[dtype])


def test_rope_positions_matter():
    """Rotating the new token at position 0 instead of its absolute position is wrong:
    the test above would catch a cache that restarted positions."""
    rng = np.random.default_rng(2)
    mha = MultiHeadAttention.init(2, 16, rope=True, seed=0)
    x = rng.standard_normal((1, 6, 16))
    expected = mha(x, is_causal=True)[0][:, -1]
    cache = KVCache(1, 2, 8)
    q, k, v = mha.project(x[:, :5], x[:, :5])
    cache.attend(mha.rope(q, np.arange(5)), mha.rope(k, np.arange(5)), v)
    q, k, v = mha.project(x[:, 5:], x[:, 5:])
    wrong = cache.attend(mha.rope(q, np.arange(1)), mha.rope(k, np.arange(1)), v)
    assert not np.allclose(linear(merge_heads(wrong), mha.Wo, mha.bo)[:, -1], expected)


def test_growth_doubles_and_keeps_contents():
    cache = KVCache(1, 1, 2, capacity=2)
    data = np.arange(2 * 7, dtype=np.float64).reshape(1, 1, 7, 2)
    cache.append(data[:, :, :3], data[:, :, :3])
    assert cache.capacity == 4
    cache.append(data[:, :, 3:], data[:, :, 3:])
    assert cache.capacity == 8 and cache.length == len(cache) == 7
    np.testing.assert_array_equal(cache.keys, data)
    assert cache.nbytes == 2 * 8 * 2 * 8


def test_max_len_is_fixed_and_exceeding_it_is_a_clear_error():
    cache = KVCache(1, 2, 4, max_len=5, dtype=np.float32)
    assert cache.capacity == 5
    x = np.zeros((1, 2, 4, 4), dtype=np.float32)
    q = np.zeros((1, 2, 4, 4), dtype=np.float32)
    cache.attend(q, x, x)
    with pytest.raises(AttnlabError, match=r"max_len = 5.*expected T <= 1 new tokens, got T = 2"):
        cache.attend(q[:, :, :2], x[:, :, :2], x[:, :, :2])
    assert cache.length == 4  # a refused call changes nothing
    cache.attend(q[:, :, :1], x[:, :, :1], x[:, :, :1])  # the last free position still works
    assert cache.length == 5 and cache.capacity == 5
    with pytest.raises(AttnlabError, match="full"):
        cache.append(x[:, :, :1], x[:, :, :1])


def test_views_are_read_only_and_reset_forgets():
    cache = KVCache(1, 1, 2)
    cache.append(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)))
    with pytest.raises(ValueError):
        cache.keys[0, 0, 0, 0] = 5.0
    cache.reset()
    assert cache.length == 0 and cache.keys.shape == (1, 1, 0, 2)
    np.testing.assert_array_equal(cache.next_positions(3), [0, 1, 2])


def test_empty_append_is_a_no_op():
    cache = KVCache(1, 1, 2)
    out = cache.attend(np.zeros((1, 3, 0, 2)), np.zeros((1, 1, 0, 2)), np.zeros((1, 1, 0, 2)))
    assert out.shape == (1, 3, 0, 2) and cache.length == 0


def test_inputs_are_cast_to_the_cache_dtype():
    cache = KVCache(1, 1, 2, dtype=np.float32)
    out = cache.attend(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)))
    assert out.dtype == np.float32 and cache.keys.dtype == np.float32


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 5))),
         r"k: expected \(B, Hkv, T, D\) = \(1, 1, T, 4\), got \(1, 2, 3, 4\)"),
        (lambda c: c.append(np.zeros((1, 1, 3, 4)), np.zeros((1, 1, 2, 5))),
         r"v: expected \(B, Hkv, T, Dv\) = \(1, 1, 3, 5\) to match k, got \(1, 1, 2, 5\)"),
        (lambda c: c.attend(np.zeros((1, 2, 2, 4)), np.zeros((1, 1, 3, 4)), np.zeros((1, 1, 3, 5))),
         r"q: expected \(B, H, T, D\) = \(1, H, 3, 4\)"),
        (lambda c: c.append(np.full((1, 1, 1, 4), np.nan), np.zeros((1, 1, 1, 5))),
         r"k: expected finite values"),
        (lambda c: c.attend(np.zeros((1, 1, 1, 4)), np.zeros((1, 1, 1, 4)),
                            np.zeros((1, 1, 1, 5)), scale=float("inf")),
         r"scale: expected a finite number"),
    ],
    ids=["k-heads", "v-length", "q-length", "nan", "scale"],
)
def test_bad_inputs_name_the_argument(call, message):
    cache = KVCache(1, 1, 4, 5)
    with pytest.raises(AttnlabError, match=message):
        call(cache)
    assert cache.length == 0  # validation happens before anything is written


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch": 0, "num_kv_heads": 1, "head_dim": 2}, "batch: expected an integer >= 1"),
        ({"batch": 1, "num_kv_heads": 1, "head_dim": 2, "max_len": 0}, "max_len"),
        ({"batch": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": np.int32}, "dtype"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(AttnlabError, match=message):
        KVCache(**kwargs)


# --------------------------------------------------------------------------- sliding window


def test_sliding_window_mask_boundary_both_sides():
    """W keys including the current one: p - W + 1 is in, p - W is out, p + 1 is out."""
    S, W = 12, 4
    mask = sliding_window_mask(S, W, is_causal=True, S=S)
    for p in range(S):
        assert mask[p].sum() == min(p + 1, W)
        assert mask[p, p]
        if p - W + 1 >= 0:
            assert mask[p, p - W + 1]
        if p - W >= 0:
            assert not mask[p, p - W]
        if p + 1 < S:
            assert not mask[p, p + 1]
    # bottom-right alignment for T < S, as is_causal
    np.testing.assert_array_equal(sliding_window_mask(3, W, is_causal=True, S=12), mask[-3:])
    np.testing.assert_array_equal(sliding_window_mask(S, S, is_causal=True, S=S), band(S, None))


def visible_positions(out_row: np.ndarray) -> list[int]:
    """With q = 0 the weights are uniform over the visible keys; with v = one-hot
    position, the output is positive exactly at the visible positions."""
    return np.flatnonzero(out_row > 0).tolist()


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize(
    "chunks", [[1] * 13, [4, 1, 1, 7], [2, 5, 6], [13], [3, 3, 3, 3, 1]],
    ids=["tokens", "prefill+tokens+wrap", "wrapping-chunks", "one-shot", "equal-chunks"],
)
def test_rolling_buffer_sees_exactly_w_keys(window, chunks):
    """Reads the visible set off the output: query p sees p - W + 1 .. p, W keys, not W + 1."""
    S = 13
    q = np.zeros((1, 1, S, 2))
    k = np.zeros((1, 1, S, 2))
    v = np.eye(S)[None, None]  # (1, 1, S, Dv = S): value of position j is e_j
    cache = SlidingWindowKVCache(1, 1, 2, S, window=window)
    out = decode(cache, q, k, v, chunks)
    for p in range(S):
        assert visible_positions(out[0, 0, p]) == list(range(max(0, p - window + 1), p + 1))
        np.testing.assert_allclose(out[0, 0, p].sum(), 1.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("window", [1, 4, 7, 40])
@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_sliding_window_equals_full_with_window_mask(dtype, window, schedule):
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, H=4, Hkv=2, dtype=dtype)
    cache = SlidingWindowKVCache(2, 2, 8, 6, window=window, dtype=dtype)
    out = decode(cache, q, k, v, SCHEDULES[schedule])
    np.testing.assert_allclose(out, full_attention(q, k, v, window), **TOL[dtype])
    held = min(23, window)
    np.testing.assert_array_equal(cache.positions, np.arange(23 - held, 23))
    np.testing.assert_array_equal(cache.keys, k[:, :, 23 - held :])
    np.testing.assert_array_equal(cache.values, v[:, :, 23 - held :])


def test_window_at_least_the_length_is_full_causal():
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng)
    out = decode(SlidingWindowKVCache(2, 2, 8, 6, window=23), q, k, v, [7, 1, 15])
    np.testing.assert_allclose(out, full_attention(q, k, v), **TOL[np.float64])


def test_sliding_window_memory_is_o_of_w():
    cache = SlidingWindowKVCache(1, 2, 4, window=8, dtype=np.float32)
    start = cache.nbytes
    assert start == 2 * (1 * 2 * 8 * 4) * 4
    x = np.ones((1, 2, 5, 4), dtype=np.float32)
    for _ in range(20):  # 100 tokens through an 8-slot buffer
        cache.attend(x, x, x)
    assert cache.nbytes == start and cache.length == 100
    np.testing.assert_array_equal(cache.positions, np.arange(92, 100))


def test_sliding_window_holds_the_last_w_keys_in_slot_pos_mod_w():
    W = 5
    cache = SlidingWindowKVCache(1, 1, 1, window=W)
    keys = np.arange(17.0).reshape(1, 1, 17, 1)  # key of position p = p
    for start, size in [(0, 3), (3, 1), (4, 7), (11, 1), (12, 5)]:  # one chunk longer than W
        sl = slice(start, start + size)
        cache.append(keys[:, :, sl], keys[:, :, sl])
        held = range(max(0, cache.length - W), cache.length)
        np.testing.assert_array_equal(cache.positions, np.array(held))
        np.testing.assert_array_equal(cache.keys[0, 0, :, 0], np.array(held, dtype=float))
        for p in held:  # position p lives in slot p mod W
            assert cache._keys[0, 0, p % W, 0] == p


def test_sliding_window_with_rope_follows_absolute_positions():
    """Positions far beyond W: keys are rotated at their absolute positions, not slots."""
    rng = np.random.default_rng(6)
    W = 5
    mha = MultiHeadAttention.init(4, 16, num_kv_heads=2, rope=True, seed=1)
    x = rng.standard_normal((1, 30, 16))
    expected, _ = mha(x, mask=sliding_window_mask(30, W, is_causal=True, S=30), is_causal=True)
    cache = SlidingWindowKVCache(1, 2, 4, window=W)
    outs, start = [], 0
    for size in [11, 1, 1, 8, 1, 1, 6, 1]:
        chunk = x[:, start : start + size]
        q, k, v = mha.project(chunk, chunk)
        positions = cache.next_positions(size)
        q, k = mha.rope(q, positions), mha.rope(k, positions)
        outs.append(linear(merge_heads(cache.attend(q, k, v)), mha.Wo, mha.bo))
        start += size
    np.testing.assert_allclose(np.concatenate(outs, axis=1), expected, **TOL[np.float64])


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(1, 9),
    chunks=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    heads=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
)
def test_any_schedule_any_window(window, chunks, heads):
    H, Hkv = heads
    S = sum(chunks)
    rng = np.random.default_rng(S * 31 + window)
    q, k, v = random_qkv(rng, B=1, H=H, Hkv=Hkv, S=S, D=4, Dv=3)
    out = decode(SlidingWindowKVCache(1, Hkv, 4, 3, window=window), q, k, v, chunks)
    np.testing.assert_allclose(out, full_attention(q, k, v, window), **TOL[np.float64])
    out = decode(KVCache(1, Hkv, 4, 3, capacity=1), q, k, v, chunks)
    np.testing.assert_allclose(out, full_attention(q, k, v), **TOL[np.float64])


def test_sliding_window_errors():
    with pytest.raises(AttnlabError, match="window: expected an integer >= 1, got 0"):
        SlidingWindowKVCache(1, 1, 2, window=0)
    cache = SlidingWindowKVCache(1, 1, 2, window=3)
    with pytest.raises(ShapeError, match="k: expected"):
        cache.append(np.zeros((1, 2, 1, 2)), np.zeros((1, 2, 1, 2)))
    cache.append(np.ones((1, 1, 4, 2)), np.ones((1, 1, 4, 2)))
    cache.reset()
    assert cache.length == 0 and cache.positions.size == 0


@pytest.mark.parametrize("cache", [KVCache(1, 1, 4, dtype=np.float32),
                                   SlidingWindowKVCache(1, 1, 4, window=2, dtype=np.float32)])
def test_values_that_overflow_the_cache_dtype_are_refused(cache):
    """float64 keys of 1e300 were cast to inf in a float32 cache (then NaN out)."""
    huge = np.full((1, 1, 2, 4), 1e300)
    with pytest.raises(AttnlabError, match=r"k: values up to 1e\+300 do not fit the cache's "
                                           "dtype float32"):
        cache.append(huge, np.ones((1, 1, 2, 4)))
    with pytest.raises(AttnlabError, match="v: values up to"):
        cache.attend(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)), huge)
    with pytest.raises(AttnlabError, match="q: values up to"):
        cache.attend(huge, np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)))
    assert cache.length == 0


@pytest.mark.parametrize("make", [lambda: KVCache(1, 1, 4, dtype=np.float32),
                                  lambda: SlidingWindowKVCache(1, 1, 4, window=2,
                                                               dtype=np.float32)])
def test_scores_against_cached_keys_that_would_overflow_are_refused(make):
    cache = make()
    big = np.full((1, 1, 1, 4), 1e20, np.float32)
    cache.append(big, np.ones((1, 1, 1, 4), np.float32))
    small = np.ones((1, 1, 1, 4), np.float32)
    with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
        cache.attend(big, small, small)  # q is huge against the huge key already cached
    cache.reset()  # forgets the huge key too
    out = cache.attend(big, small, small)
    assert np.isfinite(out).all()


# --------------------------------------------------------------------------- slot arithmetic


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 60), st.integers(0, 12), st.integers(1, 12))
def test_ring_segments_cover_each_position_once_in_its_slot(start, count, window):
    """Positions start .. start + count - 1 (count <= W) as at most two slice copies."""
    count = min(count, window)
    segments = shapes.ring_segments(start, start + count, window)
    assert len(segments) <= 2 and sum(n for _, _, n in segments) == count
    covered = []
    for offset, slot, n in segments:
        assert 0 <= slot and slot + n <= window
        covered += [(start + offset + i, slot + i) for i in range(n)]
    assert covered == [(p, p % window) for p in range(start, start + count)]


def test_ring_segments_refuse_more_positions_than_slots():
    with pytest.raises(ValueError, match="5 positions do not fit 4 slots"):
        shapes.ring_segments(0, 5, 4)


@pytest.mark.parametrize("length,window,held", [(0, 3, range(0)), (2, 3, range(0, 2)),
                                                (3, 3, range(0, 3)), (10, 3, range(7, 10))])
def test_held_positions_are_the_last_w(length, window, held):
    assert shapes.held_positions(length, window) == held


@pytest.mark.parametrize("capacity,needed,grown", [(4, 3, 4), (4, 5, 8), (4, 17, 32), (1, 1, 1)])
def test_grown_capacity_doubles_until_it_fits(capacity, needed, grown):
    assert shapes.grown_capacity(capacity, needed) == grown
