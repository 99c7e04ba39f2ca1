"""Attention sinks (``sinks=``) on attnlab.torch's KV caches and varlen, against the NumPy
core's plain sdpa with sinks on the equivalent dense inputs (checked against GPT-OSS's
eager rule in tests/core/test_sinks.py), and the sinks' gradient through varlen against
central finite differences (torch.autograd.gradcheck).

Tolerances: float64 1e-12 (the same formula summed in another order); float32 against
the float64 reference 1e-5 (float32 rounding, ~1e-7 relative, over S <= 10 terms of size
O(1) and one softmax); gradcheck's defaults (eps 1e-6, atol 1e-5) in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError
from attnlab.fast.varlen import cu_seqlens_from_lengths

B, H, HKV, D, DV = 2, 4, 2, 8, 3
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _sequence(seed: int, S: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, S, D)), rng.standard_normal((B, HKV, S, D)),
            rng.standard_normal((B, HKV, S, DV)), rng.standard_normal(H) * 2.0)


def _dense(q, k, v, sinks, mask):  # the reference: NumPy plain sdpa, float64
    return attnlab.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, enable_gqa=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_kv_cache_decode_with_sinks_is_full_attention(dtype):
    S = 8
    q, k, v, sinks = _sequence(0, S)
    real = np.ones((B, S), dtype=bool)
    real[0, :3] = False  # left padding: query 0 of sequence 0 sees no real key
    cache = at.KVCache(B, HKV, D, DV, max_len=S, dtype=dtype)
    qt, kt, vt = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
    sinks_t = torch.from_numpy(sinks).to(dtype)
    pieces = [cache.attend(qt[:, :, :4], kt[:, :, :4], vt[:, :, :4],
                           key_padding=torch.from_numpy(real[:, :4]), sinks=sinks_t)]
    for t in (4, 5):
        pieces.append(cache.attend(qt[:, :, t:t + 1], kt[:, :, t:t + 1], vt[:, :, t:t + 1],
                                   sinks=sinks_t))
    pieces.append(cache.attend(qt[:, :, 6:], kt[:, :, 6:], vt[:, :, 6:], sinks=sinks_t))
    got = torch.cat(pieces, dim=2)
    expected = _dense(q, k, v, sinks, real[:, None, None, :] & np.tril(np.ones((S, S), bool)))
    assert got.dtype == dtype
    np.testing.assert_allclose(got.double().numpy(), expected, atol=TOL[dtype], rtol=0)
    assert bool((got[0, :, 0] == 0).all())  # no real key: all weight on the sink
    again = cache.attend(qt[:, :, -1:], sinks=sinks_t)  # without appending
    np.testing.assert_allclose(again.double().numpy(), expected[:, :, -1:], atol=TOL[dtype],
                               rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_sliding_window_cache_with_sinks_is_banded_attention(dtype):
    S, W = 7, 3
    q, k, v, sinks = _sequence(2, S)
    cache = at.SlidingWindowKVCache(B, HKV, D, DV, window=W, dtype=dtype)
    qt, kt, vt, st = (torch.from_numpy(x).to(dtype) for x in (q, k, v, sinks))
    pieces = [cache.attend(qt[:, :, :4], kt[:, :, :4], vt[:, :, :4], sinks=st)]
    for t in range(4, S):
        pieces.append(cache.attend(qt[:, :, t:t + 1], kt[:, :, t:t + 1], vt[:, :, t:t + 1],
                                   sinks=st))
    got = torch.cat(pieces, dim=2)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    expected = _dense(q, k, v, sinks, (j <= i) & (j > i - W))
    np.testing.assert_allclose(got.double().numpy(), expected, atol=TOL[dtype], rtol=0)


def test_torch_caches_refuse_bad_sinks_before_writing():
    q, k, v, _ = (torch.from_numpy(x) for x in _sequence(3, 2))
    cache = at.KVCache(B, HKV, D, DV, max_len=4, dtype=torch.float64)
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head .*\(4\)"):
        cache.attend(q, k, v, sinks=torch.zeros(HKV, dtype=torch.float64))
    assert cache.length == 0
    window = at.SlidingWindowKVCache(B, HKV, D, DV, window=2, dtype=torch.float64)
    with pytest.raises(AttnlabError, match="sinks"):
        window.attend(q, k, v, sinks=torch.zeros(1, H, dtype=torch.float64))
    assert window.length == 0


LENGTHS_Q, LENGTHS_K = [3, 2, 0, 4], [5, 0, 3, 2]  # as in tests/core/test_sinks_cache_varlen.py


def _packed(seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((sum(LENGTHS_Q), H, D)),
            rng.standard_normal((sum(LENGTHS_K), HKV, D)),
            rng.standard_normal((sum(LENGTHS_K), HKV, DV)), rng.standard_normal(H) * 2.0)


def _per_sequence(q, k, v, sinks, is_causal):  # sdpa on each sequence alone (NumPy)
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    out = np.zeros((q.shape[0], H, DV))
    for b, (T, S) in enumerate(zip(LENGTHS_Q, LENGTHS_K, strict=True)):
        if T == 0 or S == 0:
            continue  # no queries, or the sink alone: output 0
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        mask = np.tril(np.ones((T, S), dtype=bool), S - T) if is_causal else None
        out[rq] = _dense(q[rq].transpose(1, 0, 2), k[rk].transpose(1, 0, 2),
                         v[rk].transpose(1, 0, 2), sinks, mask).transpose(1, 0, 2)
    return out


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_varlen_with_sinks_is_per_sequence_sdpa(dtype, is_causal):
    q, k, v, sinks = _packed(4)
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    got = at.varlen_attention(*(torch.from_numpy(x).to(dtype) for x in (q, k, v)), cu_q, cu_k,
                              4, 5, is_causal=is_causal,
                              sinks=torch.from_numpy(sinks).to(dtype))
    expected = _per_sequence(q, k, v, sinks, is_causal)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.double().numpy(), expected, atol=TOL[dtype], rtol=0)
    assert bool((got[3:5] == 0).all())  # the sequence with no keys
    numpy_twin = attnlab.fast.varlen.varlen_attention(q, k, v, cu_q, cu_k, 4, 5,
                                                      is_causal=is_causal, sinks=sinks)
    np.testing.assert_allclose(got.double().numpy(), numpy_twin, atol=TOL[dtype], rtol=0)


def test_torch_varlen_sink_gradients_match_finite_differences():
    q, k, v, sinks = (torch.from_numpy(x) for x in _packed(6))
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]

    def run(q_, k_, v_, s_):
        return at.varlen_attention(q_, k_, v_, cu_q, cu_k, 4, 5, is_causal=True, sinks=s_)

    assert torch.autograd.gradcheck(run, tuple(leaves))


def test_torch_varlen_refuses_bad_sinks():
    q, k, v, _ = (torch.from_numpy(x) for x in _packed(5))
    cu_q, cu_k = cu_seqlens_from_lengths(LENGTHS_Q), cu_seqlens_from_lengths(LENGTHS_K)
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head .*\(4\)"):
        at.varlen_attention(q, k, v, cu_q, cu_k, 4, 5, sinks=torch.zeros(HKV))
