"""The seed articles' own code, run verbatim, gives attnlab's numbers.

Seed 000's functions are copied from the article unchanged (NumPy, global
RNG, softmax without max-subtraction). Seed 001's attention is copied with
the `=`/`,` characters the article's extraction lost put back.

Tolerance 1e-12 (float64): the same products and sums, in a different order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.lens.explain import SEED_000_X

# ---- seed 000, verbatim -------------------------------------------------------


def seed000_self_attention(X, Wq, Wk, Wv):
    # 计算QKV
    Q = np.dot(X, Wq)
    K = np.dot(X, Wk)
    V = np.dot(X, Wv)

    # 计算注意力分数
    attention_scores = np.dot(Q, K.T) / np.sqrt(K.shape[1])
    attention_weights = np.exp(attention_scores) / np.sum(np.exp(attention_scores), axis=1, keepdims=True)  # noqa: E501

    # 加权求和
    output = np.dot(attention_weights, V)

    return output


def seed000_multi_head_attention(X, head=4):
    # 假设我们有4个头
    outputs = []
    for _ in range(head):
        # 每个头有自己的Wq,Wk,Wv
        Wq = np.random.randn(X.shape[1], 3)
        Wk = np.random.randn(X.shape[1], 3)
        Wv = np.random.randn(X.shape[1], 3)

        # 计算单个头的输出
        output = seed000_self_attention(X, Wq, Wk, Wv)
        outputs.append(output)

    # 拼接所有头的输出
    multi_head_output = np.concatenate(outputs, axis=1)

    return multi_head_output


# ---- seed 001, verbatim but for the restored punctuation --------------------------


def seed001_scaled_dot_product_attention(Q, K, V, mask=None):
    d_k = Q.size(-1)
    scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = F.softmax(scores, dim=-1)
    return torch.matmul(p_attn, V), p_attn


def test_seed000_self_attention_gives_our_numbers():
    X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])  # the seed's integer X
    np.random.seed(0)
    Wq = np.random.randn(4, 3)
    Wk = np.random.randn(4, 3)
    Wv = np.random.randn(4, 3)
    expected = seed000_self_attention(X, Wq, Wk, Wv)
    np.testing.assert_allclose(attnlab.self_attention(X, Wq, Wk, Wv), expected, atol=1e-12)
    trace = attnlab.explain(X, Wq=Wq, Wk=Wk, Wv=Wv)
    np.testing.assert_allclose(trace.output, expected, atol=1e-12)
    # The weights step equals the seed's attention_weights (rows sum to 1).
    Q, K = X @ Wq, X @ Wk
    scores = Q @ K.T / np.sqrt(3)
    seed_weights = np.exp(scores) / np.sum(np.exp(scores), axis=1, keepdims=True)
    np.testing.assert_allclose(trace.get("weights").values, seed_weights, atol=1e-12)


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


def test_seed000_multi_head_is_explain_with_stacked_heads():
    np.random.seed(1)
    expected = seed000_multi_head_attention(SEED_000_X, head=4)
    np.random.seed(1)  # replay the seed's draws: per head Wq, Wk, Wv of (4, 3)
    per_head = [[np.random.randn(4, 3) for _ in range(3)] for _ in range(4)]
    Wq, Wk, Wv = (np.concatenate([h[i] for h in per_head], axis=1) for i in range(3))
    trace = attnlab.explain(SEED_000_X, Wq=Wq, Wk=Wk, Wv=Wv, num_heads=4)
    np.testing.assert_allclose(trace.get("concat").values, expected, atol=1e-12)
    mha = attnlab.MultiHeadAttention(Wq, Wk, Wv, np.eye(12), num_heads=4)
    np.testing.assert_allclose(mha(SEED_000_X), expected, atol=1e-12)


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


def test_seed000_mask_convention_converts():
    blocked = np.array([[0, 1, 1], [0, 0, 1], [0, 0, 0]])  # seed 000: 1 = blocked
    np.testing.assert_array_equal(attnlab.from_blocked(blocked), attnlab.causal_mask(3))
    with pytest.raises(attnlab.AttnlabError, match="mask: expected only 0 and 1, got values 2"):
        attnlab.from_blocked([[0, 2]])
