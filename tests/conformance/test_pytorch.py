"""Conformance with PyTorch: scaled_dot_product_attention and nn.MultiheadAttention.

PyTorch itself is the reference here: every case runs torch's function and
attnlab (the NumPy core, attnlab.flash_attention and attnlab.torch) on the same
inputs. Each test names the case it mirrors in PyTorch's own suites:

- pytorch/pytorch:test/test_transformers.py (SDPA against its math reference)
- pytorch/pytorch:test/nn/test_multihead_attention.py (nn.MultiheadAttention)

Convention map (torch -> attnlab):

- ``F.scaled_dot_product_attention(attn_mask=bool)``: True = take part, the same
  as attnlab's ``mask``. A float ``attn_mask`` is added to the scores: attnlab's
  ``bias``.
- ``nn.MultiheadAttention``: ``attn_mask`` bool is True = *blocked* and
  ``key_padding_mask`` True = *padding*; attnlab's ``mask = ~attn_mask`` and
  ``key_padding = ~key_padding_mask``. A float attn_mask goes to ``bias``.
- ``is_causal=True`` in torch is aligned top-left (query i sees keys j <= i);
  attnlab's is bottom-right (query i sits at S - T + i), which is torch's
  ``torch.nn.attention.bias.causal_lower_right``. They agree when T == S; for
  T != S torch's variant is attnlab's ``mask=np.tril(np.ones((T, S)))``.
- Rows with nothing to attend to: torch's SDPA returns 0 for them (safe
  softmax), as attnlab does; nn.MultiheadAttention returns NaN, where attnlab
  returns the projection of a zero head (the output bias).
- Non-finite q/k/v: torch propagates NaN; attnlab refuses them with an
  AttnlabError (the NumPy core always, attnlab.torch under ``debug_checks()``).
- GQA: torch's ``enable_gqa=True`` repeats key/value head g for query heads
  g*G .. g*G+G-1; attnlab expresses the same by broadcasting q (B, Hkv, G, T, D)
  against k, v (B, Hkv, 1, S, D), or through its KV cache and MultiHeadAttention.

Tolerances: float64 results agree to 1e-12 (both sides are exact up to a few
roundings of O(1) values); float32 to 2e-6 relative to max(1, max|ref|) (both
sides round independently; about 5e-7 is typical at these sizes).
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

import attnlab
import attnlab.torch as at

from ._reference import assert_close

F64_TOL = 1e-12  # float64 on both sides: a few roundings of O(1) values
F32_REL = 2e-6  # float32 on both sides: independent roundings, ~5e-7 seen


def _tol(dtype: torch.dtype, ref: torch.Tensor | np.ndarray) -> float:
    ref_arr = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    scale = max(1.0, float(np.max(np.abs(ref_arr)))) if ref_arr.size else 1.0
    return F64_TOL * scale if dtype == torch.float64 else F32_REL * scale


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _attnlab(impl: str, q, k, v, mask=None, *, bias=None, is_causal=False, scale=None):
    """Run one attnlab path on torch tensors; returns a NumPy array."""
    if impl == "numpy":
        return attnlab.scaled_dot_product_attention(
            _np(q), _np(k), _np(v), None if mask is None else _np(mask),
            bias=None if bias is None else _np(bias), is_causal=is_causal, scale=scale)
    if impl == "flash":
        return attnlab.flash_attention(
            _np(q), _np(k), _np(v), None if mask is None else _np(mask),
            bias=None if bias is None else _np(bias), is_causal=is_causal, scale=scale,
            block_q=3, block_k=4)
    if impl == "torch":
        return _np(at.scaled_dot_product_attention(q, k, v, mask, bias=bias,
                                                   is_causal=is_causal, scale=scale))
    if impl == "torch_weights":  # attnlab.torch's plain path (it returns the weights too)
        out, _ = at.scaled_dot_product_attention(q, k, v, mask, bias=bias, is_causal=is_causal,
                                                 scale=scale, return_weights=True)
        return _np(out)
    raise AssertionError(impl)


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestTransformers::test_scaled_dot_product_attention
# Every input rank (3-D, 4-D) with every mask rank it allows (none, 2-D, same rank), causal
# or not, at T = 4 != S = 3 as in torch's case. Mapping: a bool attn_mask is attnlab's
# mask as is; torch's is_causal (top-left for T != S) is attnlab's mask=tril(ones(T, S)),
# the very mask torch's own reference builds for this case. The random masks have their
# first query row fully masked: torch returns 0 there ("actual_all_zero"), so must attnlab.
# batch_size 0 and 5, as torch's case: an empty batch gives an empty result.

RANK_CASES = [(3, None, False), (3, 2, False), (3, 2, True), (3, 3, False), (3, 3, True),
              (4, None, False), (4, 2, False), (4, 2, True), (4, 4, False), (4, 4, True)]


@pytest.mark.parametrize("impl", ["numpy", "flash", "torch", "torch_weights"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("input_dim,attn_mask_dim,is_causal", RANK_CASES)
@pytest.mark.parametrize("batch_size", [0, 5])
def test_sdpa_input_and_mask_ranks(batch_size, input_dim, attn_mask_dim, is_causal, dtype, impl):
    g = _gen(1000 * input_dim + 10 * (attn_mask_dim or 0) + is_causal)
    N, N_prime, L, S, E = batch_size, 2, 4, 3, 6
    lead = (N,) if input_dim == 3 else (N, N_prime)
    q = torch.randn(*lead, L, E, dtype=dtype, generator=g)
    k = torch.randn(*lead, S, E, dtype=dtype, generator=g)
    v = torch.randn(*lead, S, E, dtype=dtype, generator=g)
    mask = None
    if is_causal:
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # top-left
        mask = torch.ones(L, S, dtype=torch.bool).tril()  # torch's causal, in attnlab terms
        if attn_mask_dim != 2:
            mask = mask.expand(*lead, L, S)
    elif attn_mask_dim is not None:
        size = (L, S) if attn_mask_dim == 2 else (*lead, L, S)
        mask = torch.randint(0, 2, size, generator=g).bool()
        mask[..., 0, :] = False  # a fully masked row in every case
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert bool((expected[..., 0, :] == 0).all())  # torch's rule, attnlab's too
    else:
        expected = F.scaled_dot_product_attention(q, k, v)
    actual = _attnlab(impl, q, k, v, mask)
    assert actual.dtype == _np(expected).dtype and actual.shape == tuple(expected.shape)
    assert_close(actual, _np(expected), atol=_tol(dtype, expected), what=impl)
    if mask is not None and not is_causal:
        assert np.all(actual[..., 0, :] == 0)  # exactly 0, not merely small


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestAttnBias::test_causal_variants (causal_upper_left /
# causal_lower_right). attnlab's is_causal is torch's causal_lower_right for every T, S
# (T > S: the first T - S rows see nothing; torch gives 0 there, and warns); torch's
# is_causal=True (upper-left) is attnlab's mask=tril(ones(T, S)).

ALIGN_SHAPES = [(4, 4), (3, 7), (1, 9), (5, 12), (7, 3), (9, 4)]


@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
@pytest.mark.parametrize("variant", ["lower_right", "upper_left"])
@pytest.mark.parametrize("T,S", ALIGN_SHAPES)
def test_causal_alignment_variants(T, S, variant, impl):
    g = _gen(17 * T + S)
    q = torch.randn(2, 3, T, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 3, S, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, 3, S, 5, dtype=torch.float64, generator=g)
    if variant == "lower_right":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns about T > S
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))
        actual = _attnlab(impl, q, k, v, is_causal=True)
        if T > S:
            assert bool((expected[..., : T - S, :] == 0).all())
            assert np.all(actual[..., : T - S, :] == 0)
    else:
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        actual = _attnlab(impl, q, k, v, torch.ones(T, S, dtype=torch.bool).tril())
    assert_close(actual, _np(expected), atol=F64_TOL, what=f"{impl} {variant}")
    if T != S and min(T, S) > 1:  # the two alignments really differ here
        other = (_attnlab(impl, q, k, v, is_causal=True) if variant == "upper_left"
                 else _attnlab(impl, q, k, v, torch.ones(T, S, dtype=torch.bool).tril()))
        assert np.max(np.abs(other - _np(expected))) > 1e-3


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestSDPACpuOnly::
#     test_scaled_dot_product_fused_attention_mask_vs_math_cpu
# Every broadcastable mask shape: 2-D (T|1, S|1) and 4-D (B|1, H|1, T|1, S|1), bool
# (attnlab mask) and float randn (attnlab bias), plus rank-1 masks (S,) and (1,), which
# broadcast to (..., T, S) by the same rule. torch's own kernel rejects a rank-1 attn_mask
# (IndexError), so for those the reference gets the mask expanded to (T, S) first.

B_, H_, T_, S_, D_ = 2, 3, 5, 7, 8
MASK_SHAPES = (
    [(t, s) for t in (T_, 1) for s in (S_, 1)]
    + [(b, h, t, s) for b in (B_, 1) for h in (H_, 1) for t in (T_, 1) for s in (S_, 1)]
    + [(S_,), (1,)]
)


@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
@pytest.mark.parametrize("bool_mask", [True, False])
@pytest.mark.parametrize("mask_shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_broadcast_masks(mask_shape, bool_mask, impl):
    g = _gen(zlib.crc32(repr(mask_shape).encode()) + bool_mask)
    q = torch.randn(B_, H_, T_, D_, dtype=torch.float64, generator=g)
    k = torch.randn(B_, H_, S_, D_, dtype=torch.float64, generator=g)
    v = torch.randn(B_, H_, S_, D_, dtype=torch.float64, generator=g)
    if bool_mask:
        mask = torch.randint(0, 2, mask_shape, generator=g).bool()
        if mask.numel() == 1:
            mask[...] = True  # a single blocked entry would block everything: keep it live
    else:
        mask = torch.randn(mask_shape, dtype=torch.float64, generator=g)
    torch_mask = mask.expand(T_, S_) if mask.ndim == 1 else mask
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask)
    if bool_mask:
        actual = _attnlab(impl, q, k, v, mask)
    else:
        actual = _attnlab(impl, q, k, v, bias=mask)
    assert_close(actual, _np(expected), atol=F64_TOL, what=impl)


# pytorch/pytorch:test/test_transformers.py::TestSDPACpuOnly::
#     test_scaled_dot_product_fused_attention_mask_vs_math_cpu[dtype=float16, bfloat16]
# Half precision with a bool mask (one row fully masked), a float mask and causal (T = 11,
# S = 17: torch's top-left is_causal is attnlab's mask=tril(ones(T, S)), as in
# test_sdpa_input_and_mask_ranks). The golden is torch in float64 on the same rounded
# inputs; attnlab's output (in the input's
# dtype) must be within FlashAttention's rule of it: at most 2x the error of torch's own
# half-precision result, plus half an ulp of 1 in that dtype (its final rounding).

HALF_CASES = [(torch.float16, impl) for impl in ("numpy", "torch", "torch_weights")] + [
    (torch.bfloat16, impl) for impl in ("torch", "torch_weights")]  # NumPy has no bfloat16


@pytest.mark.parametrize("mask_kind", ["bool", "float", "causal"])
@pytest.mark.parametrize("dtype,impl", HALF_CASES, ids=str)
def test_half_precision_vs_math(dtype, impl, mask_kind):
    g = _gen(len(mask_kind) + (dtype == torch.bfloat16))
    q, k, v = (torch.randn(2, 3, n, 16, generator=g).to(dtype) for n in (11, 17, 17))
    mask = bias = None
    if mask_kind == "bool":
        mask = torch.rand(2, 1, 11, 17, generator=g) > 0.5
        mask[:, :, 0] = False
    elif mask_kind == "float":
        bias = torch.randn(11, 17, generator=g).to(dtype)
    causal = mask_kind == "causal"
    torch_mask = mask if bias is None else bias
    if causal:
        mask = torch.ones(11, 17, dtype=torch.bool).tril()  # attnlab's side of the mapping
    golden = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(),
        attn_mask=None if torch_mask is None else torch_mask.double() if bias is not None
        else torch_mask, is_causal=causal)
    low = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask, is_causal=causal)
    if impl == "numpy":
        actual = attnlab.scaled_dot_product_attention(
            _np(q), _np(k), _np(v), None if mask is None else _np(mask),
            bias=None if bias is None else _np(bias))
        assert actual.dtype == np.float16
    else:
        actual = at.scaled_dot_product_attention(q, k, v, mask, bias=bias,
                                                 return_weights=impl == "torch_weights")
        actual = actual[0] if isinstance(actual, tuple) else actual
        assert actual.dtype == dtype
        actual = _np(actual.double())
    slack = float(torch.finfo(dtype).eps) / 2
    err = float(np.max(np.abs(np.asarray(actual, np.float64) - _np(golden))))
    base = float((low.double() - golden).abs().max())
    assert err <= 2 * base + slack, f"{impl}: error {err:.3g} vs torch's {base:.3g}"
    if mask_kind == "bool":
        assert np.all(np.asarray(actual)[:, :, 0] == 0)


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestSDPACpuOnly::
#     test_scaled_dot_product_fused_attention_gqa_vs_math_cpu
# enable_gqa=True with (query heads, kv heads) = (65, 5), (16, 4), (27, 1), (5, 1), a float
# (B, Hq, T, S) mask, T = 17, S = 100, D = 8, forward and (train) gradients, including
# the gradient of the float mask (torch's check_out_and_grad grad_attn_mask). attnlab:
# q -> (B, Hkv, G, T, D), k, v -> (B, Hkv, 1, S, D), mask -> bias (B, Hkv, G, T, S); the
# backward sums dk, dv over the broadcast group axis, as torch's autograd does through
# repeat_interleave.

@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("n_heads", [(65, 5), (16, 4), (27, 1), (5, 1)])
def test_gqa_vs_enable_gqa(n_heads, train, impl):
    Hq, Hkv = n_heads
    G = Hq // Hkv
    B, T, S, D = 2, 17, 100, 8
    g = _gen(Hq * 100 + Hkv)
    q = torch.randn(B, Hq, T, D, dtype=torch.float64, generator=g, requires_grad=train)
    k = torch.randn(B, Hkv, S, D, dtype=torch.float64, generator=g, requires_grad=train)
    v = torch.randn(B, Hkv, S, D, dtype=torch.float64, generator=g, requires_grad=train)
    bias = torch.randn(B, Hq, T, S, dtype=torch.float64, generator=g, requires_grad=train)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    q5, k5, v5 = q.reshape(B, Hkv, G, T, D), k[:, :, None], v[:, :, None]
    bias5 = bias.reshape(B, Hkv, G, T, S)
    if impl == "numpy":
        actual = attnlab.scaled_dot_product_attention(_np(q5), _np(k5), _np(v5), bias=_np(bias5))
    else:
        actual_t = at.scaled_dot_product_attention(q5, k5, v5, bias=bias5)
        actual = _np(actual_t)
    assert_close(actual.reshape(B, Hq, T, D), _np(expected), atol=F64_TOL, what="out")
    if not train:
        return
    dout = torch.randn(B, Hq, T, D, dtype=torch.float64, generator=g)
    grads = torch.autograd.grad(expected, (q, k, v, bias), dout)
    if impl == "numpy":
        dq, dk, dv, dbias = attnlab.sdpa_backward(
            _np(q5), _np(k5), _np(v5), _np(dout).reshape(B, Hkv, G, T, D), bias=_np(bias5))
    else:
        dq, dk, dv, dbias = (_np(t) for t in torch.autograd.grad(
            actual_t, (q, k, v, bias), dout.reshape(B, Hkv, G, T, D)))
    for name, got, want in zip("q k v bias".split(), (dq, dk, dv, dbias), grads,
                               strict=True):
        assert_close(np.reshape(got, want.shape), _np(want), atol=1e-11, what=f"d{name}")


# pytorch/pytorch:test/test_transformers.py::TestSDPACpuOnly::
#     test_scaled_dot_product_fused_attention_gqa_vs_math_cpu, through attnlab's GQA KV cache
# (prefill of T tokens: causal, T == S, where torch's is_causal and attnlab's agree).

@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("n_heads", [(8, 2), (6, 1)])
def test_kv_cache_gqa_vs_enable_gqa(n_heads, impl):
    Hq, Hkv = n_heads
    B, T, D = 2, 9, 8
    g = _gen(Hq + 7 * Hkv)
    q = torch.randn(B, Hq, T, D, dtype=torch.float64, generator=g)
    k = torch.randn(B, Hkv, T, D, dtype=torch.float64, generator=g)
    v = torch.randn(B, Hkv, T, D, dtype=torch.float64, generator=g)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if impl == "numpy":
        cache = attnlab.KVCache(batch=B, num_kv_heads=Hkv, head_dim=D)
        actual = cache.attend(_np(q), _np(k), _np(v))
    else:
        cache_t = at.KVCache(B, Hkv, D, dtype=torch.float64)
        actual = _np(cache_t.attend(q, k, v))
    assert_close(actual, _np(expected), atol=F64_TOL, what=impl)


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::test_fully_masked_out_rows (TestSDPA / TestSDPACpuOnly)
# Every 4th query row fully masked, the rest masked where i % 5 != j % 5; loss = out.sum().
# Output and gradients equal torch's, nothing is NaN, the masked rows' output and their
# dq are exactly 0. float32 as in torch's case; tolerance 2e-6 relative (module doc).

def _fully_masked_inputs(seq_len: int, head_dim: int):
    g = _gen(seq_len * 1000 + head_dim)
    q, k, v = (torch.rand(1, 1, seq_len, head_dim, generator=g, requires_grad=True)
               for _ in range(3))
    mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool)
    mask[0, 0, ::4, :] = False
    idx = torch.arange(seq_len)
    mask = mask & (idx[:, None] % 5 == idx[None, :] % 5)
    return q, k, v, mask


@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("seq_len", [32, 64, 128])
def test_fully_masked_out_rows(seq_len, head_dim, impl):
    q, k, v, mask = _fully_masked_inputs(seq_len, head_dim)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    dout = np.ones(expected.shape, dtype=np.float32)
    if impl == "numpy":
        out = attnlab.scaled_dot_product_attention(_np(q), _np(k), _np(v), _np(mask))
        grads = attnlab.sdpa_backward(_np(q), _np(k), _np(v), dout, _np(mask))[:3]
    elif impl == "flash":
        out, lse = attnlab.flash_attention(_np(q), _np(k), _np(v), _np(mask), return_lse=True,
                                           block_q=8, block_k=16)
        grads = attnlab.flash_attention_backward(_np(q), _np(k), _np(v), out, lse, dout,
                                                 _np(mask), block_q=8, block_k=16)
        assert np.all(np.isneginf(lse[..., ::4]))  # nothing to attend to: lse = -inf
    else:
        qt, kt, vt = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out_t = at.scaled_dot_product_attention(qt, kt, vt, mask)
        grads = [_np(t) for t in torch.autograd.grad(out_t.sum(), (qt, kt, vt))]
        out = _np(out_t)
    assert_close(out, _np(expected), atol=_tol(torch.float32, expected), what="out")
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert_close(got, _np(want), atol=_tol(torch.float32, want), what=f"d{name}")
    assert np.all(out[0, 0, ::4] == 0)
    assert np.all(np.asarray(grads[0])[0, 0, ::4] == 0)


# pytorch/pytorch:test/test_transformers.py::TestSDPAXpuOnly::
#     test_scaled_dot_product_attention_fused_kernels_safe_softmax
# A float mask that is -inf everywhere: every row sees nothing; torch's kernels and its math
# reference return 0 (safe softmax). attnlab, given the mask as bias, returns 0 as well.

@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
def test_all_minus_inf_mask_safe_softmax(impl):
    g = _gen(32)
    q, k, v = (torch.rand(2, 4, 32, 16, generator=g) for _ in range(3))
    mask = torch.full((32, 32), float("-inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert bool((expected == 0).all())
    actual = _attnlab(impl, q, k, v, bias=mask)
    assert np.array_equal(actual, np.zeros_like(actual))


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestSDPACpuOnly::test_sdpa_with_inf
# A float mask of -inf above the diagonal and below diagonal -10 (triu(1) + tril(-10)) at
# T = S = 600, 2 heads, D = 8, float32. In attnlab: bias with -inf entries, or the bool
# band it encodes, which is attnlab's causal sliding window of W = 10 keys (itself
# included): sliding_window_mask(600, 10, is_causal=True), and sliding_window_attention.

@pytest.mark.parametrize("impl", ["numpy_bias", "numpy_mask", "flash_bias",
                                  "sliding_window", "torch_bias"])
def test_sdpa_with_inf_band(impl):
    full = torch.full((600, 600), float("-inf"))
    band = torch.triu(full, diagonal=1) + torch.tril(full, diagonal=-10)
    g = _gen(127055)
    q, k, v = (torch.randn(1, 2, 600, 8, generator=g) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    window = attnlab.sliding_window_mask(600, 10, is_causal=True)
    assert np.array_equal(window, _np(band) == 0)  # the band is exactly the W = 10 window
    if impl == "numpy_bias":
        actual = attnlab.scaled_dot_product_attention(_np(q), _np(k), _np(v), bias=_np(band))
    elif impl == "numpy_mask":
        actual = attnlab.scaled_dot_product_attention(_np(q), _np(k), _np(v), window)
    elif impl == "flash_bias":
        actual = attnlab.flash_attention(_np(q), _np(k), _np(v), bias=_np(band),
                                         block_q=64, block_k=128)
    elif impl == "sliding_window":
        actual = attnlab.sliding_window_attention(_np(q), _np(k), _np(v), 10, is_causal=True)
    else:
        actual = _np(at.scaled_dot_product_attention(q, k, v, bias=band))
    assert_close(actual, _np(expected), atol=_tol(torch.float32, expected), what=impl)


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::test_non_masked_rows_nan_props
# torch: one +inf in q makes the output (and dq) NaN. attnlab's mapping: non-finite q, k
# or v are refused up front with an AttnlabError naming the input, in every path
# (attnlab.torch under debug_checks(), which reads values; by default it reads none).

@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
@pytest.mark.parametrize("fill", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_inputs_refused(fill, impl):
    g = _gen(160841)
    q = torch.randn(1, 2, 4, 16, generator=g)
    k, v = torch.randn(1, 2, 4, 16, generator=g), torch.randn(1, 2, 4, 16, generator=g)
    q[0, 1, 2, 3] = fill
    if fill == float("inf"):  # torch's case: the NaN propagates
        assert bool(torch.isnan(F.scaled_dot_product_attention(q, k, v)).any())
    with at.debug_checks(), pytest.raises(attnlab.AttnlabError, match="q"):
        _attnlab(impl, q, k, v)


# pytorch/pytorch:test/test_transformers.py::TestSDPAFailureModes::
#     test_invalid_inputs_1_dimensional_inputs
# A 1-D query (torch: RuntimeError) is refused by every attnlab path, naming q's layout.

@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
def test_invalid_1_dimensional_query(impl):
    q = torch.randn(4)
    k = v = torch.randn(1, 4)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(attnlab.ShapeError, match=r"q: expected \(\.\.\., T, D\)"):
        _attnlab(impl, q, k, v)


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestSDPA::
#     test_scaled_dot_product_attention_math_with_negative_scale
# scale = -1 / 0.0001 on x of (1, 3, 64, 64), q = k = v = x. float64 here, so that the
# near one-hot softmax of scores ~1e5 is compared without float32's rounding of them.

@pytest.mark.parametrize("impl", ["numpy", "flash", "torch"])
def test_negative_scale(impl):
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=_gen(105190))
    expected = torch.matmul((torch.matmul(x, x.transpose(-1, -2)) / -0.0001).softmax(-1), x)
    torch_sdpa = F.scaled_dot_product_attention(x, x, x, scale=-1.0 / 0.0001)
    assert_close(_np(torch_sdpa), _np(expected), atol=1e-10, what="torch itself")
    actual = _attnlab(impl, x, x, x, scale=-1.0 / 0.0001)
    assert_close(actual, _np(expected), atol=1e-10, what=impl)  # scores ~1e5: 1e-10


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/test_transformers.py::TestSDPA::test_sdp_math_gradcheck and the gradient
# half of test_scaled_dot_product_attention (gradcheck of the math path): attnlab's
# hand-written backward passes against torch's autograd, float64, with no mask, a random
# bool mask (with a fully masked row), causal (T == S: both alignments agree) and a
# float mask whose gradient torch also returns (attnlab's dbias).

@pytest.mark.parametrize("impl", ["sdpa_backward", "flash_backward"])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "causal", "float"])
def test_backward_vs_autograd(mask_kind, impl):
    g = _gen(len(mask_kind) * 31 + len(impl))
    B, H, T, S, D = 2, 2, 6, 6 if mask_kind == "causal" else 9, 4
    q = torch.randn(B, H, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(B, H, S, D, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(B, H, S, D, dtype=torch.float64, generator=g, requires_grad=True)
    dout = torch.randn(B, H, T, D, dtype=torch.float64, generator=g)
    mask = bias = None
    if mask_kind == "bool":
        mask = torch.randint(0, 2, (B, 1, T, S), generator=g).bool()
        mask[:, :, 2] = False
    elif mask_kind == "float":
        bias = torch.randn(1, H, T, S, dtype=torch.float64, generator=g, requires_grad=True)
    causal = mask_kind == "causal"
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if bias is None else bias,
                                         is_causal=causal)
    inputs = (q, k, v) if bias is None else (q, k, v, bias)
    want = torch.autograd.grad(out, inputs, dout)
    args = dict(bias=None if bias is None else _np(bias), is_causal=causal)
    m = None if mask is None else _np(mask)
    if impl == "sdpa_backward":
        got = attnlab.sdpa_backward(_np(q), _np(k), _np(v), _np(dout), m, **args)
        got = got[:4] if bias is not None else got[:3]
    else:
        o, lse = attnlab.flash_attention(_np(q), _np(k), _np(v), m, return_lse=True,
                                         block_q=4, block_k=4, **args)
        got = attnlab.flash_attention_backward(_np(q), _np(k), _np(v), o, lse, _np(dout), m,
                                               block_q=4, block_k=4, **args)
        want = want[:3]  # flash's backward treats bias as a constant (no dbias)
    for name, a, w in zip("q k v bias".split()[: len(want)], got, want, strict=True):
        assert_close(a, _np(w), atol=1e-11, what=f"d{name}")  # float64 chain rule: 1e-11


# --------------------------------------------------------------------------------------
# pytorch/pytorch:test/nn/test_multihead_attention.py::TestMultiheadAttentionNN::
#     test_multihead_attention (its _multihead_attn_test_helper variants no_masking,
#     key_padding_mask, and same_embed_dim/kdim, average_attn_weights True and False)
# One decoder query (T = 1) against K = V of width kv_dim, a float attn_mask (1, S) of 0 /
# -inf, an optional bool key_padding_mask (True = pad). attnlab: from_torch_multihead,
# bias = the float mask, key_padding = ~key_padding_mask; torch's weights averaged over
# heads are attnlab's per-head weights averaged. Where every key is masked torch gives NaN
# and attnlab a zero head, i.e. an output equal to out_proj's bias and weights of 0.

def _mha_outputs(impl, module, query, key, *, mask=None, bias=None, key_padding=None):
    """attnlab's output and per-head weights for nn.MultiheadAttention's (batch-first) inputs."""
    twin = at.from_torch_multihead(module).eval()
    twin.batch_first = True  # the module's layout is (T, B, E); these inputs are batch-first
    if impl == "torch":
        out, w = twin(query, key, key, mask=mask, key_padding=key_padding, bias=bias,
                      return_weights=True)
        return _np(out), _np(w)
    core = twin.to_numpy()
    context = None if key is query else _np(key)
    out, w = core(_np(query), context, mask=None if mask is None else _np(mask),
                  key_padding=None if key_padding is None else _np(key_padding),
                  bias=None if bias is None else _np(bias), return_weights=True)
    return out, w


def _compare_mha(out, weights, ref_out, ref_w, bo, *, average):
    """Compare with torch where torch is finite; its NaN rows must be attnlab's zero heads."""
    ref_out, ref_w = _np(ref_out), _np(ref_w)
    w = weights.mean(axis=1) if average else weights
    nan_rows = np.isnan(ref_out).any(axis=-1)  # (B, T)
    ok = ~nan_rows
    assert_close(out[ok], ref_out[ok], atol=1e-12, what="out")
    if nan_rows.any():
        bias_row = np.zeros(out.shape[-1]) if bo is None else _np(bo)
        assert_close(out[nan_rows], np.broadcast_to(bias_row, out[nan_rows].shape),
                     atol=1e-12, what="out of fully masked rows")
    w_ok = ~np.isnan(ref_w).any(axis=-1)
    assert_close(w[w_ok], ref_w[w_ok], atol=1e-12, what="weights")
    assert np.all(w[~w_ok] == 0)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning")
