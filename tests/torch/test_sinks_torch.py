"""Attention sinks on attnlab.torch's sdpa: the fused path (the sink as one more key of
zeros, scored through a float mask) and the plain path against the NumPy core, outputs,
weights, lse and autograd's gradients (the sinks' included) against the NumPy backward.

Tolerance 1e-12 in float64: the same formula, summed in another order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
import attnlab.torch as at
from attnlab.backward import sdpa_backward
from attnlab.errors import AttnlabError


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64)  # GQA: 2 kv heads
    v = torch.randn(2, 2, 6, 3, generator=gen, dtype=torch.float64)
    sinks = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 6, generator=gen) > 0.3
    mask[1, 0, 2] = False
    return q, k, v, sinks, mask


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "plain"])
def test_torch_sinks_match_the_numpy_core_outputs_and_gradients(return_weights):
    q, k, v, sinks, mask = _inputs()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    result = at.scaled_dot_product_attention(
        leaves[0], leaves[1], leaves[2], mask, sinks=leaves[3], enable_gqa=True,
        return_weights=return_weights)
    out = result[0] if return_weights else result
    expected, weights = attnlab.scaled_dot_product_attention(
        q.numpy(), k.numpy(), v.numpy(), mask.numpy(), sinks=sinks.numpy(), enable_gqa=True,
        return_weights=True)
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-12)
    if return_weights:
        np.testing.assert_allclose(result[1].detach().numpy(), weights, atol=1e-12)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, dout)
    ref = sdpa_backward(q.numpy(), k.numpy(), v.numpy(), dout.numpy(), mask.numpy(),
                        sinks=sinks.numpy(), enable_gqa=True)
    for got, want in zip(grads, (ref.dq, ref.dk, ref.dv, ref.dsinks), strict=True):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


def test_torch_sinks_lse_includes_the_sink():
    q, k, v, sinks, mask = _inputs()
    _, lse = at.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, enable_gqa=True,
                                             return_lse=True)
    _, ref = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                  mask.numpy(), sinks=sinks.numpy(),
                                                  enable_gqa=True, return_lse=True)
    np.testing.assert_allclose(lse.numpy(), ref, atol=1e-12)
    assert torch.equal(lse[1, :, 2], sinks)  # a row with no key: lse is the sink itself


def test_torch_sinks_of_the_wrong_length_are_refused():
    q, k, v, _, _ = _inputs()
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head"):
        at.scaled_dot_product_attention(q, k, v, sinks=torch.zeros(3), enable_gqa=True)
