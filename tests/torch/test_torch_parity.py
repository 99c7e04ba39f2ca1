"""attnlab.torch vs the NumPy core, torch.nn.MultiheadAttention and F.scaled_dot_product_attention.

Four implementations of the same attention, compared over masks, T != S,
bottom-right causal, GQA, batch and head counts.

Tolerances (each assertion repeats the one it uses):
- float64: 1e-12, relative to max(1, max |reference|). Every implementation sums
  the same O(1) products in a different order; that costs ~1e-15 per element.
  A real bug (wrong scale, mask, head order) shows up at 1e-3 or more.
- float32: 1e-6 relative (max |error| / max |reference|), against a float64
  golden computed from the same float32 inputs and parameters. float32's epsilon
  is 1.2e-7 and every output is a short chain of dot products of <= 64 terms.
- bfloat16: FlashAttention's rule. The error against a float64 golden must be at
  most 2x the error of a plain bfloat16 PyTorch computation of the same thing
  (bfloat16 has 8 bits of mantissa, so an absolute bound would be arbitrary;
  the rule asks "no worse than the obvious way to compute it in bfloat16").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
import attnlab.torch as at

F64_TOL = 1e-12
F32_TOL = 1e-6


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def err64(ours: torch.Tensor | np.ndarray, ref: torch.Tensor | np.ndarray) -> float:
    """Max abs error, relative to max(1, max |ref|)."""
    a = ours.detach().double().numpy() if isinstance(ours, torch.Tensor) else ours
    b = ref.detach().double().numpy() if isinstance(ref, torch.Tensor) else ref
    assert a.shape == b.shape
    return float(np.abs(a - b).max(initial=0.0) / max(1.0, np.abs(b).max(initial=0.0)))


def rel_err(ours: torch.Tensor | np.ndarray, ref: torch.Tensor | np.ndarray) -> float:
    """Normwise relative error: max |ours - ref| / max |ref|."""
    a = ours.detach().double().numpy() if isinstance(ours, torch.Tensor) else ours
    b = np.asarray(ref.detach().double().numpy() if isinstance(ref, torch.Tensor) else ref,
                   dtype=np.float64)
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / np.abs(b).max())


def bottom_right(T: int, S: int) -> np.ndarray:
    """Independent construction of the bottom-right causal mask."""
    return np.tril(np.ones((T, S), dtype=bool), k=S - T)


# (batch dims, T, S, D, Dv)
SHAPES = [
    ((), 1, 1, 1, 1),
    ((), 3, 3, 4, 4),
    ((2,), 5, 7, 8, 3),
    ((2, 3), 6, 4, 16, 16),
    ((1, 2), 9, 9, 5, 11),
    ((4,), 2, 13, 32, 8),
]


def qkv(batch, T, S, D, Dv, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, T, D)).astype(dtype)
    k = rng.standard_normal((*batch, S, D)).astype(dtype)
    v = rng.standard_normal((*batch, S, Dv)).astype(dtype)
    return q, k, v, rng


# --------------------------------------------------------------------------- SDPA


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("batch,T,S,D,Dv", SHAPES)
def test_sdpa_float64_matches_numpy_core_both_paths(batch, T, S, D, Dv, masked, causal):
    q, k, v, rng = qkv(batch, T, S, D, Dv, seed=T * 31 + S)
    mask = rng.random((*batch, T, S)) < 0.6 if masked else None
    if mask is not None and T > 2:
        mask[..., 1, :] = False  # one fully masked row: output 0, weights 0
    bias = 0.3 * rng.standard_normal((T, S))
    ref_out, ref_w = attnlab.scaled_dot_product_attention(
        q, k, v, mask, bias=bias, is_causal=causal, return_weights=True
    )
    tm = None if mask is None else t(mask)
    fused = at.scaled_dot_product_attention(t(q), t(k), t(v), tm, bias=t(bias), is_causal=causal)
    plain, weights = at.scaled_dot_product_attention(
        t(q), t(k), t(v), tm, bias=t(bias), is_causal=causal, return_weights=True
    )
    # 1e-12 relative to max(1, |ref|): summation-order rounding only (see module docstring).
    assert err64(fused, ref_out) <= F64_TOL
    assert err64(plain, ref_out) <= F64_TOL
    assert err64(weights, ref_w) <= F64_TOL
    assert fused.dtype == plain.dtype == torch.float64
    assert tuple(fused.shape) == (*batch, T, Dv)


@pytest.mark.parametrize("batch,T,S,D,Dv", SHAPES[1:])
def test_sdpa_float32_within_1e6_of_float64_golden(batch, T, S, D, Dv):
    q, k, v, rng = qkv(batch, T, S, D, Dv, seed=5 + T, dtype=np.float32)
    mask = rng.random((*batch, T, S)) < 0.7
    golden = attnlab.scaled_dot_product_attention(  # float64 on the same float32 values
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask, is_causal=True
    )
    for return_weights in (False, True):
        result = at.scaled_dot_product_attention(
            t(q), t(k), t(v), t(mask), is_causal=True, return_weights=return_weights
        )
        out = result[0] if return_weights else result
        assert out.dtype == torch.float32
        # 1e-6 relative: float32 rounding of short dot products (eps 1.2e-7).
        assert rel_err(out, golden) <= F32_TOL


@pytest.mark.parametrize("batch,T,S,D,Dv", SHAPES)
def test_sdpa_matches_torch_functional_sdpa(batch, T, S, D, Dv):
    q, k, v, rng = qkv(batch, T, S, D, Dv, seed=11 * T + S)
    mask = rng.random((*batch, T, S)) < 0.6
    mask[..., 0] = True  # keep a key per row: torch's own rule for empty rows is not ours
    ours = at.scaled_dot_product_attention(t(q), t(k), t(v), t(mask), scale=0.37)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask), scale=0.37)
    assert err64(ours, theirs) <= F64_TOL  # 1e-12: same math, float64
    # Bottom-right causal equals torch's with the explicitly built mask (torch's flag is
    # top-left, so T != S differs).
    if T <= S:
        ours_c = at.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
        theirs_c = F.scaled_dot_product_attention(
            t(q), t(k), t(v), attn_mask=t(bottom_right(T, S))
        )
        assert err64(ours_c, theirs_c) <= F64_TOL  # 1e-12: same math, float64


def test_sdpa_square_causal_uses_torch_flag_and_matches():
    q, k, v, _ = qkv((2, 3), 8, 8, 4, 4, seed=1)
    ours = at.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
    assert err64(ours, theirs) <= F64_TOL  # 1e-12: same math, float64


def test_sdpa_broadcast_batch_dims_and_shared_kv_head():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 4, 8))  # (B, H, T, D)
    k = rng.standard_normal((2, 1, 6, 8))  # one K/V head shared by 3 query heads
    v = rng.standard_normal((1, 1, 6, 5))
    mask = np.array([[1, 1, 1, 1, 0, 0], [1] * 6], dtype=bool)[:, None, None, :]  # (B,1,1,S)
    ref = attnlab.scaled_dot_product_attention(q, k, v, mask)
    for rw in (False, True):
        out = at.scaled_dot_product_attention(t(q), t(k), t(v), t(mask), return_weights=rw)
        assert err64(out[0] if rw else out, ref) <= F64_TOL  # 1e-12: float64 rounding only


@pytest.mark.parametrize("T,S", [(5, 3), (4, 1), (3, 3)])
def test_sdpa_rows_with_nothing_to_attend_give_zero(T, S):
    q, k, v, _ = qkv((2,), T, S, 4, 3, seed=T + S)
    mask = np.ones((T, S), dtype=bool)
    mask[-1] = False  # the last query may attend to nothing
    bias = np.zeros((T, S))
    bias[0] = -np.inf  # the first query is blocked through the bias alone
    cases = [  # (kwargs for torch, kwargs for the core, rows that must be 0)
        ({"is_causal": True}, {"is_causal": True}, list(range(max(T - S, 0)))),
        ({"mask": t(mask)}, {"mask": mask}, [T - 1]),
        ({"bias": t(bias)}, {"bias": bias}, [0]),
    ]
    for torch_kw, core_kw, empty_rows in cases:
        ref, ref_w = attnlab.scaled_dot_product_attention(q, k, v, **core_kw, return_weights=True)
        fused = at.scaled_dot_product_attention(t(q), t(k), t(v), **torch_kw)
        plain, weights = at.scaled_dot_product_attention(
            t(q), t(k), t(v), **torch_kw, return_weights=True
        )
        assert not torch.isnan(fused).any() and not torch.isnan(weights).any()
        for row in empty_rows:  # exactly 0, as the core gives
            assert (fused[:, row] == 0).all() and (plain[:, row] == 0).all()
            assert (weights[:, row] == 0).all()
        # 1e-12 relative to max(1, |ref|): float64 rounding only.
        assert err64(fused, ref) <= F64_TOL and err64(plain, ref) <= F64_TOL
        assert err64(weights, ref_w) <= F64_TOL


def test_sdpa_empty_sizes_follow_the_core():
    for shape in [((2,), 3, 0, 4, 2), ((2,), 0, 3, 4, 2), ((0,), 2, 3, 4, 2)]:
        q, k, v, _ = qkv(*shape, seed=0)
        ref_out, ref_w = attnlab.scaled_dot_product_attention(q, k, v, return_weights=True)
        out = at.scaled_dot_product_attention(t(q), t(k), t(v))
        out_w, w = at.scaled_dot_product_attention(t(q), t(k), t(v), return_weights=True)
        assert tuple(out.shape) == ref_out.shape and tuple(w.shape) == ref_w.shape
        assert (out == 0).all() and (w == 0).all() and (out_w == 0).all()


def test_sdpa_integer_and_mixed_dtypes_promote_like_the_core():
    q = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])  # seed 000's X, integers
    ref = attnlab.scaled_dot_product_attention(q, q, q)
    out = at.scaled_dot_product_attention(t(q), t(q), t(q))
    assert out.dtype == torch.float64 and err64(out, ref) <= F64_TOL  # 1e-12
    mixed = at.scaled_dot_product_attention(t(q).float(), t(q).double(), t(q).float())
    assert mixed.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_half_dtypes_plain_path_computes_in_float32(dtype):
    q, k, v, _ = qkv((2,), 5, 6, 8, 8, seed=3)
    qh, kh, vh = (t(a).to(dtype) for a in (q, k, v))
    out, weights = at.scaled_dot_product_attention(qh, kh, vh, return_weights=True)
    assert out.dtype == weights.dtype == dtype
    expected = at.scaled_dot_product_attention(qh.float(), kh.float(), vh.float())
    assert torch.equal(out, expected.to(dtype))  # same float32 math, rounded once


@settings(max_examples=30, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    T=st.integers(1, 6),
    S=st.integers(1, 6),
    D=st.integers(1, 8),
    Dv=st.integers(1, 5),
    causal=st.booleans(),
    keep=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_sdpa_property_matches_core(batch, T, S, D, Dv, causal, keep, seed):
    q, k, v, rng = qkv(tuple(batch), T, S, D, Dv, seed=seed)
    mask = rng.random((*batch, T, S)) < keep  # any number of fully masked rows
    ref = attnlab.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
    out = at.scaled_dot_product_attention(t(q), t(k), t(v), t(mask), is_causal=causal)
    assert err64(out, ref) <= F64_TOL  # 1e-12: float64 rounding only


# --------------------------------------------------------------------------- modules


def numpy_mha(E=16, H=4, Hkv=None, seed=0, dtype=np.float64, **kw):
    mha = attnlab.MultiHeadAttention.init(H, E, num_kv_heads=Hkv, seed=seed, dtype=dtype, **kw)
    rng = np.random.default_rng(seed + 1)
    for name in ("bq", "bk", "bv", "bo"):  # non-zero biases, so they are tested too
        b = getattr(mha, name)
        setattr(mha, name, (0.1 * rng.standard_normal(b.shape)).astype(dtype))
    return mha


@pytest.mark.parametrize(
    "B,T,S,E,H,Hkv",
    [(2, 5, 5, 16, 4, None), (1, 3, 7, 16, 4, 2), (3, 6, 4, 24, 6, 1), (2, 1, 9, 8, 1, None),
     (None, 4, 6, 16, 8, 4)],
)
def test_mha_float64_matches_numpy_core(B, T, S, E, H, Hkv):
    core = numpy_mha(E, H, Hkv, seed=T + S)
    module = at.MultiHeadAttention.from_numpy(core).eval()
    rng = np.random.default_rng(2)
    lead = () if B is None else (B,)
    x = rng.standard_normal((*lead, T, E))
    ctx = rng.standard_normal((*lead, S, E))
    mask = rng.random((*lead, 1, T, S)) < 0.7 if B is not None else rng.random((T, S)) < 0.7
    kp = rng.random((*lead, S)) < 0.8
    for kw in ({}, {"is_causal": True}):
        ref_out, ref_w = core(x, ctx, mask=mask, key_padding=kp, return_weights=True, **kw)
        out, weights = module(t(x), t(ctx), t(ctx), mask=t(mask), key_padding=t(kp),
                              return_weights=True, **kw)
        fused, _ = module(t(x), t(ctx), t(ctx), mask=t(mask), key_padding=t(kp), **kw)
        # 1e-12 relative to max(1, |ref|): float64 rounding only.
        assert err64(out, ref_out) <= F64_TOL
        assert err64(fused, ref_out) <= F64_TOL
        assert err64(weights, ref_w) <= F64_TOL


def test_mha_float32_within_1e6_of_float64_golden():
    gen = torch.Generator().manual_seed(0)
    module = at.MultiHeadAttention(4, 32, num_kv_heads=2, generator=gen).eval()
    golden = module.to_numpy()  # float32 values, NumPy computes float64 from float64 inputs
    golden = attnlab.MultiHeadAttention(**{
        n: getattr(golden, n).astype(np.float64) for n in ("Wq", "Wk", "Wv", "Wo")
    }, bq=golden.bq.astype(np.float64), bk=golden.bk.astype(np.float64),
        bv=golden.bv.astype(np.float64), bo=golden.bo.astype(np.float64),
        num_heads=4, num_kv_heads=2)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))
    ref, _ = golden(x.double().numpy(), is_causal=True)
    out, _ = module(x, x, x, is_causal=True)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) <= F32_TOL  # 1e-6: float32 rounding of dot products of <= 32 terms


@pytest.mark.parametrize("B,T,S,E,H,kdim", [(2, 5, 5, 16, 4, None), (3, 4, 7, 12, 3, 10),
                                            (1, 6, 2, 8, 8, None)])
def test_mha_matches_torch_nn_multihead_attention(B, T, S, E, H, kdim):
    gen = torch.Generator().manual_seed(B + T)
    ours = at.MultiHeadAttention(H, E, d_context=kdim, generator=gen, dtype=torch.float64)
    with torch.no_grad():  # non-zero biases
        for lin in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
            lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=gen))
    ours.eval()
    theirs = at.to_torch_multihead(ours).eval()
    x = torch.randn(B, T, E, generator=gen, dtype=torch.float64)
    ctx = torch.randn(B, S, kdim or E, generator=gen, dtype=torch.float64)
    mask = torch.rand(T, S, generator=gen) < 0.7
    mask[:, 0] = True  # nn.MultiheadAttention gives NaN for rows with nothing to attend to
    kp = torch.rand(B, S, generator=gen) < 0.8
    kp[:, 0] = True
    out, w = ours(x, ctx, ctx, mask=mask, key_padding=kp, return_weights=True)
    # nn.MultiheadAttention's masks mean the opposite: True = blocked.
    ref, ref_w = theirs(x, ctx, ctx, attn_mask=~mask, key_padding_mask=~kp,
                        need_weights=True, average_attn_weights=False)
    assert err64(out, ref) <= F64_TOL  # 1e-12: float64 rounding only
    assert err64(w, ref_w) <= F64_TOL
    back = at.from_torch_multihead(theirs).eval()
    assert torch.equal(back(x, ctx, ctx, mask=mask, key_padding=kp)[0],
                       ours(x, ctx, ctx, mask=mask, key_padding=kp)[0])


def test_mha_float32_matches_torch_nn_multihead_fast_path():
    ours = at.MultiHeadAttention(4, 32, generator=torch.Generator().manual_seed(0)).eval()
    theirs = at.to_torch_multihead(ours).eval()
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():  # nn.MultiheadAttention takes its fused fast path here
        ref = theirs(x, x, x, need_weights=False)[0]
        out, _ = ours(x, x, x)
    assert rel_err(out, ref) <= F32_TOL  # 1e-6: two float32 computations of the same math


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_self_attention_layer_matches_numpy_core(norm):
    core = attnlab.SelfAttentionLayer(16, 4, dropout=0.1, norm=norm,
                                      num_kv_heads=2, seed=3)
    core.norm1.gamma = np.linspace(0.5, 1.5, 16)
    core.norm1.beta = np.linspace(-0.2, 0.2, 16)
    module = at.SelfAttentionLayer.from_numpy(core)
    assert not module.training and module.norm == norm  # core layers start in eval
    x = np.random.default_rng(0).standard_normal((2, 7, 16))
    mask = np.random.default_rng(1).random((7, 7)) < 0.8
    for kw in ({}, {"is_causal": True}):
        # 1e-12 relative to max(1, |ref|): float64 rounding only.
        assert err64(module(t(x), mask=t(mask), **kw), core(x, mask=mask, **kw)) <= F64_TOL


def test_layer_norm_matches_numpy_core():
    core = attnlab.LayerNorm(8, eps=1e-3, gamma=np.arange(1.0, 9.0), beta=np.ones(8))
    module = at.LayerNorm.from_numpy(core)
    x = np.random.default_rng(0).standard_normal((3, 4, 8)) * 5 + 2
    assert err64(module(t(x)), core(x)) <= F64_TOL  # 1e-12: float64 rounding only


def test_positional_encoding_matches_numpy_core():
    core = attnlab.positional.SinusoidalPositionalEncoding(12, max_len=64)
    module = at.PositionalEncoding.from_numpy(core)
    x = np.random.default_rng(0).standard_normal((2, 10, 12))
    assert err64(module(t(x)), core(x)) <= F64_TOL  # 1e-12: float64 sin/cos, same formula
    assert err64(module(t(x[:, :3]), offset=7), core(x[:, :3], offset=7)) <= F64_TOL
    x32 = x.astype(np.float32)
    # float32: both add the float64 table rounded once to float32 -> identical bits
    assert torch.equal(module(t(x32)), t(core(x32)))


# --------------------------------------------------------------------------- RoPE / ALiBi


def core_mha_with_positions(core, x, ctx, *, rope=None, alibi=False, is_causal=False,
                            base=10000.0):
    """The NumPy reference for a module with rope/alibi, written out from the core's pieces."""
    from attnlab.nn.multihead import merge_heads
    from attnlab.positional_relative import alibi_bias, apply_rope

    q, k, v = core.project(x, ctx)  # (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
    T, S = q.shape[-2], k.shape[-2]
    if rope is not None:
        q = apply_rope(q, positions=S - T, interleaved=rope, base=base)
        k = apply_rope(k, interleaved=rope, base=base)
    k, v = core.expand_kv(k), core.expand_kv(v)
    bias = alibi_bias(core.num_heads, T, S) if alibi else None
    heads = attnlab.scaled_dot_product_attention(q, k, v, bias=bias, is_causal=is_causal)
    return merge_heads(heads) @ core.Wo + core.bo


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("T,S", [(6, 6), (2, 7)])
def test_mha_rope_matches_numpy_apply_rope(interleaved, T, S):
    core = numpy_mha(16, 4, 2, seed=4)
    plain = at.MultiHeadAttention.from_numpy(core)
    module = at.MultiHeadAttention(4, 16, num_kv_heads=2, rope=True, rope_interleaved=interleaved,
                                   dtype=torch.float64)
    module.load_state_dict(plain.state_dict())
    rng = np.random.default_rng(5)
    x, ctx = rng.standard_normal((2, T, 16)), rng.standard_normal((2, S, 16))
    ref = core_mha_with_positions(core, x, ctx, rope=interleaved, is_causal=True)
    out, _ = module(t(x), t(ctx), t(ctx), is_causal=True)
    assert err64(out, ref) <= F64_TOL  # 1e-12: float64 rounding only