@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("average_attn_weights", [True, False])
@pytest.mark.parametrize("same_embed_dim", [True, False])
@pytest.mark.parametrize("add_key_padding_mask", [False, True])
def test_multihead_attention(add_key_padding_mask, same_embed_dim, average_attn_weights, impl):
    rng = np.random.default_rng(4 * add_key_padding_mask + 2 * same_embed_dim
                                + average_attn_weights)
    torch.manual_seed(int(rng.integers(2**31)))
    for _ in range(3):
        batch, seq_len = (int(rng.integers(2, 11)) for _ in range(2))
        d_head, nheads = int(rng.integers(3, 11)), int(rng.integers(2, 6)) * 2
        d_model = d_head * nheads
        kv_dim = d_model if same_embed_dim else int(rng.integers(5, 21))
        module = nn.MultiheadAttention(d_model, nheads, kdim=kv_dim, vdim=kv_dim,
                                       dtype=torch.float64).eval()
        with torch.no_grad():
            module.in_proj_bias.normal_()  # non-zero biases, so they are checked too
            module.out_proj.bias.normal_()
        query = torch.from_numpy(rng.random((batch, 1, d_model)))
        key = torch.from_numpy(rng.random((batch, seq_len, kv_dim)))
        attn_mask = torch.from_numpy(rng.integers(0, 2, (1, seq_len))).double()
        attn_mask = attn_mask.masked_fill(attn_mask == 0, float("-inf")).masked_fill(
            attn_mask == 1, 0.0)
        kpm = None
        if add_key_padding_mask:
            kpm = torch.from_numpy(np.repeat(rng.integers(0, 2, (1, seq_len)), batch, 0) == 1)
        with torch.no_grad():
            ref_out, ref_w = module(query.transpose(0, 1), key.transpose(0, 1),
                                    key.transpose(0, 1), key_padding_mask=kpm,
                                    attn_mask=attn_mask, need_weights=True,
                                    average_attn_weights=average_attn_weights)
        out, w = _mha_outputs(impl, module, query, key, bias=attn_mask,
                              key_padding=None if kpm is None else ~kpm)
        _compare_mha(out, w, ref_out.transpose(0, 1), ref_w, module.out_proj.bias,
                     average=average_attn_weights)


