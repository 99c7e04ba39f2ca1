"""Attention sinks (``sinks=``) on the KV caches and on varlen, against the plain sdpa with
sinks on the equivalent dense inputs (itself checked against GPT-OSS's eager rule in
test_sinks.py):

- cached decode (prefill, one token at a time, a chunk) == full attention over every key
  held, with the same sinks, at the new queries; left padding gives rows with no key;
- the sliding-window cache == full attention under the window's band;
- varlen == each sequence's sdpa with the same sinks, an empty sequence, a sequence
  with no keys and causal rows that see no key (output 0: a sink takes no value).

Tolerances: float64 1e-12 (the same formula summed in another order); float32 against
the float64 reference 1e-5 (float32 rounding, ~1e-7 relative, over S <= 10 terms of size
O(1) and one softmax).
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.errors import AttnlabError
from attnlab.fast.kv_cache import KVCache, SlidingWindowKVCache
from attnlab.fast.varlen import cu_seqlens_from_lengths, varlen_attention

B, H, HKV, D, DV = 2, 4, 2, 8, 3
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _sequence(seed: int, S: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, S, D))
    k = rng.standard_normal((B, HKV, S, D))
    v = rng.standard_normal((B, HKV, S, DV))
    sinks = rng.standard_normal(H) * 2.0
    return q, k, v, sinks


def _dense(q, k, v, sinks, mask):  # the reference: plain sdpa over every key, float64
    return attnlab.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, enable_gqa=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kv_cache_decode_with_sinks_is_full_attention(dtype):
    S = 8
    q, k, v, sinks = _sequence(0, S)
    real = np.ones((B, S), dtype=bool)
    real[0, :3] = False  # left padding: query 0 of sequence 0 sees no real key
    cache = KVCache(B, HKV, D, DV, max_len=S, dtype=dtype)
    cast = [x.astype(dtype) for x in (q, k, v)]
    pieces = [cache.attend(*(x[:, :, :4] for x in cast), key_padding=real[:, :4],
                           sinks=sinks)]  # prefill 4
    for t in (4, 5):  # decode one at a time
        pieces.append(cache.attend(*(x[:, :, t:t + 1] for x in cast), sinks=sinks))
    pieces.append(cache.attend(*(x[:, :, 6:] for x in cast), sinks=sinks))  # a chunk of 2
    got = np.concatenate(pieces, axis=2)
    causal = np.tril(np.ones((S, S), dtype=bool))
    expected = _dense(q, k, v, sinks, real[:, None, None, :] & causal)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, atol=TOL[dtype], rtol=0)
    assert np.all(got[0, :, 0] == 0.0)  # no real key: all weight on the sink, no value
    # Without appending: the last query again, over the cache as it is.
    again = cache.attend(cast[0][:, :, -1:], sinks=sinks)
    np.testing.assert_allclose(again, expected[:, :, -1:], atol=TOL[dtype], rtol=0)


def test_kv_cache_sinks_change_the_output():  # guards against sinks being dropped
    q, k, v, sinks = _sequence(1, 3)
    with_sinks = KVCache(B, HKV, D, DV, max_len=3).attend(q, k, v, sinks=sinks)
    without = KVCache(B, HKV, D, DV, max_len=3).attend(q, k, v)
    assert np.abs(with_sinks - without).max() > 1e-3


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sliding_window_cache_with_sinks_is_banded_attention(dtype):
    S, W = 7, 3
    q, k, v, sinks = _sequence(2, S)
    cache = SlidingWindowKVCache(B, HKV, D, DV, window=W, dtype=dtype)
    cast = [x.astype(dtype) for x in (q, k, v)]
    pieces = [cache.attend(*(x[:, :, :4] for x in cast), sinks=sinks)]  # a chunk (T > 1)
    for t in range(4, S):  # then one token at a time, through the ring buffer
        pieces.append(cache.attend(*(x[:, :, t:t + 1] for x in cast), sinks=sinks))
    got = np.concatenate(pieces, axis=2)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    band = (j <= i) & (j > i - W)  # the W most recent keys, itself included
    np.testing.assert_allclose(got, _dense(q, k, v, sinks, band), atol=TOL[dtype], rtol=0)


def test_caches_refuse_bad_sinks_before_writing():
    q, k, v, _ = _sequence(3, 2)
    cache = KVCache(B, HKV, D, DV, max_len=4)
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head .*\(4\)"):
        cache.attend(q, k, v, sinks=np.zeros(HKV))  # one per kv head, not per query head
    assert cache.length == 0
    window = SlidingWindowKVCache(B, HKV, D, DV, window=2)
    with pytest.raises(AttnlabError, match="sinks"):
        window.attend(q, k, v, sinks=np.zeros((1, H)))
    assert window.length == 0
    with pytest.raises(AttnlabError, match="sinks"):
        cache.attend(q, k, v, sinks=np.array([0.0, np.nan, 0.0, 0.0]))


# lengths: a causal sequence with more keys than queries, one with no keys, an empty one,
# one with more queries than keys (its first queries see no key)
LENGTHS_Q, LENGTHS_K = [3, 2, 0, 4], [5, 0, 3, 2]


def _packed(seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(LENGTHS_Q), H, D))
    k = rng.standard_normal((sum(LENGTHS_K), HKV, D))
    v = rng.standard_normal((sum(LENGTHS_K), HKV, DV))
    return q, k, v, rng.standard_normal(H) * 2.0


def _per_sequence(q, k, v, sinks, is_causal):  # the reference: sdpa on each sequence alone
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    out = np.zeros((q.shape[0], H, DV))
    for b in range(len(LENGTHS_Q)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if LENGTHS_Q[b] == 0 or LENGTHS_K[b] == 0:
            continue  # no queries, or no keys: the sink alone, output 0
        out[rq] = _dense(*(x[r].transpose(1, 0, 2) for x, r in ((q, rq), (k, rk), (v, rk))),
                         sinks, None if not is_causal else np.tril(
                             np.ones((LENGTHS_Q[b], LENGTHS_K[b]), dtype=bool),
                             LENGTHS_K[b] - LENGTHS_Q[b])).transpose(1, 0, 2)
    return out


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_varlen_with_sinks_is_per_sequence_sdpa(dtype, is_causal):
    q, k, v, sinks = _packed(4)
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    got = varlen_attention(*(x.astype(dtype) for x in (q, k, v)), cu_q, cu_k, 4, 5,
                           is_causal=is_causal, sinks=sinks)
    expected = _per_sequence(q, k, v, sinks, is_causal)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, atol=TOL[dtype], rtol=0)
    assert np.all(got[3:5] == 0.0)  # the sequence with no keys
    if is_causal:
        assert np.all(got[5:7] == 0.0)  # queries 0, 1 of the last sequence see no key
    plain = varlen_attention(q, k, v, cu_q, cu_k, 4, 5, is_causal=is_causal)
    assert np.abs(plain - expected).max() > 1e-3  # the sinks did something


def test_varlen_refuses_bad_sinks():
    q, k, v, _ = _packed(5)
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head .*\(4\)"):
        varlen_attention(q, k, v, cu_q, cu_k, 4, 5, sinks=np.zeros(HKV))


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_varlen_with_sinks_forward_and_backward(is_causal):
    """flash varlen == plain varlen (out) and each sequence's sdpa (lse, every gradient,
    the sinks' summed over the sequences), float64, 1e-12."""
    from attnlab.backward import sdpa_backward
    from attnlab.fast.varlen import flash_varlen_attention, flash_varlen_attention_backward

    q, k, v, sinks = _packed(7)
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    out, lse = flash_varlen_attention(q, k, v, cu_q, cu_k, 4, 5, is_causal=is_causal,
                                      sinks=sinks, return_lse=True, block_q=2, block_k=2)
    np.testing.assert_allclose(out, _per_sequence(q, k, v, sinks, is_causal), atol=1e-12,
                               rtol=0)
    dout = np.random.default_rng(8).standard_normal(out.shape)
    grads = flash_varlen_attention_backward(q, k, v, out, lse, dout, cu_q, cu_k, 4, 5,
                                            is_causal=is_causal, sinks=sinks, block_q=2,
                                            block_k=2)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dsinks = np.zeros(H)
    for b, (T, S) in enumerate(zip(LENGTHS_Q, LENGTHS_K, strict=True)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if T == 0 or S == 0:  # lse is the sink's logit alone; no gradient flows
            np.testing.assert_array_equal(lse[:, rq], np.broadcast_to(sinks[:, None], (H, T)))
            continue
        mask = np.tril(np.ones((T, S), dtype=bool), S - T) if is_causal else None
        args = [x[r].transpose(1, 0, 2) for x, r in ((q, rq), (k, rk), (v, rk))]
        _, ref_lse = attnlab.scaled_dot_product_attention(*args, mask, sinks=sinks,
                                                          enable_gqa=True, return_lse=True)
        np.testing.assert_allclose(lse[:, rq], ref_lse, atol=1e-12, rtol=0)
        ref = sdpa_backward(*args, dout[rq].transpose(1, 0, 2), mask, sinks=sinks,
                            enable_gqa=True)
        dq[rq], dk[rk], dv[rk] = (g.transpose(1, 0, 2) for g in (ref.dq, ref.dk, ref.dv))
        dsinks += ref.dsinks
    for got, expected in zip(grads, (dq, dk, dv, dsinks), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-12, rtol=0)
    assert np.abs(grads.dsinks).max() > 1e-3  # the sinks' gradient is not trivially 0