@pytest.mark.parametrize("H", [4, 6])
def test_mha_alibi_matches_numpy_alibi_bias(H):
    core = numpy_mha(24, H, seed=6)
    plain = at.MultiHeadAttention.from_numpy(core)
    module = at.MultiHeadAttention(H, 24, alibi=True, dtype=torch.float64)
    module.load_state_dict(plain.state_dict())
    rng = np.random.default_rng(7)
    x, ctx = rng.standard_normal((2, 3, 24)), rng.standard_normal((2, 8, 24))
    ref = core_mha_with_positions(core, x, ctx, alibi=True, is_causal=True)
    for return_weights in (False, True):
        out, _ = module(t(x), t(ctx), t(ctx), is_causal=True, return_weights=return_weights)
        assert err64(out, ref) <= F64_TOL  # 1e-12


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_and_alibi_carry_over_to_numpy_and_back(interleaved):
    module = at.MultiHeadAttention(4, 16, num_kv_heads=2, rope=True, alibi=True,
                                   rope_interleaved=interleaved, rope_base=500.0,
                                   dtype=torch.float64)
    core = module.to_numpy()
    assert core.rope is not None and core.rope.interleaved == interleaved and core.alibi
    rng = np.random.default_rng(8)
    x, ctx = rng.standard_normal((2, 3, 16)), rng.standard_normal((2, 7, 16))
    ref = core_mha_with_positions(core, x, ctx, rope=interleaved, alibi=True, is_causal=True,
                                  base=500.0)
    # The NumPy class's own rope/alibi equal the reference written out from its pieces ...
    np.testing.assert_allclose(core(x, ctx, is_causal=True)[0], ref, atol=1e-12)
    # ... and the module built back from it equals the original module.
    back = at.MultiHeadAttention.from_numpy(core)
    assert back.rope and back.alibi and back.rope_base == 500.0
    out, _ = module(t(x), t(ctx), t(ctx), is_causal=True)
    assert err64(out, ref) <= F64_TOL  # 1e-12: float64 rounding only
    assert err64(back(t(x), t(ctx), t(ctx), is_causal=True)[0], ref) <= F64_TOL


