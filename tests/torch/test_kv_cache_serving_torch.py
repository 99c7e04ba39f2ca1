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
