"""attnlab.torch.varlen_attention against each sequence run alone and against its NumPy twin.

References, independent of the code under test: torch's own
``F.scaled_dot_product_attention`` on each sequence alone (bottom-right causal
mask passed explicitly, key/value heads repeated for GQA), with its autograd
gradients; and the NumPy twin ``attnlab.fast.varlen.varlen_attention`` /
``varlen_attention_backward``.

Tolerances: float64 1e-12 (the same O(1) sums in another order, ~1e-15 apart);
float32 by FlashAttention's rule, at most 2x the error of the same-precision
reference (torch's sdpa per sequence in float32) against the float64 one, plus
8 ulps of the reference's largest magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab.torch as at
from attnlab.errors import AttnlabError, ShapeError
from attnlab.fast import varlen

EPS32 = float(np.finfo(np.float32).eps)
CASES = [
    ([5, 3, 7], [5, 3, 7], 2, 2),
    ([4, 4, 1, 9, 4], [4, 4, 1, 9, 4], 4, 2),
    ([3, 0, 6, 2], [5, 2, 6, 0], 4, 1),
    ([6, 2, 5], [3, 8, 5], 3, 3),
]


def _problem(lq, lk, H, Hkv, dtype=torch.float64, seed=0, D=8, Dv=6):
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), H, D, generator=gen, dtype=dtype)
    k = torch.randn(int(cu_k[-1]), Hkv, D, generator=gen, dtype=dtype)
    v = torch.randn(int(cu_k[-1]), Hkv, Dv, generator=gen, dtype=dtype)
    dout = torch.randn(int(cu_q[-1]), H, Dv, generator=gen, dtype=dtype)
    return q, k, v, dout, cu_q, cu_k, max(lq), max(lk)


def _torch_alone(q, k, v, dout, cu_q, cu_k, is_causal):
    """torch's sdpa on each sequence alone, and autograd's gradients."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    outs = []
    for b in range(len(cu_q) - 1):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        T, S = rq.stop - rq.start, rk.stop - rk.start
        if T == 0:
            continue
        if S == 0:
            outs.append(q[rq, :, :1].new_zeros(T, q.shape[1], v.shape[2]) * q[rq].sum())
            continue
        mask = None
        if is_causal:
            mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)  # bottom-right
        out = F.scaled_dot_product_attention(
            q[rq].transpose(0, 1), k[rk].repeat_interleave(G, 1).transpose(0, 1),
            v[rk].repeat_interleave(G, 1).transpose(0, 1), attn_mask=mask)
        if mask is not None:  # torch gives NaN for a query with no key; attnlab gives 0
            out = out.masked_fill(~mask.any(-1)[:, None], 0.0)
        outs.append(out.transpose(0, 1))
    out = torch.cat(outs)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _ours(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = at.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_float64_equals_torch_per_sequence_and_the_numpy_twin(case, is_causal):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem(*case)
    ours = _ours(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal)
    reference = _torch_alone(q, k, v, dout, cu_q, cu_k, is_causal)
    numpy_args = (cu_q.numpy(), cu_k.numpy(), max_q, max_k)
    twin = [varlen.varlen_attention(q.numpy(), k.numpy(), v.numpy(), *numpy_args,
                                    is_causal=is_causal)]
    twin += varlen.varlen_attention_backward(q.numpy(), k.numpy(), v.numpy(), dout.numpy(),
                                             *numpy_args, is_causal=is_causal)
    for name, o, r, t in zip(("out", "dq", "dk", "dv"), ours, reference, twin, strict=True):
        assert o.dtype == torch.float64 and o.shape == r.shape, name
        np.testing.assert_allclose(o.numpy(), r.numpy(), atol=1e-12, rtol=0, err_msg=name)
        np.testing.assert_allclose(o.numpy(), t, atol=1e-12, rtol=0, err_msg=name)


@pytest.mark.parametrize("is_causal", [False, True])
def test_float32_flashattention_rule(is_causal):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem([17, 1, 40, 33, 33], [20, 9, 40, 33, 33],
                                                       4, 2, torch.float32, 3, D=16, Dv=16)
    golden = _torch_alone(*(t.double() for t in (q, k, v, dout)), cu_q, cu_k, is_causal)
    same_precision = _torch_alone(q, k, v, dout, cu_q, cu_k, is_causal)
    ours = _ours(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal)
    for name, g, r, o in zip(("out", "dq", "dk", "dv"), golden, same_precision, ours,
                             strict=True):
        assert o.dtype == torch.float32, name
        allowed = 2 * float((r.double() - g).abs().max()) + 8 * EPS32 * float(g.abs().max())
        assert float((o.double() - g).abs().max()) <= allowed, name


@pytest.mark.parametrize("options", [{"window": (2, 1)}, {"softcap": 2.0},
                                     {"window": (3, 0), "softcap": 1.5}])
@pytest.mark.parametrize("is_causal", [False, True])
def test_window_and_softcap_match_the_numpy_twin(options, is_causal):
    # The NumPy twin is checked against the plain sdpa on each sequence alone (tests/core).
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem([5, 9, 1, 6], [7, 9, 4, 3], 4, 2)
    q, k = 3 * q, 3 * k  # scores past the soft cap
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = at.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal,
                              **options)
    out.backward(dout)
    numpy_args = (cu_q.numpy(), cu_k.numpy(), max_q, max_k)
    arrays = [t.detach().numpy() for t in (q, k, v)]
    twin = [varlen.varlen_attention(*arrays, *numpy_args, is_causal=is_causal, **options)]
    twin += varlen.varlen_attention_backward(*arrays, dout.numpy(), *numpy_args,
                                             is_causal=is_causal, **options)
    for name, o, t in zip(("out", "dq", "dk", "dv"), (out.detach(), q.grad, k.grad, v.grad),
                          twin, strict=True):
        np.testing.assert_allclose(o.numpy(), t, atol=1e-12, rtol=0, err_msg=name)


def test_gradcheck():
    q, k, v, _, cu_q, cu_k, max_q, max_k = _problem([3, 4], [3, 5], 2, 1, D=3, Dv=2)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: at.varlen_attention(a, b, c, cu_q, cu_k, max_q, max_k, is_causal=True),
        inputs)


def test_bad_inputs_are_named():
    q, k, v, _, cu_q, cu_k, max_q, max_k = _problem([3, 2], [3, 2], 2, 2)
    with pytest.raises(AttnlabError, match="cu_seqlens_q: expected the first entry to be 0"):
        at.varlen_attention(q, k, v, torch.tensor([1, 3, 5]), cu_k, 3, 3)
    with pytest.raises(AttnlabError, match="cu_seqlens_q: expected non-decreasing"):
        at.varlen_attention(q, k, v, [0, 4, 3, 5], cu_k, 4, 3)
    with pytest.raises(AttnlabError, match=r"cu_seqlens_k: expected the last entry to equal "
                                           r"k.shape\[0\] = 5"):
        at.varlen_attention(q, k, v, cu_q, [0, 2, 4], 3, 3)
    with pytest.raises(AttnlabError, match="cu_seqlens_k: expected as many sequences"):
        at.varlen_attention(q, k, v, cu_q, [0, 1, 3, 5], 3, 3)
    with pytest.raises(AttnlabError, match="max_seqlen_k: expected at least the longest"):
        at.varlen_attention(q, k, v, cu_q, cu_k, 3, 2)
    with pytest.raises(ShapeError, match="q: expected the packed layout"):
        at.varlen_attention(q[None], k, v, cu_q, cu_k, 3, 3)