# pytorch/pytorch:test/nn/test_multihead_attention.py::TestMultiheadAttentionNN::
#     test_multihead_attn_3d_attn_mask
# A float (N*H, T, S) mask, repeat_interleave'd per head from (N, T, S): attnlab takes it
# as a bias (N, H, T, S), or per batch item as a (T, S) bias; all three agree.

@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_multihead_attn_3d_attn_mask(impl):
    torch.manual_seed(3)
    E, H, N, S, T = 8, 4, 8, 3, 2
    query = torch.rand(N, T, E, dtype=torch.float64)
    key = torch.rand(N, S, E, dtype=torch.float64)
    m = torch.randint(0, 2, (N, T, S)).double()
    m = m.masked_fill(m == 0, float("-inf")).masked_fill(m == 1, 0.0)
    module = nn.MultiheadAttention(E, H, dtype=torch.float64).eval()
    with torch.no_grad():
        ref_out, ref_w = module(query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1),
                                attn_mask=torch.repeat_interleave(m, H, dim=0),
                                average_attn_weights=False)
    out, w = _mha_outputs(impl, module, query, key, bias=m.reshape(N, 1, T, S))
    _compare_mha(out, w, ref_out.transpose(0, 1), ref_w, module.out_proj.bias, average=False)
    for i in range(N):
        out_i, _ = _mha_outputs(impl, module, query[i:i + 1], key[i:i + 1], bias=m[i])
        assert_close(out_i[0], out[i], atol=1e-12, what=f"batch item {i} alone")


