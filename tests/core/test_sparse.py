"""Sparse attention against its plain twin: dense attention with the equivalent mask.

Tolerance: 1e-12 absolute in float64 (the issue's). The sparse path takes the
softmax over the allowed keys only; the dense path over all S with the others
at -inf, which add exactly 0 to the sums. The two differ only in summation
order, ~1e-16 relative for these magnitudes, so any wrong key shows up at 1e-3
or more. float32 checks use 1e-6 (float32 epsilon 1.2e-7 times a few sums).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import AttnlabError, ShapeError, causal_mask, scaled_dot_product_attention
from attnlab.fast.block_sparse import bigbird_layout, block_sparse_attention, block_sparse_mask
from attnlab.fast.sparse import sliding_window_attention, sliding_window_mask

TOL = 1e-12


def qkv(T, S, D=8, Dv=5, batch=(2,), seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, T, D)).astype(dtype)
    k = rng.standard_normal((*batch, S, D)).astype(dtype)
    v = rng.standard_normal((*batch, S, Dv)).astype(dtype)
    return q, k, v


# ------------------------------------------------------------- the window's definition


def test_causal_window_boundary():
    """Causal W: query p sees keys p - W + 1 .. p (W keys), never p - W nor p + 1."""
    W, T = 4, 10
    mask = sliding_window_mask(T, W, is_causal=True)
    for p in range(T):
        assert mask[p].sum() == min(W, p + 1)
        assert mask[p, p] and mask[p, max(0, p - W + 1)]
        if p - W >= 0:
            assert not mask[p, p - W]
        if p + 1 < T:
            assert not mask[p, p + 1]


def test_symmetric_window_boundary():
    """Symmetric W (odd): keys p - (W-1)/2 .. p + (W-1)/2; one further on either side is out."""
    W, T = 5, 12
    mask = sliding_window_mask(T, W, is_causal=False)
    half = (W - 1) // 2
    for p in range(half, T - half):
        assert mask[p].sum() == W
        assert mask[p, p - half] and mask[p, p + half]
        assert not mask[p, p - half - 1] if p - half - 1 >= 0 else True
        assert not mask[p, p + half + 1] if p + half + 1 < T else True
    assert mask[0].sum() == half + 1  # the edges hold fewer keys


def test_even_symmetric_window_is_refused():
    with pytest.raises(AttnlabError, match=r"W must be odd.*got 4 \(use 3 or 5\)"):
        sliding_window_mask(8, 4, is_causal=False)
    q, k, v = qkv(8, 8)
    with pytest.raises(AttnlabError, match="W must be odd"):
        sliding_window_attention(q, k, v, 4, is_causal=False)


def test_window_bottom_right_alignment():
    """T < S: query i sits at position S - T + i (the library's causal alignment)."""
    mask = sliding_window_mask(2, 3, is_causal=True, S=6)
    assert mask.astype(int).tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]


def test_global_tokens_pattern():
    T = 9
    mask = sliding_window_mask(T, 3, is_causal=False, global_tokens=[0, 5])
    assert mask[:, 0].all() and mask[:, 5].all()  # attended by everyone
    assert mask[0].all() and mask[5].all()  # attend to everyone
    assert not mask[8, 2]  # an ordinary pair outside the window stays out
    causal = sliding_window_mask(T, 3, is_causal=True, global_tokens=[0, 5])
    assert not np.triu(causal, 1).any()  # causal still wins
    assert causal[5, :6].all() and causal[:, 0].all() and causal[8, 5]


def test_global_token_validation():
    with pytest.raises(AttnlabError, match=r"global_tokens: expected positions in \[0, 6\)"):
        sliding_window_mask(6, 3, is_causal=True, global_tokens=[6])
    with pytest.raises(AttnlabError, match="distinct"):
        sliding_window_mask(6, 3, is_causal=True, global_tokens=[1, 1])
    with pytest.raises(AttnlabError, match="integer key positions"):
        sliding_window_mask(6, 3, is_causal=True, global_tokens=[0.5])


