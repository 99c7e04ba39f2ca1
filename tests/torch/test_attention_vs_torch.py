"""scaled_dot_product_attention and softmax against PyTorch.

The NumPy-only tests of the same functions are in tests/core/test_attention.py.

Tolerances:
- float64 vs torch float64: 1e-12 absolute. Both sides compute the same sums of
  at most a few hundred O(1) products in different orders; the rounding
  difference is ~1e-15 per element, so 1e-12 leaves room without hiding a bug
  (a wrong scale or mask shows up at 1e-2 or more).
- float32 vs torch float32: 1e-6 relative (plus 1e-6 absolute for values near
  zero): float32's epsilon is 1.2e-7 and each output is a short dot product.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import scaled_dot_product_attention, softmax


def torch_sdpa(q, k, v, mask=None, scale=None, is_causal=False):
    """Reference: torch's SDPA (its bool mask also means True = take part)."""
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    tm = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=tm, scale=scale, is_causal=is_causal
    ).numpy()


def torch_weights(q, k, mask=None, scale=None):
    """Reference attention weights computed in torch, mask as -inf fill."""
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = tq @ tk.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~torch.from_numpy(mask), float("-inf"))
    return torch.softmax(scores, dim=-1).numpy()


def bottom_right_causal(T, S):
    """Independent construction: torch.tril with the diagonal shifted by S - T."""
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T).numpy()


SHAPES = [  # (batch dims, T, S, D, Dv)
    ((), 1, 1, 1, 1),
    ((), 3, 3, 4, 4),
    ((2,), 5, 7, 8, 3),
    ((2, 3), 6, 4, 16, 16),
    ((1, 2), 9, 9, 5, 11),
    ((4,), 2, 13, 32, 8),
]


@pytest.mark.parametrize("dtype,atol,rtol", [(np.float64, 1e-12, 0), (np.float32, 1e-6, 1e-6)])
@pytest.mark.parametrize("batch,T,S,D,Dv", SHAPES)
def test_matches_torch_without_mask(batch, T, S, D, Dv, dtype, atol, rtol):
    rng = np.random.default_rng(T * 100 + S)
    q = rng.standard_normal((*batch, T, D)).astype(dtype)
    k = rng.standard_normal((*batch, S, D)).astype(dtype)
    v = rng.standard_normal((*batch, S, Dv)).astype(dtype)
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.dtype == dtype and out.shape == (*batch, T, Dv)
    np.testing.assert_allclose(out, torch_sdpa(q, k, v), atol=atol, rtol=rtol)
    np.testing.assert_allclose(weights, torch_weights(q, k), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype,atol,rtol", [(np.float64, 1e-12, 0), (np.float32, 1e-6, 1e-6)])
@pytest.mark.parametrize("batch,T,S,D,Dv", SHAPES[1:])
def test_matches_torch_with_random_mask(batch, T, S, D, Dv, dtype, atol, rtol):
    rng = np.random.default_rng(7 + T + S)
    q = rng.standard_normal((*batch, T, D)).astype(dtype)
    k = rng.standard_normal((*batch, S, D)).astype(dtype)
    v = rng.standard_normal((*batch, S, Dv)).astype(dtype)
    mask = rng.random((*batch, T, S)) < 0.6
    mask[..., 0] = True  # every row keeps a key: torch's rule for empty rows differs
    scale = 0.37
    out, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale, return_weights=True)
    np.testing.assert_allclose(out, torch_sdpa(q, k, v, mask, scale), atol=atol, rtol=rtol)
    np.testing.assert_allclose(weights, torch_weights(q, k, mask, scale), atol=atol, rtol=rtol)
    assert (weights[~mask] == 0).all()


def test_broadcast_mask_and_batch_dims():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 4, 8))  # (B, H, T, D)
    k = rng.standard_normal((2, 1, 6, 8))  # one K/V head shared by 3 query heads
    v = rng.standard_normal((2, 1, 6, 5))
    key_padding = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=bool)
    mask = key_padding[:, None, None, :]  # (B, 1, 1, S)
    out = scaled_dot_product_attention(q, k, v, mask)
    expected = torch_sdpa(q, np.broadcast_to(k, (2, 3, 6, 8)), np.broadcast_to(v, (2, 3, 6, 5)),
                          np.broadcast_to(mask, (2, 3, 4, 6)))
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_causal_square_equals_torch_is_causal():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, is_causal=True),
        torch_sdpa(q, k, v, is_causal=True), atol=1e-12)


