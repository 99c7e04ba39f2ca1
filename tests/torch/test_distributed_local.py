"""The local step of ring attention (attnlab.distributed.local) against plain attention.

The torch kernel that computes each block of a ring step, and the overflow-free merge,
checked without processes: one block covering every key is the whole attention, so its
out and lse must equal the float64 reference, and its backward (given the final lse and
δ = rowsum(dout ⊙ out)) must equal autograd through the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.support.ring_reference import random_inputs, reference_attention

from attnlab.distributed.local import TorchLocalKernel, merge_partial, naive_merge


def _five(q, k, v):
    """(B, H, R, D), (B, Hkv, C, D) -> the kernel's (B, Hkv, G, R, D), (B, Hkv, 1, C, D)."""
    B, H, R, D = q.shape
    Hkv = k.shape[1]
    return q.reshape(B, Hkv, H // Hkv, R, D), k.unsqueeze(2), v.unsqueeze(2)


@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("block_q", [3, 1024])  # 3: rows in chunks, the diagonal cut short
def test_block_equals_attention(diagonal, block_q):
    rng = np.random.default_rng(0)
    q, k, v = random_inputs(rng, 2, 4, 2, 10, 8, 5)  # GQA: 4 query heads, 2 K/V heads
    pad = np.ones((2, 10), dtype=bool)
    pad[1, 7:] = False
    out, lse = reference_attention(q, k, v, is_causal=diagonal, key_padding=pad)
    kernel = TorchLocalKernel(block_q=block_q)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    got_out, got_lse = kernel.forward(*_five(tq, tk, tv), torch.tensor(pad), diagonal, 8**-0.5)
    # float64: the same sums in another order; 1e-13 is ~500 ulps of O(1) values.
    np.testing.assert_allclose(got_out.reshape(out.shape).detach().numpy(), out, atol=1e-13)
    np.testing.assert_allclose(got_lse.reshape(lse.shape).detach().numpy(), lse, atol=1e-13)

    # Backward against autograd through a plain torch formula of the same attention.
    g_out = torch.tensor(rng.standard_normal(out.shape))
    g_lse = torch.tensor(rng.standard_normal(lse.shape))
    scores = tq @ tk.repeat_interleave(2, 1).transpose(-1, -2) * 8**-0.5
    allowed = torch.tensor(pad)[:, None, None, :]
    if diagonal:
        allowed = allowed & torch.ones(10, 10, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    ref_lse = torch.logsumexp(scores, dim=-1)
    ref_out = torch.softmax(scores, dim=-1) @ tv.repeat_interleave(2, 1)
    ((ref_out * g_out).sum() + (ref_lse * g_lse).sum()).backward()
    q5, k5, v5 = _five(tq.detach(), tk.detach(), tv.detach())
    delta = (g_out * torch.tensor(out)).sum(-1) - g_lse  # rowsum(dout ⊙ out) − dlse
    dq, dk, dv = kernel.backward(q5, k5, v5, torch.tensor(pad), diagonal, 8**-0.5,
                                 g_out.reshape(*q5.shape[:-1], 5),
                                 torch.tensor(lse).reshape(q5.shape[:-1]),
                                 delta.reshape(q5.shape[:-1]))
    for got, want in ((dq.reshape(q.shape), tq.grad), (dk.squeeze(2), tk.grad),
                      (dv.squeeze(2), tv.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-12)


def test_merge_is_overflow_free():
    """Partials whose lse differ by 1000 (scores of a huge scale): the sigmoid form is exact,
    the naive form's exp(lse_b − lse) overflows float32: lse inf and an output of 0."""
    out1, out2 = torch.ones(1, 3, dtype=torch.float32), torch.full((1, 3), 2.0)
    lse1, lse2 = torch.tensor([0.0]), torch.tensor([1000.0])
    out, lse = merge_partial(out1, lse1, out2, lse2)
    assert out.tolist() == [[2.0, 2.0, 2.0]] and lse.tolist() == [1000.0]
    naive_out, naive_lse = naive_merge(out1, lse1, out2, lse2)
    assert torch.isposinf(naive_lse).all() and (naive_out == 0).all()
    # Equal lse: the mean, lse + log 2.
    out, lse = merge_partial(out1, lse1, out2, lse1)
    assert out.tolist() == [[1.5, 1.5, 1.5]]
    assert lse.item() == pytest.approx(np.log(2.0), abs=1e-7)


def test_merge_with_empty_sides():
    out1, out2 = torch.zeros(3, 2, dtype=torch.float64), torch.full((3, 2), 5.0,
                                                                     dtype=torch.float64)
    inf = float("inf")
    lse1 = torch.tensor([-inf, -inf, 1.0], dtype=torch.float64)
    lse2 = torch.tensor([-inf, 2.0, -inf], dtype=torch.float64)
    out, lse = merge_partial(out1, lse1, out2, lse2)
    # neither side has a key / only the second / only the first
    assert out.tolist() == [[0.0, 0.0], [5.0, 5.0], [0.0, 0.0]]
    assert lse.tolist() == [-inf, 2.0, 1.0]
