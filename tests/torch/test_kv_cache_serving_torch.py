"""attnlab.torch's serving caches (left padding, no-append and non-causal attends, the
paged cache) against their NumPy twins, call for call.

The NumPy twins are checked against the full forward in tests/core/test_kv_cache_serving.py;
here both twins run the same schedule. Tolerances: float64 1e-12 (torch's fused
kernel and NumPy sum the same products in another order); the block tables and
held keys must be identical (both share the free list and copy keys exactly).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError


def _data(seed=0, B=3, H=4, Hkv=2, S=14, D=8, Dv=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, S, D)), rng.standard_normal((B, Hkv, S, D)),
            rng.standard_normal((B, Hkv, S, Dv)))


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def test_left_padding_no_append_and_non_causal_match_the_numpy_twin():
    q, k, v = _data()
    real = np.ones((3, 14), dtype=bool)
    real[0, :4] = False
    real[2, :2] = False
    ours = at.KVCache(3, 2, 8, 6, capacity=4, dtype=torch.float64)
    twin = attnlab.KVCache(3, 2, 8, 6, capacity=4)
    calls = [
        (slice(0, 6), {"key_padding": real[:, :6]}),
        (slice(6, 7), {}),
        (slice(7, 10), {"is_causal": False}),
        (slice(10, 11), {}),
        (slice(11, 13), {"softcap": 2.0, "window": (3, 0)}),
    ]
    for rows, options in calls:
        torch_options = {n: _t(o) if isinstance(o, np.ndarray) else o for n, o in options.items()}
        a = ours.attend(_t(q[:, :, rows]), _t(k[:, :, rows]), _t(v[:, :, rows]), **torch_options)
        b = twin.attend(q[:, :, rows], k[:, :, rows], v[:, :, rows], **options)
        np.testing.assert_allclose(a.numpy(), b, atol=1e-12, rtol=0)
    for is_causal in (True, False):
        a = ours.attend(_t(q[:, :, :4]), is_causal=is_causal)
        b = twin.attend(q[:, :, :4], is_causal=is_causal)
        np.testing.assert_allclose(a.numpy(), b, atol=1e-12, rtol=0)
    np.testing.assert_array_equal(ours.key_padding.numpy(), twin.key_padding)
    assert ours.lengths.tolist() == twin.lengths.tolist() == [9, 13, 11]
    assert ours.length == twin.length == 13


def test_paged_cache_matches_the_numpy_twin():
    rng = np.random.default_rng(2)
    ours = at.PagedKVCache(32, 4, 2, 8, 6, dtype=torch.float64)
    twin = attnlab.PagedKVCache(32, 4, 2, 8, 6)
    ids = [ours.add_sequence() for _ in range(4)]
    assert ids == [twin.add_sequence() for _ in range(4)]
    steps = [(ids, 3, True), (ids[:2], 5, True), (ids[1:], 1, True), (ids, 2, False),
             ([ids[3], ids[0]], 6, True)]
    for batch, T, is_causal in steps:
        q = rng.standard_normal((len(batch), 4, T, 8))
        k = rng.standard_normal((len(batch), 2, T, 8))
        v = rng.standard_normal((len(batch), 2, T, 6))
        a = ours.attend(batch, _t(q), _t(k), _t(v), is_causal=is_causal)
        b = twin.attend(batch, q, k, v, is_causal=is_causal)
        np.testing.assert_allclose(a.numpy(), b, atol=1e-12, rtol=0)
    ours.free(ids[1])
    twin.free(ids[1])
    new = ours.add_sequence()
    assert new == twin.add_sequence()
    x = rng.standard_normal((1, 2, 9, 8))
    ours.append([new], _t(x), _t(x[..., :6]))
    twin.append([new], x, x[..., :6])
    for s in (*ids[:1], *ids[2:], new):
        assert ours.block_table(s).tolist() == twin.block_table(s).tolist()
        assert ours.length(s) == twin.length(s)
        np.testing.assert_array_equal(ours.keys(s).numpy(), twin.keys(s))
    q = rng.standard_normal((2, 4, 2, 8))
    np.testing.assert_allclose(ours.attend([new, ids[0]], _t(q)).numpy(),
                               twin.attend([new, ids[0]], q), atol=1e-12, rtol=0)
    assert ours.num_free_blocks == twin.num_free_blocks


@pytest.mark.parametrize("cache", ["numpy", "torch"])
def test_paged_errors_are_the_same(cache):
    make = attnlab.PagedKVCache if cache == "numpy" else at.PagedKVCache
    wrap = (lambda a: a) if cache == "numpy" else _t
    c = make(3, 2, 1, 2)
    a, b = c.add_sequence(), c.add_sequence()
    x = wrap(np.ones((2, 1, 2, 2)))
    c.append([a, b], x, x)
    with pytest.raises(AttnlabError, match="k: the cache needs 2 more blocks but has 1 free"):
        c.append([a, b], x, x)
    with pytest.raises(AttnlabError, match="sequences: expected distinct ids"):
        c.attend([a, a], wrap(np.ones((2, 1, 1, 2))))
    c.free(a)
    with pytest.raises(AttnlabError, match=f"sequences: {a} is not a sequence of this cache"):
        c.attend([a], wrap(np.ones((1, 1, 1, 2))))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_matches_the_numpy_twin(dtype):
    # Both round the keys and values to the storage dtype (round to nearest even: the
    # held keys must be identical) and compute in float32: 1e-6, float32 rounding in
    # another order.
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    q, k, v = (a.astype(np.float32) for a in _data())
    ours = at.KVCache(3, 2, 8, 6, dtype=getattr(torch, dtype))
    twin = attnlab.KVCache(3, 2, 8, 6, dtype=dtype)
    paged, paged_twin = at.PagedKVCache(16, 4, 2, 8, 6, dtype=getattr(torch, dtype)), \
        attnlab.PagedKVCache(16, 4, 2, 8, 6, dtype=dtype)
    ids = [paged.add_sequence() for _ in range(3)]
    assert ids == [paged_twin.add_sequence() for _ in range(3)]
    for rows in (slice(0, 6), slice(6, 7), slice(7, 14)):
        a = ours.attend(_t(q[:, :, rows]), _t(k[:, :, rows]), _t(v[:, :, rows]))
        b = twin.attend(q[:, :, rows], k[:, :, rows], v[:, :, rows])
        assert a.dtype == torch.float32 and b.dtype == np.float32
        np.testing.assert_allclose(a.numpy(), b, atol=1e-6, rtol=0)
        a = paged.attend(ids, _t(q[:, :, rows]), _t(k[:, :, rows]), _t(v[:, :, rows]))
        b = paged_twin.attend(ids, q[:, :, rows], k[:, :, rows], v[:, :, rows])
        assert a.dtype == torch.float32
        np.testing.assert_allclose(a.numpy(), b, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(ours.keys.float().numpy(), twin.keys.astype(np.float32))
    np.testing.assert_array_equal(paged.keys(ids[1]).float().numpy(),
                                  paged_twin.keys(ids[1]).astype(np.float32))


def _plain(q, k, v, is_causal=True):
    """float64 attention of one sequence, written out: q (H, T, D), k (Hkv, S, D) -> (H, T, Dv)."""
    G = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])  # (H, T, S)
    T, S = scores.shape[-2:]
    if is_causal:  # bottom-right: query i at position S - T + i
        scores = np.where(np.arange(S)[None, :] <= S - T + np.arange(T)[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_paged_attend_never_reads_another_sequences_slots(poison):
    # A sequence batched with a longer one is gathered to the longer length: its
    # table was padded with block 0 and its last block's slots past its length
    # are stale. Those slots used to be read and masked, and 0 × NaN = NaN: a
    # NaN in block 0 (another sequence's), in a block freed and reused, or in a
    # batched sequence's own values reached y. Now they are gathered as exact
    # zeros: y's row must be finite and equal y alone and a float64 reference
    # (1e-12: the same sums in another order).
    rng = np.random.default_rng(7)
    cache = at.PagedKVCache(8, 4, 1, 4, dtype=torch.float64)
    x = cache.add_sequence()  # takes block 0 and 1
    bad_k, bad_v = rng.standard_normal((2, 1, 1, 7, 4))
    bad_k[..., 2, 1] = bad_v[..., 5, 3] = poison  # planted in block 0 and in block 1's slot 1
    cache.append([x], _t(bad_k), _t(bad_v))
    w = cache.add_sequence()  # takes block 2, then is freed with a poisoned stale slot
    stale = rng.standard_normal((1, 1, 4, 4))
    stale[..., 3, :] = poison
    cache.append([w], _t(stale), _t(stale))
    cache.free(w)
    y, z = cache.add_sequence(), cache.add_sequence()
    y_k, y_v = rng.standard_normal((2, 1, 1, 2, 4))
    cache.append([y], _t(y_k), _t(y_v))  # y: 2 tokens in reused block 2, slot 3 holds the poison
    assert cache.block_table(y).tolist() == [2]
    z_k, z_v = rng.standard_normal((2, 1, 1, 11, 4))
    z_v[..., 9, 0] = poison  # z's own poison reaches only z
    cache.append([z], _t(z_k), _t(z_v))
    queries = {s: rng.standard_normal((2, 1, 4)) for s in (x, y, z)}  # (H, T, D), H = 2
    alone = cache.attend([y], _t(queries[y][None])).numpy()[0]
    np.testing.assert_allclose(alone, _plain(queries[y], y_k[0], y_v[0]), atol=1e-12, rtol=0)
    for batch in ([y, z], [z, y], [x, y, z]):
        out = cache.attend(batch, _t(np.stack([queries[s] for s in batch]))).numpy()
        assert np.isfinite(out[batch.index(y)]).all(), batch
        np.testing.assert_allclose(out[batch.index(y)], alone, atol=1e-12, rtol=0)
    # the NumPy twin gathers the same way: padding slots are zeros, not block 0's keys
    twin = attnlab.PagedKVCache(4, 4, 1, 2)
    a, b = twin.add_sequence(), twin.add_sequence()
    twin.append([a], np.full((1, 1, 3, 2), 5.0), np.full((1, 1, 3, 2), 5.0))
    twin.append([b], np.ones((1, 1, 9, 2)), np.ones((1, 1, 9, 2)))
    gathered = twin._gather(np.array([3, 9]), [a, b], twin._keys)
    np.testing.assert_array_equal(gathered[0, :, 3:], 0.0)
    np.testing.assert_array_equal(gathered[0, :, :3], 5.0)
