"""attnlab.triton.flash_attention under Triton's interpreter: out, lse, dq, dk, dv.

Every quantity is compared with a float64 reference (plain softmax attention
in torch, autograd for the gradients) by FlashAttention's own rule: the
kernel's error against float64 may be at most twice the error of the same
plain computation done in the kernel's dtype (float32 or float16) on the same
inputs. The kernels round differently from a plain computation (tiles, an
online softmax, P rounded to the input dtype before the P·V dot, base-2
exponents), so a fixed tolerance would be either loose or brittle; "no worse
than twice the plain path in the same precision" is what flash-attn tests.
An absolute floor of one unit in the last place at the reference's largest
magnitude is added, so that a plain path that happens to be exact on a
quantity (error 0) does not demand exactness of the kernel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnlab
from attnlab.triton import flash_attention, flash_attention_backward


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
    key_padding: torch.Tensor | None, scale: float | None, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention in ``dtype``, written out: (B, H, T, D), (B, Hkv, S, D) -> out, lse."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(group, dim=1)  # (B, H, S, D)
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    scaled = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D) if scale is None else scale)
    allowed = torch.ones(T, S, dtype=torch.bool)
    if is_causal:  # bottom-right: query i sees keys j <= i + S - T
        allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
    allowed = allowed[None, None]  # (1, 1, T, S)
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]  # (B, 1, T, S)
    scaled = scaled.masked_fill(~allowed, -math.inf)  # (B, H, T, S)
    lse = torch.logsumexp(scaled, dim=-1)  # (B, H, T), -inf for an empty row
    weights = torch.exp(scaled - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return weights @ v, lse


def max_error(got: torch.Tensor, golden: torch.Tensor) -> float:
    """Largest |got - golden| over finite golden entries; infinities must match exactly."""
    got, golden = got.detach().double(), golden.detach().double()
    finite = torch.isfinite(golden)
    assert torch.equal(got[~finite], golden[~finite]), "infinities differ"
    assert not torch.isnan(got).any()
    return (got[finite] - golden[finite]).abs().max().item() if finite.any() else 0.0


def check_twice_rule(name: str, got: torch.Tensor, plain: torch.Tensor, golden: torch.Tensor,
                     dtype: torch.dtype) -> None:
    finite = golden[torch.isfinite(golden)]
    ulp = torch.finfo(dtype).eps * (finite.abs().max().item() if finite.numel() else 0.0)
    kernel_error, plain_error = max_error(got, golden), max_error(plain, golden)
    assert kernel_error <= 2 * plain_error + ulp, (
        f"{name}: kernel error {kernel_error:.3g} > 2 x plain {dtype} error {plain_error:.3g} "
        f"+ 1 ulp {ulp:.3g}"
    )


def make_inputs(B, H, Hkv, T, S, D, dtype, padding=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
    key_padding = None
    if padding == "left":  # left padding, as batched decoders use: batch b has b·7 pads
        key_padding = torch.arange(S)[None, :] >= 7 * torch.arange(B)[:, None]
    elif padding == "random":
        key_padding = torch.rand(B, S, generator=gen) > 0.3
        key_padding[-1] = False  # a batch with no real key at all: out 0, lse -inf
    return q, k, v, key_padding


# (B, H, Hkv, T, S, D, is_causal, padding): odd sizes (ragged last tiles of the 32 x 32
# interpreter tiles), T < S and T > S causal (bottom-right; T > S leaves the first T - S
# queries with nothing to attend to), GQA groups of 2 and 4, every supported D.
CASES = [
    (2, 2, 2, 100, 77, 32, False, None),
    (1, 4, 2, 64, 200, 64, True, None),
    (2, 4, 1, 130, 70, 16, True, "left"),
    (2, 2, 2, 33, 45, 128, False, "random"),
    (1, 1, 1, 256, 256, 32, True, None),
    (3, 2, 1, 1, 97, 16, True, "left"),
]
FP16_CASES = [CASES[1], CASES[2], CASES[4]]


def _run(case, dtype):
    B, H, Hkv, T, S, D, is_causal, padding = case
    q, k, v, key_padding = make_inputs(B, H, Hkv, T, S, D, dtype, padding)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = flash_attention(q, k, v, is_causal=is_causal, key_padding=key_padding,
                               return_lse=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    results = {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}

    expected = {}
    for ref_dtype in (torch.float64, dtype):
        leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = reference(*leaves, is_causal, key_padding, None, ref_dtype)
        ref_grads = torch.autograd.grad(ref_out, leaves, dout.to(ref_dtype))
        expected[ref_dtype] = {"out": ref_out, "lse": ref_lse, "dq": ref_grads[0],
                               "dk": ref_grads[1], "dv": ref_grads[2]}
    return results, expected[torch.float64], expected[dtype]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_float32_out_lse_and_gradients_by_the_twice_rule(case):
    results, golden, plain = _run(case, torch.float32)
    assert results["out"].dtype == torch.float32 and results["lse"].dtype == torch.float32
    for name in results:
        check_twice_rule(name, results[name], plain[name], golden[name], torch.float32)


@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: "-".join(map(str, c)))
def test_float16_out_lse_and_gradients_by_the_twice_rule(case):
    results, golden, plain = _run(case, torch.float16)
    assert results["out"].dtype == torch.float16 and results["dq"].dtype == torch.float16
    for name in ("out", "dq", "dk", "dv"):
        check_twice_rule(name, results[name], plain[name], golden[name], torch.float16)
    # lse is float32 (accumulated in float32 from float16 scores), while the plain float16
    # path rounds its logsumexp to float16: hold it to float32's rule against float64's
    # lse of the same float16 inputs, with the float32 plain path as the yardstick.
    q, k, v, key_padding = make_inputs(*case[:6], torch.float16, case[7])
    _, lse32 = reference(q, k, v, case[6], key_padding, None, torch.float32)
    check_twice_rule("lse", results["lse"], lse32, golden["lse"], torch.float32)


def test_empty_rows_give_zero_output_minus_inf_lse_and_no_gradient():
    # T > S causal: queries 0..T-S-1 see no key; batch 1 is all padding.
    q, k, v, _ = make_inputs(2, 2, 2, 40, 20, 16, torch.float32)
    key_padding = torch.tensor([[True] * 20, [False] * 20])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = flash_attention(q, k, v, is_causal=True, key_padding=key_padding, return_lse=True)
    assert torch.equal(out[0, :, :20], torch.zeros_like(out[0, :, :20]))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[0, :, :20]).all() and torch.isneginf(lse[1]).all()
    assert torch.isfinite(lse[0, :, 20:]).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(dq[0, :, :20], torch.zeros_like(dq[0, :, :20]))
    assert torch.equal(dq[1], torch.zeros_like(dq[1]))
    assert torch.equal(dk[1], torch.zeros_like(dk[1])) and torch.equal(dv[1], dk[1])
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_a_gradient_through_lse_matches_float64():
    """lse is differentiable: ∂lse/∂s = P enters the backward as δ − dlse."""
    q, k, v, key_padding = make_inputs(1, 2, 1, 50, 70, 32, torch.float32, "random")
    key_padding = key_padding | torch.ones_like(key_padding)  # every key real: lse finite
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    weight = torch.linspace(-1, 1, 50)
    dq, dk, dv = torch.autograd.grad((out.sum(-1) * weight).sum() + (lse * weight).sum(),
                                     (q, k, v))
    for ref_dtype, results in ((torch.float64, {}), (torch.float32, {})):
        leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = reference(*leaves, True, None, None, ref_dtype)
        w = weight.to(ref_dtype)
        loss = (ref_out.sum(-1) * w).sum() + (ref_lse * w).sum()
        results.update(zip(("dq", "dk", "dv"), torch.autograd.grad(loss, leaves), strict=True))
        if ref_dtype == torch.float64:
            golden = results
        else:
            plain = results
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check_twice_rule(name, got, plain[name], golden[name], torch.float32)


def test_shards_merge_into_the_whole_as_ring_attention_needs():
    """Two key shards' (out, lse) merged by attnlab.merge_partials give attention over all
    keys; flash_attention_backward with the merged out and lse gives each shard's part of
    dq and its own dk, dv (the local step of a ring-attention backward)."""
    q, k, v, _ = make_inputs(1, 2, 2, 48, 90, 32, torch.float32, seed=3)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    parts = [flash_attention(q, k[:, :, a:b], v[:, :, a:b], return_lse=True)
             for a, b in ((0, 40), (40, 90))]
    out, lse = attnlab.merge_partials(*(t.numpy() for part in parts for t in part))
    whole_out, whole_lse = flash_attention(q, k, v, return_lse=True)
    # Float32 rounding of two paths (merged shards vs one pass): a few ulps of |out| <= 4.
    np.testing.assert_allclose(out, whole_out.numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, whole_lse.numpy(), rtol=0, atol=2e-6)

    out_t, lse_t = torch.from_numpy(out).float(), torch.from_numpy(lse).float()
    shard_grads = [flash_attention_backward(q, k[:, :, a:b], v[:, :, a:b], out_t, lse_t, dout)
                   for a, b in ((0, 40), (40, 90))]
    dq = shard_grads[0][0] + shard_grads[1][0]
    dk = torch.cat([g[1] for g in shard_grads], dim=2)
    dv = torch.cat([g[2] for g in shard_grads], dim=2)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out, _ = reference(*leaves, False, None, None, torch.float64)
    golden = torch.autograd.grad(ref_out, leaves, dout.double())
    # The same float32 rounding as the unsharded kernel, which the twice rule holds at
    # ~1e-6 here: 1e-5 leaves room for the merge's and the lse's extra roundings.
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), golden, strict=True):
        assert max_error(got, want) < 1e-5, name


def test_empty_lengths():
    q, k, v, _ = make_inputs(1, 2, 2, 5, 0, 16, torch.float32)  # S = 0: nothing to attend to
    q.requires_grad_()
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros(1, 2, 5, 16)) and torch.isneginf(lse).all()
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.equal(dq, torch.zeros_like(q))
    q, k, v, _ = make_inputs(1, 2, 2, 0, 9, 16, torch.float32)  # T = 0
    assert flash_attention(q, k, v).shape == (1, 2, 0, 16)


def test_scale_and_mixed_dtypes_and_non_contiguous_inputs():
    q, k, v, _ = make_inputs(1, 2, 2, 40, 50, 32, torch.float32, seed=5)
    q_t = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    out = flash_attention(q_t, k.half(), v, scale=0.3)  # promoted to float32
    golden, _ = reference(q, k.half(), v, False, None, 0.3, torch.float64)
    plain, _ = reference(q, k.half(), v, False, None, 0.3, torch.float32)
    assert out.dtype == torch.float32
    check_twice_rule("out", out, plain, golden, torch.float32)