def test_numpy_rope_refuses_more_queries_than_keys():
    core = at.MultiHeadAttention(2, 8, rope=True, dtype=torch.float64).to_numpy()
    with pytest.raises(attnlab.AttnlabError, match=r"x: RoPE places queries at positions "
                                                   r"S - T \.\. S - 1, expected T <= S"):
        core(np.zeros((1, 5, 8)), np.zeros((1, 3, 8)))


# --------------------------------------------------------------------------- bfloat16


def _bf16_rule(ours: torch.Tensor, plain_bf16: torch.Tensor, golden: np.ndarray) -> None:
    ours_err = np.abs(ours.detach().double().numpy() - golden).max()
    plain_err = np.abs(plain_bf16.detach().double().numpy() - golden).max()
    # FlashAttention's rule: no more than 2x the error of the plain bfloat16 computation.
    assert ours_err <= 2 * plain_err, (ours_err, plain_err)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_bfloat16_by_flash_attention_rule(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    golden = attnlab.scaled_dot_product_attention(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), is_causal=causal
    )
    scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(32))  # plain bf16 PyTorch
    if causal:
        scores = scores.masked_fill(~torch.ones(64, 64, dtype=torch.bool).tril(), float("-inf"))
    plain_bf16 = torch.softmax(scores, dim=-1) @ v
    fused = at.scaled_dot_product_attention(q, k, v, is_causal=causal)
    plain_path, _ = at.scaled_dot_product_attention(q, k, v, is_causal=causal, return_weights=True)
    assert fused.dtype == plain_path.dtype == torch.bfloat16
    _bf16_rule(fused, plain_bf16, golden)
    _bf16_rule(plain_path, plain_bf16, golden)