# pytorch/pytorch:test/nn/test_multihead_attention.py::TestMultiheadAttentionNN::
#     test_multihead_attn_no_bias (and TestMultiheadAttentionNNDeviceType::
#     test_multihead_attn_in_proj_bias_none): bias=False carries over as no biases at all.

@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_multihead_attn_no_bias(impl):
    torch.manual_seed(5)
    module = nn.MultiheadAttention(8, 4, bias=False, dtype=torch.float64).eval()
    assert module.in_proj_bias is None and module.out_proj.bias is None
    twin = at.from_torch_multihead(module)
    assert all(lin.bias is None for lin in (twin.q_proj, twin.k_proj, twin.v_proj,
                                            twin.out_proj))
    x = torch.rand(3, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        ref_out, ref_w = module(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
    out, w = _mha_outputs(impl, module, x, x)
    _compare_mha(out, w, ref_out.transpose(0, 1), ref_w, None, average=True)


# pytorch/pytorch:test/nn/test_multihead_attention.py::TestMultiheadAttentionNNDeviceType::
#     test_multihead_self_attn_two_masks_fast_path
# A bool attn_mask (T, T) and a bool key_padding_mask (B, S), both True = blocked, on
# torch's fast path (eval, no grad, batch_first). attnlab: mask = ~attn_mask,
# key_padding = ~key_padding_mask; torch's rows blocked by both are excluded there
# ("Rows which are completely masked out are nan") and are attnlab's zero heads.

@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_multihead_self_attn_two_masks(impl):
    torch.manual_seed(7)
    E, H, B, L = 14, 7, 8, 5
    x = torch.rand(B, L, E, dtype=torch.float64)
    attn_mask = torch.randint(0, 2, (L, L)).bool()
    kpm = torch.randint(0, 2, (B, L)).bool()
    module = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        ref_out, _ = module(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm)
    merged = attn_mask[None] | kpm[:, None, :]  # (B, T, S), True = blocked
    dead = merged.all(-1)  # (B, T)
    out, w = _mha_outputs(impl, module, x, x, mask=~attn_mask, key_padding=~kpm)
    live = ~_np(dead)
    assert_close(out[live], _np(ref_out)[live], atol=1e-12, what="out")
    assert_close(out[~live], np.broadcast_to(_np(module.out_proj.bias), out[~live].shape),
                 atol=1e-12, what="out of fully masked rows")
    assert np.all(w.sum(-1)[np.broadcast_to(~live[:, None], w.shape[:-1])] == 0)


# pytorch/pytorch:test/nn/test_multihead_attention.py::TestMultiheadAttentionNNDeviceType::
#     test_multihead_attn_in_proj_weight_none
# kdim = vdim = 2 != embed_dim: separate q/k/v projection weights (in_proj_weight is None).

@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_multihead_attn_in_proj_weight_none(impl):
    torch.manual_seed(11)
    module = nn.MultiheadAttention(4, 4, vdim=2, kdim=2, dtype=torch.float64).eval()
    assert module.in_proj_weight is None
    with torch.no_grad():
        module.in_proj_bias.normal_()
    query = torch.rand(4, 4, 4, dtype=torch.float64)
    key = torch.rand(4, 6, 2, dtype=torch.float64)
    with torch.no_grad():
        ref_out, ref_w = module(query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1))
    out, w = _mha_outputs(impl, module, query, key)
    _compare_mha(out, w, ref_out.transpose(0, 1), ref_w, module.out_proj.bias, average=True)


# pytorch/pytorch:test/test_transformers.py::TestTransformers::test_train_with_is_causal
# (is_causal_kernels): E = 4, one head, all projection weights 1, inputs all 1, causal:
# every output entry is 16 (each head value is 4 = sum of four ones; out_proj sums four
# of them). Computed by hand, not by either library.

@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_is_causal_all_ones(impl):
    S, L, E, H = 1, 2, 4, 1  # torch's (seq, batch) layout: 2 batch items of 1 token
    module = nn.MultiheadAttention(E, H, dtype=torch.float32)
    with torch.no_grad():
        module.in_proj_weight.fill_(1.0)
        module.out_proj.weight.fill_(1.0)
    twin = at.from_torch_multihead(module).eval()
    twin.batch_first = True  # the module's layout is (T, B, E); these inputs are batch-first
    x = torch.ones(L, S, E)  # batch-first
    if impl == "torch":
        out = _np(twin(x, x, x, is_causal=True)[0])
    else:
        out = twin.to_numpy()(_np(x), is_causal=True)[0]
    assert np.array_equal(out, np.full((L, S, E), 16.0, dtype=np.float32))
    x3 = torch.ones(2, 3, E)  # longer sequences: still 16 everywhere under the causal mask
    out3 = _np(twin(x3, x3, x3, is_causal=True)[0]) if impl == "torch" else \
        twin.to_numpy()(_np(x3), is_causal=True)[0]
    assert_close(out3, np.full((2, 3, E), 16.0), atol=16 * F32_REL, what="T = 3")