# -------------------------------------------------------- sliding window == dense + mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 3, 7, 33, 255])
@pytest.mark.parametrize("T,S", [(40, 40), (300, 300), (7, 40), (40, 7), (1, 5)])
def test_sliding_window_equals_dense_with_mask(causal, window, T, S):
    q, k, v = qkv(T, S, batch=(2, 3))
    mask = sliding_window_mask(T, window, is_causal=causal, S=S)
    expected = scaled_dot_product_attention(q, k, v, mask)
    got = sliding_window_attention(q, k, v, window, is_causal=causal)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 70), S=st.integers(1, 70), window=st.integers(1, 80),
    causal=st.booleans(), n_global=st.integers(0, 3), seed=st.integers(0, 2**16),
)
def test_sliding_window_property(T, S, window, causal, n_global, seed):
    """Any lengths, window, globals and padding: equal to dense attention with the mask."""
    if not causal and window % 2 == 0:
        window += 1
    rng = np.random.default_rng(seed)
    q, k, v = qkv(T, S, seed=seed)
    globals_ = rng.choice(S, size=min(n_global, S), replace=False)
    padding = rng.random((2, S)) > 0.2  # (B, S) True = a real key
    mask = sliding_window_mask(T, window, is_causal=causal, S=S, global_tokens=globals_)
    expected = scaled_dot_product_attention(q, k, v, mask & padding[:, None, :])
    got = sliding_window_attention(q, k, v, window, is_causal=causal, global_tokens=globals_,
                                   key_padding=padding)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_window_covering_everything_is_exact_attention():
    """Causal W ≥ T is causal attention; symmetric W ≥ 2T - 1 is full attention."""
    T = 50
    q, k, v = qkv(T, T)
    np.testing.assert_allclose(sliding_window_attention(q, k, v, T, is_causal=True),
                               scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(sliding_window_attention(q, k, v, 2 * T - 1, is_causal=False),
                               scaled_dot_product_attention(q, k, v), rtol=0, atol=TOL)
    # One step short is not everything: the corner pair drops out, and the output moves.
    assert not sliding_window_mask(T, 2 * T - 3, is_causal=False)[0, T - 1]
    assert not np.allclose(sliding_window_attention(q, k, v, 2 * T - 3, is_causal=False),
                           scaled_dot_product_attention(q, k, v))


def test_fully_padded_rows_are_zero_not_nan():
    q, k, v = qkv(20, 20)
    padding = np.ones((2, 20), bool)
    padding[1] = False  # batch item 1 has no real key at all
    out = sliding_window_attention(q, k, v, 5, is_causal=True, key_padding=padding)
    assert np.all(out[1] == 0) and np.isfinite(out).all()


def test_global_tokens_with_batch_broadcast_and_t_ne_s():
    q = np.random.default_rng(1).standard_normal((3, 1, 12, 8))  # (B, 1, T, D)
    _, k, v = qkv(30, 30, batch=(1, 4))  # (1, H, S, ·)
    g = [0, 17, 29]
    for causal in (True, False):
        mask = sliding_window_mask(12, 5, is_causal=causal, S=30, global_tokens=g)
        np.testing.assert_allclose(
            sliding_window_attention(q, k, v, 5, is_causal=causal, global_tokens=g),
            scaled_dot_product_attention(q, k, v, mask), rtol=0, atol=TOL)


def test_sliding_window_does_not_build_t_by_s():
    """Peak memory at T = S = 4096 stays far below one T × S float64 matrix (128 MiB)."""
    T, W = 4096, 15
    q, k, v = qkv(T, T, D=8, Dv=8, batch=())
    sliding_window_attention(q, k, v, W, is_causal=True)  # warm-up (imports, caches)
    tracemalloc.start()
    try:
        sliding_window_attention(q, k, v, W, is_causal=True, global_tokens=[0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < T * T * 8 / 20, peak


def test_dtypes_and_empty_keys():
    q, k, v = qkv(10, 10, dtype=np.float32)
    assert sliding_window_attention(q, k, v, 3, is_causal=True).dtype == np.float32
    assert block_sparse_attention(q, k, v, 4).dtype == np.float32
    half = sliding_window_attention(*(a.astype(np.float16) for a in (q, k, v)), 3, is_causal=True)
    assert half.dtype == np.float16
    q, k, v = qkv(4, 0)
    assert np.all(sliding_window_attention(q, k, v, 3, is_causal=True) == 0)


def test_sliding_window_validation():
    q, k, v = qkv(6, 6)
    with pytest.raises(AttnlabError, match="window: expected an integer >= 1, got 0"):
        sliding_window_attention(q, k, v, 0, is_causal=True)
    with pytest.raises(AttnlabError, match="causal: expected True or False"):
        sliding_window_attention(q, k, v, 3, is_causal=None)
    with pytest.raises(ShapeError, match=r"key_padding: expected a shape broadcastable to "
                                         r"\(\.\.\., S\) = \(2, 6\), got \(2, 5\)"):
        sliding_window_attention(q, k, v, 3, is_causal=True, key_padding=np.ones((2, 5), bool))
    with pytest.raises(ShapeError, match=r"k: expected \(\.\.\., S, 8\)"):
        sliding_window_attention(q, k[..., :4], v, 3, is_causal=True)
    with pytest.raises(TypeError):
        sliding_window_attention(q, k, v, 3)  # causal must be chosen
    for call in (lambda: sliding_window_attention(q, k, v, None, is_causal=True),
                 lambda: sliding_window_mask(6, None, is_causal=True)):
        with pytest.raises(AttnlabError, match=r"window: expected an int W or a pair "
                                               r"\(left, right\) .*, got None"):
            call()
    for positions in ([6], [1, 1]):  # the positions' check is the torch twin's
        with pytest.raises(AttnlabError, match="global_tokens: expected (positions in|distinct)"):
            sliding_window_mask(6, 3, is_causal=True, global_tokens=positions)


# ------------------------------------------------------------------- block sparse


def test_bigbird_layout_structure():
    n, L, G, R = 12, 3, 2, 2
    layout = bigbird_layout(n, num_local_blocks=L, num_global_blocks=G, num_random_blocks=R,
                            seed=5)
    assert layout[:, :G].all() and layout[:G].all()  # global blocks
    assert all(layout[i, j] for i in range(n) for j in range(n) if abs(i - j) <= 1)  # local
    for i in range(G, n):  # an ordinary row: band + global + exactly R random blocks
        band = {j for j in range(n) if abs(i - j) <= 1} | set(range(G))
        assert layout[i].sum() == len(band) + R
    assert np.array_equal(layout, bigbird_layout(n, num_local_blocks=L, num_global_blocks=G,
                                                 num_random_blocks=R, seed=5))
    assert not np.array_equal(layout, bigbird_layout(n, num_local_blocks=L,
                                                     num_global_blocks=G,
                                                     num_random_blocks=R, seed=6))
    causal = bigbird_layout(n, num_random_blocks=R, seed=5, is_causal=True)
    assert not np.triu(causal, 1).any() and np.diag(causal).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,b", [(64, 8), (61, 8), (50, 7), (5, 8), (33, 1), (100, 16)])
def test_block_sparse_equals_dense_with_mask(causal, T, b):
    """BigBird layouts, T divisible by b or not (a short last block)."""
    q, k, v = qkv(T, T, batch=(2, 3))
    mask = block_sparse_mask(T, b, is_causal=causal, seed=4)
    assert mask.shape == (T, T)
    expected = scaled_dot_product_attention(q, k, v, mask)
    got = block_sparse_attention(q, k, v, b, is_causal=causal, seed=4)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 60), S=st.integers(1, 60), b=st.integers(1, 12),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_block_sparse_user_layout_property(T, S, b, causal, seed):
    """Any user layout (T ≠ S allowed), with key padding."""
    rng = np.random.default_rng(seed)
    layout = rng.random((-(-T // b), -(-S // b))) < 0.4
    q, k, v = qkv(T, S, seed=seed)
    padding = rng.random((2, S)) > 0.2
    mask = block_sparse_mask(T, b, S=S, layout=layout, is_causal=causal)
    expected = scaled_dot_product_attention(q, k, v, mask & padding[:, None, :])
    got = block_sparse_attention(q, k, v, b, layout=layout, is_causal=causal, key_padding=padding)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_block_sparse_full_layout_is_exact_attention():
    T, b = 45, 8
    q, k, v = qkv(T, T)
    full = np.ones((6, 6), bool)
    np.testing.assert_allclose(block_sparse_attention(q, k, v, b, layout=full),
                               scaled_dot_product_attention(q, k, v), rtol=0, atol=TOL)
    np.testing.assert_allclose(block_sparse_attention(q, k, v, b, layout=full, is_causal=True),
                               scaled_dot_product_attention(q, k, v, causal_mask(T)),
                               rtol=0, atol=TOL)


def _peak_bytes(fn):
    fn()  # warm-up (imports, caches)
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_block_sparse_memory_is_bounded_by_the_layout():
    """A band layout: 4× longer input, at most ~4× the memory, and far below one T × S."""
    b = 32
    peaks = {}
    for T in (2048, 8192):
        q, k, v = qkv(T, T, D=8, Dv=8, batch=())
        n = T // b
        band = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= 1
        peaks[T] = _peak_bytes(
            lambda q=q, k=k, v=v, band=band: block_sparse_attention(q, k, v, b, layout=band))
    assert peaks[8192] < 8192 * 8192 * 8 / 20, peaks  # one float64 score matrix: 512 MiB
    assert peaks[8192] < 5 * peaks[2048], peaks  # quadratic growth would be 16×


def test_block_sparse_validation():
    q, k, v = qkv(10, 10)
    with pytest.raises(ShapeError, match=r"layout: expected \(ceil\(T/b\), ceil\(S/b\)\) = "
                                         r"\(3, 3\) for T = 10, S = 10, b = 4, got \(2, 2\)"):
        block_sparse_attention(q, k, v, 4, layout=np.ones((2, 2), bool))
    with pytest.raises(AttnlabError, match="layout: expected a bool array"):
        block_sparse_attention(q, k, v, 4, layout=np.ones((3, 3)))
    with pytest.raises(AttnlabError, match="num_random_blocks must be left at None"):
        block_sparse_attention(q, k, v, 4, layout=np.ones((3, 3), bool), num_random_blocks=1)
    with pytest.raises(AttnlabError, match=r"T == S.*pass layout="):
        block_sparse_attention(q[..., :6, :], k, v, 4)
    with pytest.raises(AttnlabError, match="L must be odd"):
        block_sparse_attention(q, k, v, 4, num_local_blocks=2)
    with pytest.raises(AttnlabError, match="block_size: expected an integer >= 1"):
        block_sparse_attention(q, k, v, 0)
