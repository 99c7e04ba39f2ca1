"""KV caches as inference servers use them, against the full forward.

The plain twin of every cached call is :func:`scaled_dot_product_attention`
over the whole sequence, written out here: keys and values repeated per query
head (GQA), the bottom-right causal rule, the padding of left-padded prompts as
a key mask; for the paged cache, each sequence alone.

Tolerances: the cached and the full computation take the same dot products over
the same keys, grouped differently, so they differ by rounding only: float64
1e-12, float32 1e-5 (observed ~3e-7). float16 / bfloat16 storage is compared
with the full forward in float32 on the same rounded keys and values (what the
cache holds), so 1e-5 again. Block reuse is checked for exact equality: a
previous owner's keys left in a block must not change a single bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import (
    AttnlabError,
    KVCache,
    PagedKVCache,
    ShapeError,
    SlidingWindowKVCache,
    scaled_dot_product_attention,
)

TOL = {np.float64: 1e-12, np.float32: 1e-5}


def full(q, k, v, real=None, is_causal=True):
    """Plain twin: q (B, H, S, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), real (B, S)
    -> (B, H, S, Dv)."""
    G = q.shape[1] // k.shape[1]
    mask = None if real is None else real[:, None, None, :]
    return scaled_dot_product_attention(q, np.repeat(k, G, axis=1), np.repeat(v, G, axis=1),
                                        mask, is_causal=is_causal)


def _data(B=3, H=4, Hkv=2, S=14, D=8, Dv=6, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, S, D)).astype(dtype),
            rng.standard_normal((B, Hkv, S, D)).astype(dtype),
            rng.standard_normal((B, Hkv, S, Dv)).astype(dtype))


# ------------------------------------------------------- ragged, left-padded prompts


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_left_padded_prompts_then_decoding_equal_the_full_forward(dtype):
    q, k, v = _data(dtype=dtype)
    prompt = 6
    real = np.ones((3, 14), dtype=bool)
    real[0, :4] = False  # row 0: a 2-token prompt, left-padded by 4
    real[1, :1] = False  # row 1: 5 tokens
    cache = KVCache(3, 2, 8, 6, capacity=4, dtype=dtype)  # grows twice on the way
    outs = [cache.attend(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt],
                         key_padding=real[:, :prompt])]
    assert cache.lengths.tolist() == [2, 5, 6]  # each row's next RoPE position
    for t in range(prompt, 14):
        outs.append(cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    out = np.concatenate(outs, axis=2)
    expected = full(q, k, v, real)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, expected, atol=TOL[dtype], rtol=0)
    assert (out[0, :, :4] == 0).all()  # padding queries see no real key: 0, not NaN
    np.testing.assert_array_equal(cache.key_padding, real)
    assert cache.lengths.tolist() == [10, 13, 14]


@pytest.mark.parametrize("is_causal", [True, False])
def test_left_padded_chunks_with_and_without_causality(is_causal):
    q, k, v = _data()
    real = np.ones((3, 14), dtype=bool)
    real[0, :4] = False
    cache = KVCache(3, 2, 8, 6)
    cache.append(k[:, :, :6], v[:, :, :6], key_padding=real[:, :6])
    out = cache.attend(q[:, :, 6:10], k[:, :, 6:10], v[:, :, 6:10], is_causal=is_causal)
    expected = full(q[:, :, :10], k[:, :, :10], v[:, :, :10], real[:, :10], is_causal)
    np.testing.assert_allclose(out, expected[:, :, 6:], atol=1e-12, rtol=0)
    alone = cache.attend(q[:, :, 9:10], is_causal=is_causal)  # one query, no append
    np.testing.assert_allclose(alone, expected[:, :, 9:], atol=1e-12, rtol=0)


@pytest.mark.parametrize("is_causal", [True, False])
def test_window_and_softcap_with_left_padding(is_causal):
    q, k, v = _data()
    q, k = 3 * q, 3 * k  # scores past the soft cap
    real = np.ones((3, 14), dtype=bool)
    real[1, :3] = False
    options = {"window": (4, 0) if is_causal else (4, 2), "softcap": 2.0}
    cache = KVCache(3, 2, 8, 6)
    cache.append(k[:, :, :8], v[:, :, :8], key_padding=real[:, :8])
    out = cache.attend(q[:, :, 8:12], k[:, :, 8:12], v[:, :, 8:12], is_causal=is_causal,
                       **options)
    G = 2
    expected = scaled_dot_product_attention(
        q[:, :, :12], np.repeat(k[:, :, :12], G, 1), np.repeat(v[:, :, :12], G, 1),
        real[:, None, None, :12], is_causal=is_causal, **options)[:, :, 8:]
    np.testing.assert_allclose(out, expected, atol=1e-12, rtol=0)
    alone = cache.attend(q[:, :, 11:12], is_causal=is_causal, **options)  # no append
    np.testing.assert_allclose(alone, expected[:, :, 3:], atol=1e-12, rtol=0)


def test_padding_keys_have_no_influence():
    q, k, v = _data()
    real = np.ones((3, 14), dtype=bool)
    real[:, :3] = False
    outs = []
    for fill in (0.0, 1e3):
        k2, v2 = k.copy(), v.copy()
        k2[:, :, :3], v2[:, :, :3] = fill, fill
        cache = KVCache(3, 2, 8, 6)
        cache.append(k2[:, :, :8], v2[:, :, :8], key_padding=real[:, :8])
        outs.append(cache.attend(q[:, :, 8:], k2[:, :, 8:], v2[:, :, 8:]))
    np.testing.assert_array_equal(outs[0], outs[1])


# ------------------------------------------- attending without appending, non-causal


@pytest.mark.parametrize("is_causal", [True, False])
def test_attend_without_appending(is_causal):
    q, k, v = _data()
    cache = KVCache(3, 2, 8, 6)
    cache.append(k, v)
    out = cache.attend(q[:, :, -5:], is_causal=is_causal)  # the last 5 positions' queries
    expected = full(q, k, v, is_causal=is_causal)[:, :, -5:]
    np.testing.assert_allclose(out, expected, atol=1e-12, rtol=0)
    assert cache.length == 14  # nothing appended
    # More queries than keys, causal: the first ones see nothing (bottom-right), as the plain path.
    more = cache.attend(np.concatenate([q, q], axis=2), is_causal=is_causal)
    np.testing.assert_allclose(more, full(np.concatenate([q, q], axis=2), k, v,
                                          is_causal=is_causal), atol=1e-12, rtol=0)


def test_multi_token_non_causal_chunks():
    # A prefix of 5 tokens attended both ways (a prefix-LM), then causal decoding.
    q, k, v = _data()
    cache = KVCache(3, 2, 8, 6)
    prefix = cache.attend(q[:, :, :5], k[:, :, :5], v[:, :, :5], is_causal=False)
    np.testing.assert_allclose(prefix, full(q[:, :, :5], k[:, :, :5], v[:, :, :5],
                                            is_causal=False), atol=1e-12, rtol=0)
    chunk = cache.attend(q[:, :, 5:9], k[:, :, 5:9], v[:, :, 5:9], is_causal=False)
    np.testing.assert_allclose(chunk, full(q[:, :, :9], k[:, :, :9], v[:, :, :9],
                                           is_causal=False)[:, :, 5:], atol=1e-12, rtol=0)


# ---------------------------------------------------------- float16 / bfloat16 storage


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_computes_in_float32(dtype):
    if dtype == "bfloat16":
        # The NumPy-only tier runs without the optional ml_dtypes (the bfloat16 extra).
        pytest.importorskip("ml_dtypes")
    q, k, v = _data(dtype=np.float32)
    cache = KVCache(3, 2, 8, 6, dtype=dtype)
    reference = KVCache(3, 2, 8, 6, dtype=np.float32)
    assert cache.dtype.name == dtype and cache.compute_dtype == np.float32
    out = np.concatenate([cache.attend(q[:, :, :6], k[:, :, :6], v[:, :, :6])] + [
        cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(6, 14)
    ], axis=2)
    reference.append(k, v)
    assert out.dtype == np.float32 and cache.keys.dtype.name == dtype
    assert cache.nbytes * 2 == reference.nbytes
    held_k, held_v = (a.astype(np.float32) for a in (cache.keys, cache.values))
    np.testing.assert_array_equal(held_k, k.astype(dtype).astype(np.float32))  # rounded once
    np.testing.assert_allclose(out, full(q, held_k, held_v), atol=1e-5, rtol=0)
    paged = PagedKVCache(16, 4, 2, 8, 6, dtype=dtype)
    ids = [paged.add_sequence() for _ in range(3)]
    out = paged.attend(ids, q, k, v)
    np.testing.assert_allclose(out, full(q, held_k, held_v), atol=1e-5, rtol=0)


def test_sliding_window_cache_stores_float16_too():
    q, k, v = _data(dtype=np.float32)
    cache = SlidingWindowKVCache(3, 2, 8, 6, window=5, dtype=np.float16)
    out = np.concatenate([cache.attend(q[:, :, :6], k[:, :, :6], v[:, :, :6])] + [
        cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(6, 14)
    ], axis=2)
    held_k, held_v = (a.astype(np.float16).astype(np.float32) for a in (k, v))
    p, j = np.arange(14)[:, None], np.arange(14)[None, :]
    band = (j <= p) & (j > p - 5)  # W = 5 keys including itself
    expected = scaled_dot_product_attention(q, np.repeat(held_k, 2, 1), np.repeat(held_v, 2, 1),
                                            band)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=0)


def test_half_storage_refuses_values_past_its_range():
    cache = KVCache(1, 1, 2, dtype="float16")
    big = np.full((1, 1, 1, 2), 1e5, dtype=np.float32)
    with pytest.raises(AttnlabError, match="k: values up to 1e\\+05 do not fit the cache's dtype "
                                           "float16"):
        cache.append(big, big)
    with pytest.raises(AttnlabError, match="dtype: expected one of float16, bfloat16"):
        KVCache(1, 1, 2, dtype=np.int32)


# ------------------------------------------------------------------------ paged cache


def _paged_schedule(dtype, block_size=4, seed=1):
    """Five sequences of different lengths, appended in chunks, attended in ragged batches."""
    rng = np.random.default_rng(seed)
    H, Hkv, D, Dv = 4, 2, 8, 6
    cache = PagedKVCache(num_blocks=64, block_size=block_size, num_kv_heads=Hkv, head_dim=D,
                         value_head_dim=Dv, dtype=dtype)
    ids = [cache.add_sequence() for _ in range(5)]
    seen = {s: [np.zeros((0, H, D)), np.zeros((Hkv, 0, D)), np.zeros((Hkv, 0, Dv))] for s in ids}
    checks = []
    steps = [(ids, 3), (ids[:2], 5), (ids[1:4], 1), (ids, 2), ([ids[4], ids[0]], 7),
             (ids, 1), (ids, 1)]
    for batch, T in steps:
        q = rng.standard_normal((len(batch), H, T, D)).astype(dtype)
        k = rng.standard_normal((len(batch), Hkv, T, D)).astype(dtype)
        v = rng.standard_normal((len(batch), Hkv, T, Dv)).astype(dtype)
        out = cache.attend(batch, q, k, v)
        for row, s in enumerate(batch):
            seen[s][0] = q[row]
            seen[s][1] = np.concatenate([seen[s][1], k[row]], axis=1)
            seen[s][2] = np.concatenate([seen[s][2], v[row]], axis=1)
            S = seen[s][1].shape[1]
            q_full = np.zeros((1, H, S, D), dtype)
            q_full[0, :, S - T:] = q[row]
            expected = full(q_full, seen[s][1][None], seen[s][2][None])[0, :, S - T:]
            checks.append((out[row], expected))
    return cache, ids, seen, checks


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_cache_equals_each_sequence_alone(dtype, block_size):
    cache, ids, seen, checks = _paged_schedule(dtype, block_size)
    for out, expected in checks:
        assert out.dtype == dtype
        np.testing.assert_allclose(out, expected, atol=TOL[dtype], rtol=0)
    for s in ids:
        np.testing.assert_array_equal(cache.keys(s), seen[s][1].astype(dtype))
        assert cache.length(s) == seen[s][1].shape[1]
        assert len(cache.block_table(s)) == -(-cache.length(s) // block_size)


def test_paged_attend_without_appending_and_non_causal():
    cache, ids, seen, _ = _paged_schedule(np.float64)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 3, 8))
    for is_causal in (True, False):
        out = cache.attend([ids[3], ids[1]], q, is_causal=is_causal)
        for row, s in enumerate((ids[3], ids[1])):
            S = cache.length(s)
            q_full = np.zeros((1, 4, S, 8))
            q_full[0, :, S - 3:] = q[row]
            expected = full(q_full, seen[s][1][None], seen[s][2][None],
                            is_causal=is_causal)[0, :, S - 3:]
            np.testing.assert_allclose(out[row], expected, atol=1e-12, rtol=0)


def test_freed_blocks_are_reused_without_leaking_the_old_keys():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, 1, 4))
    k_b, v_b = rng.standard_normal((2, 1, 1, 6, 4))  # sequence B: 6 tokens
    outs, stale = [], []
    for scale in (1.0, 1000.0):  # two different previous owners
        cache = PagedKVCache(num_blocks=4, block_size=4, num_kv_heads=1, head_dim=4)
        a = cache.add_sequence()
        k_a = scale * rng.standard_normal((1, 1, 15, 4))
        cache.append([a], k_a, k_a)  # A: 15 tokens, all 4 blocks
        assert cache.num_free_blocks == 0
        old_blocks = cache.block_table(a).tolist()
        cache.free(a)
        b = cache.add_sequence()
        cache.append([b], k_b, v_b)  # B: 6 tokens in 2 reused blocks
        out = cache.attend([b], q)  # its last position's query
        assert set(cache.block_table(b).tolist()) <= set(old_blocks)
        # A's keys are still in B's second block, past B's length: present, not read.
        block = cache.block_table(b)[1]
        stale.append(cache._keys[block, 0, 2:].copy())
        np.testing.assert_array_equal(stale[-1], k_a[0, 0, 4 * old_blocks.index(block) + 2:
                                                       4 * old_blocks.index(block) + 4])
        outs.append(out)
    assert not np.array_equal(stale[0], stale[1])
    np.testing.assert_array_equal(outs[0], outs[1])  # not a bit changed by the old owner
    fresh = PagedKVCache(num_blocks=4, block_size=4, num_kv_heads=1, head_dim=4)
    fresh_id = fresh.add_sequence()
    fresh.append([fresh_id], k_b, v_b)
    np.testing.assert_array_equal(outs[0], fresh.attend([fresh_id], q))
    q_full = np.zeros((1, 2, 6, 4))
    q_full[0, :, -1] = q[0, :, 0]
    np.testing.assert_allclose(outs[0][0, :, 0], full(q_full, k_b, v_b)[0, :, -1],
                               atol=1e-12, rtol=0)


def test_paged_cache_errors_leave_it_unchanged():
    cache = PagedKVCache(num_blocks=3, block_size=2, num_kv_heads=1, head_dim=2)
    a, b = cache.add_sequence(), cache.add_sequence()
    x = np.ones((2, 1, 2, 2))
    cache.append([a, b], x, x)  # two blocks
    with pytest.raises(AttnlabError, match="k: the cache needs 2 more blocks but has 1 free "
                                           "of 3; free finished sequences"):
        cache.append([a, b], x, x)
    assert (cache.length(a), cache.length(b), cache.num_free_blocks) == (2, 2, 1)
    with pytest.raises(AttnlabError, match="sequences: 7 is not a sequence of this cache"):
        cache.attend([7], np.ones((1, 1, 1, 2)))
    cache.free(a)
    with pytest.raises(AttnlabError, match=f"sequences: {a} is not a sequence of this cache"):
        cache.length(a)
    with pytest.raises(AttnlabError, match="sequences: expected distinct ids"):
        cache.attend([b, b], np.ones((2, 1, 1, 2)))
    with pytest.raises(AttnlabError, match="sequences: expected one id per batch row of q, "
                                           "B = 2, got 1"):
        cache.attend([b], np.ones((2, 1, 1, 2)))
    with pytest.raises(AttnlabError, match="k, v: expected both"):
        cache.attend([b], np.ones((1, 1, 1, 2)), k=np.ones((1, 1, 1, 2)))
    with pytest.raises(ShapeError, match="k: expected"):
        cache.append([b], np.ones((1, 2, 1, 2)), np.ones((1, 2, 1, 2)))


def test_kv_cache_argument_errors():
    cache = KVCache(2, 1, 2)
    x = np.ones((2, 1, 3, 2))
    with pytest.raises(AttnlabError, match="k, v: expected both"):
        cache.attend(x, x)
    with pytest.raises(AttnlabError, match="key_padding: marks the padding of new tokens"):
        cache.attend(x, key_padding=np.ones((2, 3), bool))
    with pytest.raises(ShapeError, match=r"key_padding: expected bool \(2, 3\)"):
        cache.append(x, x, key_padding=np.ones((2, 4), bool))
    with pytest.raises(AttnlabError, match="key_padding: expected a bool array"):
        cache.append(x, x, key_padding=np.ones((2, 3)))
    with pytest.raises(AttnlabError, match="is_causal: expected True or False"):
        cache.attend(x, x, x, is_causal="yes")
    assert cache.length == 0  # nothing was appended by the refused calls


def test_block_allocator_refuses_a_block_given_back_twice_or_outside_the_pool():
    # release() used to take a block back twice (then hand out [0, 1, 0, 1]: one
    # block to two sequences) and to take ids the pool never had.
    from attnlab.fast.paged_cache import BlockAllocator

    pool = BlockAllocator(4)
    taken = pool.allocate(2, "k")
    pool.release(taken)
    with pytest.raises(AttnlabError, match="blocks: expected blocks in use, got 1, which is "
                                           r"already free \(given back twice\)") as raised:
        pool.release([1])
    assert raised.value.message.render("zh").startswith("blocks：需要正在使用的块，实际得到 1")
    with pytest.raises(AttnlabError, match="blocks: expected blocks in use, got 3"):
        pool.release([3])  # never handed out
    for bad in (4, -1, 2.0, True):
        with pytest.raises(AttnlabError, match=r"blocks: expected block ids in 0\.\.3 "):
            pool.release([bad])
    pool.allocate(4, "k")
    with pytest.raises(AttnlabError, match="got 2, which is already free"):
        pool.release([2, 2])  # twice in one call: refused before any is taken back
    assert pool.num_free == 0
    pool.release([0, 1, 2, 3])
    assert sorted(pool.allocate(4, "k")) == [0, 1, 2, 3]
