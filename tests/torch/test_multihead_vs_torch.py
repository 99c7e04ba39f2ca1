"""MultiHeadAttention against torch.nn.MultiheadAttention and F.scaled_dot_product_attention.

The NumPy-only tests (a per-head loop, seed 000's class, validation) are in
tests/core/test_multihead.py; the random parameters come from tests/support/modules.py.

Mask conventions differ and are converted explicitly:

- attnlab ``mask``: bool, True = may attend; ``key_padding`` (B, S): True = real token.
- ``torch.nn.MultiheadAttention``: the OPPOSITE for both ``attn_mask`` and
  ``key_padding_mask``: True = NOT allowed / padding. We pass ``~allowed`` and ``~key_padding``.
- ``torch.nn.functional.scaled_dot_product_attention``: bool True = takes part, the same
  as attnlab, so the mask is passed unchanged.

Tolerances (see ``TOL``): both sides compute the same O(E) sums of products, in a different
order. In float64 that leaves errors of a few ulps of O(1) values, far below 1e-12. In
float32 the same reasoning gives a few ulps of 1.2e-7, so 1e-6 relative (with 1e-6 absolute
for entries that happen to be near 0, where a relative bound means nothing).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.support.modules import random_allowed, random_key_padding, random_params

from attnlab.masks import causal_mask
from attnlab.nn.multihead import MultiHeadAttention

#: rtol/atol per dtype; the reasons are in the module docstring.
TOL = {
    np.float64: {"rtol": 1e-12, "atol": 1e-12},
    np.float32: {"rtol": 1e-6, "atol": 1e-6},
}


TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def torch_mha_like(mha: MultiHeadAttention, dtype) -> torch.nn.MultiheadAttention:
    """A torch.nn.MultiheadAttention holding the same parameters as ``mha``.

    torch stores Linear weights (out, in); attnlab stores (in, out), hence the transposes.
    """
    E = mha.Wq.shape[0]
    Ekv = mha.Wk.shape[0]
    has_bias = mha.bq is not None
    ref = torch.nn.MultiheadAttention(
        E, mha.num_heads, bias=has_bias, batch_first=True, kdim=Ekv, vdim=Ekv,
        dtype=TORCH_DTYPE[dtype],
    )
    ref.eval()  # dropout is 0.0 anyway; eval makes that explicit
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(t(np.concatenate([mha.Wq.T, mha.Wk.T, mha.Wv.T])))
        else:  # kdim/vdim != embed_dim: torch keeps three separate projections
            ref.q_proj_weight.copy_(t(mha.Wq.T))
            ref.k_proj_weight.copy_(t(mha.Wk.T))
            ref.v_proj_weight.copy_(t(mha.Wv.T))
        ref.out_proj.weight.copy_(t(mha.Wo.T))
        if has_bias:
            ref.in_proj_bias.copy_(t(np.concatenate([mha.bq, mha.bk, mha.bv])))
            ref.out_proj.bias.copy_(t(mha.bo))
    return ref


def run_torch_mha(ref, x, context, *, allowed=None, key_padding=None, is_causal=False):
    """Call torch's MHA with attnlab-convention masks, converting them to torch's.

    Parameters keep requires_grad=True, so torch takes its plain (non fast-path) route.
    """
    attn_mask = None if allowed is None else t(~allowed)  # torch: True = NOT allowed
    kpm = None if key_padding is None else t(~key_padding)  # torch: True = padding
    out, weights = ref(
        t(x), t(context), t(context), attn_mask=attn_mask, key_padding_mask=kpm,
        need_weights=True, average_attn_weights=False, is_causal=is_causal,
    )
    return out.detach().numpy(), weights.detach().numpy()


# ------------------------------------------------------------ vs torch.nn.MultiheadAttention

MASK_CASES = ["none", "attn_mask", "key_padding", "causal", "all"]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", MASK_CASES)
def test_self_attention_matches_torch_mha(dtype, bias, case):
    rng = np.random.default_rng(0)
    B, T, E, H = 3, 5, 8, 2
    mha = random_params(rng, E, H, bias=bias, dtype=dtype)
    x = rng.standard_normal((B, T, E)).astype(dtype)
    allowed = random_allowed(rng, T, T) if case in ("attn_mask", "all") else None
    key_padding = random_key_padding(B, T) if case in ("key_padding", "all") else None
    is_causal = case in ("causal", "all")

    ours, our_weights = mha(
        x, mask=allowed, key_padding=key_padding, is_causal=is_causal, return_weights=True
    )

    # torch only honours is_causal as a hint: with need_weights=True it needs the mask itself.
    torch_allowed = allowed
    if is_causal:
        causal = causal_mask(T)
        torch_allowed = causal if allowed is None else (allowed & causal)
    ref = torch_mha_like(mha, dtype)
    expected, expected_weights = run_torch_mha(
        ref, x, x, allowed=torch_allowed, key_padding=key_padding, is_causal=is_causal
    )

    assert ours.dtype == dtype and our_weights.dtype == dtype
    assert ours.shape == (B, T, E) and our_weights.shape == (B, H, T, T)
    # TOL[dtype]: same O(E) sums in a different order (module docstring).
    np.testing.assert_allclose(ours, expected, **TOL[dtype])
    np.testing.assert_allclose(our_weights, expected_weights, **TOL[dtype])
    if allowed is not None or key_padding is not None or is_causal:
        # The masked entries must be exactly 0 on both sides, not merely small.
        blocked = expected_weights == 0
        assert blocked.any()
        assert (our_weights[blocked] == 0).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("Ekv", [8, 6])  # 8 = E (packed in_proj), 6 != E (torch kdim/vdim)
def test_cross_attention_matches_torch_mha(dtype, Ekv):
    rng = np.random.default_rng(1)
    B, T, S, E, H = 2, 3, 7, 8, 2  # T != S: queries and keys come from different sequences
    mha = random_params(rng, E, H, Ekv=Ekv, dtype=dtype)
    x = rng.standard_normal((B, T, E)).astype(dtype)
    context = rng.standard_normal((B, S, Ekv)).astype(dtype)
    allowed = random_allowed(rng, T, S)
    key_padding = random_key_padding(B, S)

    ours, our_weights = mha(x, context, mask=allowed, key_padding=key_padding, return_weights=True)
    ref = torch_mha_like(mha, dtype)
    expected, expected_weights = run_torch_mha(
        ref, x, context, allowed=allowed, key_padding=key_padding
    )

    assert our_weights.shape == (B, H, T, S)
    # TOL[dtype]: same O(E) sums in a different order (module docstring).
    np.testing.assert_allclose(ours, expected, **TOL[dtype])
    np.testing.assert_allclose(our_weights, expected_weights, **TOL[dtype])


def test_cross_attention_causal_is_bottom_right_aligned():
    """With T < S, attnlab's is_causal lets query i see keys j <= S - T + i.

    torch.nn.MultiheadAttention has no cross-attention causal rule of its own, so it gets
    the bottom-right mask written out by hand here (not via attnlab.masks).
    """
    rng = np.random.default_rng(2)
    B, T, S, E, H = 2, 3, 5, 8, 4
    mha = random_params(rng, E, H)
    x = rng.standard_normal((B, T, E))
    context = rng.standard_normal((B, S, E))
    bottom_right = np.array(
        [[j <= S - T + i for j in range(S)] for i in range(T)]
    )  # (T, S)

    ours, our_weights = mha(x, context, is_causal=True, return_weights=True)
    expected, expected_weights = run_torch_mha(
        torch_mha_like(mha, np.float64), x, context, allowed=bottom_right
    )
    # float64, same sums in a different order: 1e-12.
    np.testing.assert_allclose(ours, expected, **TOL[np.float64])
    np.testing.assert_allclose(our_weights, expected_weights, **TOL[np.float64])


@pytest.mark.parametrize("H, Hkv", [(4, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_matches_torch_sdpa_enable_gqa(H, Hkv):
    rng = np.random.default_rng(3)
    B, T, S, E, D = 2, 4, 6, 12, 3
    mha = random_params(rng, E, H, Hkv=Hkv, D=D)
    x = rng.standard_normal((B, T, E))
    context = rng.standard_normal((B, S, E))
    allowed = random_allowed(rng, T, S)

    ours, _ = mha(x, context, mask=allowed)

    # Independent torch path: project, split heads, SDPA with enable_gqa, merge, project.
    xt, ct = t(x), t(context)
    q = (xt @ t(mha.Wq) + t(mha.bq)).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = (ct @ t(mha.Wk) + t(mha.bk)).view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
    v = (ct @ t(mha.Wv) + t(mha.bv)).view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
    # SDPA's bool mask means True = takes part, the same as attnlab: no inversion here.
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=t(allowed), enable_gqa=True)
    expected = heads.transpose(1, 2).reshape(B, T, H * D) @ t(mha.Wo) + t(mha.bo)  # (B, T, E)

    # float64, same sums in a different order: 1e-12.
    np.testing.assert_allclose(ours, expected.numpy(), **TOL[np.float64])


def test_gqa_with_causal_matches_torch_sdpa():
    rng = np.random.default_rng(5)
    B, T, E, H, Hkv, D = 1, 5, 8, 4, 2, 2
    mha = random_params(rng, E, H, Hkv=Hkv, D=D)
    x = rng.standard_normal((B, T, E))
    ours, _ = mha(x, is_causal=True)

    xt = t(x)
    q = (xt @ t(mha.Wq) + t(mha.bq)).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = (xt @ t(mha.Wk) + t(mha.bk)).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    v = (xt @ t(mha.Wv) + t(mha.bv)).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = heads.transpose(1, 2).reshape(B, T, H * D) @ t(mha.Wo) + t(mha.bo)
    # float64, same sums in a different order: 1e-12.
    np.testing.assert_allclose(ours, expected.numpy(), **TOL[np.float64])


def test_unbatched_matches_torch_mha():
    """tests/core/test_multihead.py checks unbatched == batched; torch also accepts (T, E)."""
    rng = np.random.default_rng(6)
    T, S, E, H = 4, 5, 8, 2
    mha = random_params(rng, E, H)
    x = rng.standard_normal((T, E))
    context = rng.standard_normal((S, E))
    allowed = random_allowed(rng, T, S)
    key_padding = np.array([True, True, True, False, True])

    out, weights = mha(x, context, mask=allowed, key_padding=key_padding, return_weights=True)
    expected, expected_weights = run_torch_mha(
        torch_mha_like(mha, np.float64), x, context, allowed=allowed, key_padding=key_padding
    )
    # float64, same sums in a different order: 1e-12.
    np.testing.assert_allclose(out, expected, **TOL[np.float64])
    np.testing.assert_allclose(weights, expected_weights, **TOL[np.float64])


def test_torch_mha_gives_nan_on_fully_masked_row_where_attnlab_gives_zero():
    rng = np.random.default_rng(9)
    B, T, E, H = 1, 3, 4, 2
    mha = random_params(rng, E, H, bias=False)
    x = rng.standard_normal((B, T, E))
    allowed = np.array([[True, False, False], [False, False, False], [True, True, False]])

    ours, weights = mha(x, mask=allowed, return_weights=True)
    expected, _ = run_torch_mha(torch_mha_like(mha, np.float64), x, x, allowed=allowed)
    assert np.isnan(expected[0, 1]).all()
    assert (ours[0, 1] == 0).all() and (weights[0, :, 1] == 0).all()
    # float64, reordered sums: 1e-12.
    np.testing.assert_allclose(ours[0, [0, 2]], expected[0, [0, 2]], **TOL[np.float64])

