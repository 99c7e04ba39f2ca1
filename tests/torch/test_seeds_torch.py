"""The seed articles' PyTorch code, run verbatim, gives attnlab's numbers.

Seed 001's attention is copied with the `=`/`,` characters the article's
extraction lost put back. Seed 000's NumPy code is tested in
tests/core/test_seeds.py; its overflow test is here for its torch golden.

Tolerance 1e-12 (float64): the same products and sums, in a different order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.support.seeds import seed000_self_attention

import attnlab
from attnlab.lens.explain import SEED_000_X

# ---- seed 001, verbatim but for the restored punctuation --------------------------


def seed001_scaled_dot_product_attention(Q, K, V, mask=None):
    d_k = Q.size(-1)
    scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = F.softmax(scores, dim=-1)
    return torch.matmul(p_attn, V), p_attn


def test_seed000_softmax_overflows_where_ours_does_not():
    """Seed 000's softmax has no max-subtraction: large scores give NaN."""
    X = SEED_000_X * 100  # scores of order 1e4
    Wq = Wk = Wv = np.eye(4)[:, :3]
    with np.errstate(over="ignore", invalid="ignore"):
        seed_out = seed000_self_attention(X, Wq, Wk, Wv)
    assert np.isnan(seed_out).any()
    ours = attnlab.self_attention(X, Wq, Wk, Wv)
    assert np.isfinite(ours).all()
    # Golden: the same computation in float64 torch (whose softmax is stable).
    t = torch.from_numpy(X) @ torch.from_numpy(Wq)
    golden = torch.softmax(t @ t.T / math.sqrt(3), -1) @ t
    np.testing.assert_allclose(ours, golden.numpy(), atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_seed001_attention_with_its_mask_convention(dtype):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 5, 8)) for _ in range(3))
    keep = (rng.random((2, 1, 5, 5)) < 0.7).astype(np.int64)  # seed 001: 0 = blocked
    keep[..., 0] = 1
    out_ref, w_ref = seed001_scaled_dot_product_attention(
        *(torch.from_numpy(a).to(dtype) for a in (q, k, v)), torch.from_numpy(keep))
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    out, w = attnlab.scaled_dot_product_attention(
        *(a.astype(np_dtype) for a in (q, k, v)), attnlab.from_keep(keep), return_weights=True)
    # exp(-1e9 - max) is exactly 0 in both float32 and float64, so -1e9 = -inf here.
    tol = {"atol": 1e-12} if dtype == torch.float64 else {"atol": 1e-6, "rtol": 1e-6}
    np.testing.assert_allclose(out, out_ref.numpy(), **tol)
    np.testing.assert_allclose(w, w_ref.numpy(), **tol)

