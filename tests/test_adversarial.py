"""Inputs chosen to break things: each gives the right result or one clear AttnlabError.

Every test here failed before its fix with a bare exception (IndexError,
MemoryError, RuntimeError, UnicodeEncodeError, ...), a NaN, silently wrong
numbers or a CLI "internal error". Errors are matched on the argument they name
and on what they say was expected, so a message that starts blaming the wrong
argument fails too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
import attnlab.torch as at

torch.set_num_threads(1)


def _qkv(*shape_q, S=5, Dv=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    *batch, T, D = shape_q
    q = torch.randn(*batch, T, D, generator=gen, dtype=dtype)
    k = torch.randn(*batch, S, D, generator=gen, dtype=dtype)
    v = torch.randn(*batch, S, Dv, generator=gen, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------- A. masks of any rank


# 1-D and 0-d masks broadcast to (..., T, S) like any other: torch's fused kernel
# indexes dim -2 of its attn_mask, so they used to end in a bare IndexError.
LOW_RANK_MASKS = [
    torch.tensor([True, False, True, True, False]),  # (S,)
    torch.tensor([False, False, False, False, False]),  # (S,), every row fully masked
    torch.tensor(True),  # ()
    torch.tensor(False),  # ()
]


@pytest.mark.parametrize("mask", LOW_RANK_MASKS, ids=["S", "S-none", "0d", "0d-none"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_torch_sdpa_takes_a_mask_of_rank_below_two(mask, return_weights):
    q, k, v = _qkv(2, 3, 4, 8)  # (B, H, T, D), S = 5
    got = at.scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = got[0] if return_weights else got
    full = mask.expand(2, 3, 4, 5)  # the mask expanded by hand: (B, H, T, S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    expected = expected.masked_fill(~full.any(-1, keepdim=True), 0.0)  # attnlab: no key -> 0
    # float64 end to end: the two kernels differ only in summation order.
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    numpy_out = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                     mask.numpy())
    np.testing.assert_allclose(out.numpy(), numpy_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [torch.tensor([0.0, -1.0, float("-inf"), 2.0, 0.5]),
                                  torch.tensor(-3.0)], ids=["S", "0d"])
def test_torch_sdpa_takes_a_bias_of_rank_below_two(bias):
    q, k, v = _qkv(2, 3, 4, 8)
    out = at.scaled_dot_product_attention(q, k, v, bias=bias)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(2, 3, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64, as above
    plain = at.scaled_dot_product_attention(q, k, v, bias=bias, return_weights=True)[0]
    torch.testing.assert_close(out, plain, rtol=1e-12, atol=1e-12)


def test_torch_sdpa_takes_a_1d_mask_and_a_1d_bias_together():
    q, k, v = _qkv(2, 4, 8)
    mask, bias = torch.tensor([True, True, False, True, True]), torch.arange(5.0).double()
    out = at.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")).expand(2, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64


def test_torch_multihead_takes_a_1d_mask_without_weights():
    torch.manual_seed(0)
    mha = at.MultiHeadAttention(2, 8, dtype=torch.float64)
    x, mask = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([True, False] * 2 + [True])
    out = mha(x, x, x, mask, need_weights=False)
    with_weights, _ = mha(x, x, x, mask, need_weights=True)
    torch.testing.assert_close(out, with_weights, rtol=1e-12, atol=1e-12)  # float64, two paths