def test_mha_bfloat16_by_flash_attention_rule():
    module = at.MultiHeadAttention(4, 64, generator=torch.Generator().manual_seed(0))
    module = module.to(torch.bfloat16).eval()
    golden_core = module.to_numpy()  # bf16 values, exactly representable in float32
    golden_core = attnlab.MultiHeadAttention(
        **{n: golden_core.parameters()[n].astype(np.float64)
           for n in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")},
        num_heads=4,
    )
    x = torch.randn(2, 48, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    golden, _ = golden_core(x.double().numpy(), is_causal=True)

    def heads(y):  # (B, T, 64) -> (B, 4, T, 16)
        return y.view(2, 48, 4, 16).transpose(1, 2)

    q, k, v = heads(module.q_proj(x)), heads(module.k_proj(x)), heads(module.v_proj(x))
    scores = (q @ k.transpose(-1, -2)) * 0.25
    scores = scores.masked_fill(~torch.ones(48, 48, dtype=torch.bool).tril(), float("-inf"))
    merged = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 48, 64)
    plain_bf16 = module.out_proj(merged)  # plain bf16 PyTorch, step by step
    with torch.inference_mode():
        out, _ = module(x, x, x, is_causal=True)
        out_w, _ = module(x, x, x, is_causal=True, return_weights=True)
    _bf16_rule(out, plain_bf16, golden)
    _bf16_rule(out_w, plain_bf16, golden)