@pytest.mark.parametrize("T,S", [(1, 5), (3, 8), (4, 4)])
def test_causal_is_bottom_right_aligned(T, S):
    rng = np.random.default_rng(T + S)
    q, k, v = rng.standard_normal((T, 4)), rng.standard_normal((S, 4)), rng.standard_normal((S, 2))
    expected = torch_sdpa(q, k, v, bottom_right_causal(T, S))
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, is_causal=True), expected,
                               atol=1e-12)
    np.testing.assert_array_equal(attnlab.causal_mask(T, S), bottom_right_causal(T, S))


def test_causal_combines_with_mask_by_and():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((5, 3)) for _ in range(3))
    mask = rng.random((5, 5)) < 0.7
    np.fill_diagonal(mask, True)
    both = mask & bottom_right_causal(5, 5)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, mask, is_causal=True),
                               torch_sdpa(q, k, v, both), atol=1e-12)


def test_causal_with_more_queries_than_keys_gives_zero_rows():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    out, weights = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[:2], 0.0)  # queries at positions -2, -1 see nothing
    np.testing.assert_array_equal(weights[:2], 0.0)
    np.testing.assert_allclose(out[2:], torch_sdpa(q[2:], k, v, bottom_right_causal(3, 3)),
                               atol=1e-12)


def test_bias_is_added_to_scaled_scores():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8)), rng.standard_normal(
        (2, 6, 3))
    bias = rng.standard_normal((4, 6))
    ref = F.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
        attn_mask=torch.from_numpy(bias)).numpy()  # a float attn_mask is added
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, bias=bias), ref, atol=1e-12)


def test_fully_masked_row_gives_zeros_not_nan():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((3, 4)) for _ in range(3))
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_allclose(out[[0, 2]], torch_sdpa(q[[0, 2]], k, v), atol=1e-12)


def test_seed001_minus_1e9_makes_a_blocked_row_uniform_but_attnlab_gives_zero():
    """The documented difference: -1e9 filling silently averages over blocked keys."""
    v = np.arange(6.0).reshape(3, 2)
    q = k = np.zeros((3, 2))
    blocked_row = np.ones((3, 3), dtype=bool)
    blocked_row[0] = False
    # Seed 001: scores.masked_fill(mask == 0, -1e9), then F.softmax.
    seed_scores = torch.zeros(3, 3).double().masked_fill(~torch.from_numpy(blocked_row), -1e9)
    seed_out = (torch.softmax(seed_scores, -1) @ torch.from_numpy(v)).numpy()
    np.testing.assert_allclose(seed_out[0], v.mean(0))  # the seed's answer: uniform
    np.testing.assert_array_equal(scaled_dot_product_attention(q, k, v, blocked_row)[0], 0.0)


def test_integer_inputs_compute_in_float64():
    x = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])
    out = scaled_dot_product_attention(x, x, x)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, torch_sdpa(x.astype(float), x.astype(float),
                                               x.astype(float)), atol=1e-12)


def test_float16_inputs_return_float16_computed_in_float32():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((4, 8)).astype(np.float16) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v)
    assert out.dtype == np.float16
    golden = torch_sdpa(*(a.astype(np.float64) for a in (q, k, v)))
    # float16 keeps ~3 decimal digits (eps 9.8e-4): the final rounding dominates.
    np.testing.assert_allclose(out.astype(np.float64), golden, atol=2e-3, rtol=2e-3)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(9)
    base = rng.standard_normal((4, 6, 10))
    q, k, v = base[:, :, ::2], np.swapaxes(rng.standard_normal((4, 5, 6)), -1, -2), base[..., 1::2]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v), torch_sdpa(q, k, v),
                               atol=1e-12)


def test_softmax_matches_torch_and_survives_huge_scores():
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [3.0, 1.0, 2.0]])
    np.testing.assert_allclose(softmax(x), torch.softmax(torch.from_numpy(x), -1).numpy(),
                               atol=1e-15)
    assert np.isfinite(softmax(x)).all()


def test_softmax_axis_and_minus_inf():
    x = np.array([[0.0, -np.inf], [-np.inf, -np.inf]])
    np.testing.assert_array_equal(softmax(x), [[1.0, 0.0], [0.0, 0.0]])
    y = np.random.default_rng(0).standard_normal((3, 4))
    np.testing.assert_allclose(softmax(y, axis=0), torch.softmax(torch.from_numpy(y), 0).numpy(),
                               atol=1e-15)

