"""NumPy backward passes against torch autograd, in float64.

Tolerance 1e-9 (absolute and relative): both sides compute the same sums in a
different order, so they differ by a few ulps times the condition of the sums,
~1e-15 on these O(1) shapes; 1e-9 is the issue's bar and still six orders below
what a wrong term in a formula produces.

The torch references are written independently of attnlab: an explicit-math
attention (with attnlab's rule that a fully masked row gives 0), torch's own
``F.scaled_dot_product_attention`` (bool ``attn_mask`` also means True = take
part), ``nn.MultiheadAttention`` and ``F.layer_norm``. Causal masks for torch
are built explicitly bottom-right, since torch's ``is_causal`` is top-left
when T != S.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnlab import LayerNorm, MultiHeadAttention  # noqa: E402
from attnlab.backward import sdpa_backward  # noqa: E402
from attnlab.nn.backward import layer_norm_backward, mha_backward  # noqa: E402

TOL = {"rtol": 1e-9, "atol": 1e-9}  # see the module docstring
F = torch.nn.functional


def bottom_right_causal(T: int, S: int) -> np.ndarray:
    """Written out here rather than imported: query i may see keys j <= S - T + i."""
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)  # (T, S)


def leaf(arr: np.ndarray) -> torch.Tensor:
    return torch.tensor(arr, dtype=torch.float64, requires_grad=True)


def torch_attention(q, k, v, allowed=None, bias=None, scale=None):
    """Explicit-math attention; rows with nothing allowed give weights 0 (attnlab's rule)."""
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    scaled = q @ k.transpose(-1, -2) * scale  # (..., T, S)
    if bias is not None:
        scaled = scaled + bias
    if allowed is None:
        allowed = torch.ones(scaled.shape, dtype=torch.bool)
    allowed = allowed & torch.isfinite(scaled)
    alive = allowed.any(dim=-1, keepdim=True)  # (..., T, 1)
    # Dead rows get finite scores (so no NaN even in the backward), then weight 0.
    safe = torch.where(alive, scaled.masked_fill(~allowed, float("-inf")), 0.0)
    weights = torch.softmax(safe, dim=-1) * alive  # (..., T, S)
    return weights @ v


def assert_close(ours: np.ndarray, theirs: torch.Tensor, name: str) -> None:
    assert ours.shape == tuple(theirs.shape), name
    np.testing.assert_allclose(ours, theirs.detach().numpy(), **TOL, err_msg=name)


# ------------------------------------------------------------ dot-product attention


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    batch=st.sampled_from([(), (2,), (2, 3)]),
    T=st.integers(1, 4), S=st.integers(1, 5), D=st.integers(1, 4), Dv=st.integers(1, 4),
    use_mask=st.booleans(), use_bias=st.booleans(), is_causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sdpa_matches_torch_autograd(batch, T, S, D, Dv, use_mask, use_bias, is_causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((*batch, T, D)), rng.standard_normal((*batch, S, D)),
               rng.standard_normal((*batch, S, Dv)))
    G = rng.standard_normal((*batch, T, Dv))
    mask = rng.random((*batch, T, S)) < 0.6 if use_mask else None  # may kill whole rows
    bias = rng.standard_normal((T, S)) if use_bias else None  # broadcast over the batch
    ours = sdpa_backward(q, k, v, G, mask, bias=bias, is_causal=is_causal)

    allowed = np.ones((T, S), dtype=bool) if mask is None else mask
    if is_causal:
        allowed = allowed & bottom_right_causal(T, S)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    tbias = None if bias is None else leaf(bias)
    out = torch_attention(tq, tk, tv, torch.tensor(allowed), tbias)
    (out * torch.tensor(G)).sum().backward()
    for name, mine, tensor in (("dq", ours.dq, tq), ("dk", ours.dk, tk), ("dv", ours.dv, tv)):
        assert_close(mine, tensor.grad, name)
    if bias is None:
        assert ours.dbias is None
    else:
        assert_close(ours.dbias, tbias.grad, "dbias")


@pytest.mark.parametrize("T, S", [(3, 3), (2, 5)])
def test_sdpa_matches_torch_sdpa_with_mask_bias_scale(T, S):
    """torch's own op: bool mask + bias folded into its float attn_mask, bottom-right causal."""
    rng = np.random.default_rng(T * 10 + S)
    q, k, v = rng.standard_normal((2, 2, T, 4)), rng.standard_normal((2, 2, S, 4)), \
        rng.standard_normal((2, 2, S, 3))
    G = rng.standard_normal((2, 2, T, 3))
    bias = rng.standard_normal((2, 1, T, S))  # per batch, shared by the heads
    allowed = bottom_right_causal(T, S)
    ours = sdpa_backward(q, k, v, G, bias=bias, is_causal=True, scale=0.7)
    plain = sdpa_backward(q, k, v, G, allowed)

    tq, tk, tv, tbias = leaf(q), leaf(k), leaf(v), leaf(bias)
    float_mask = tbias.masked_fill(~torch.tensor(allowed), float("-inf"))
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=float_mask, scale=0.7)
    (out * torch.tensor(G)).sum().backward()
    for name, mine, tensor in (("dq", ours.dq, tq), ("dk", ours.dk, tk), ("dv", ours.dv, tv),
                               ("dbias", ours.dbias, tbias)):
        assert_close(mine, tensor.grad, name)

    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(allowed))
    (out * torch.tensor(G)).sum().backward()
    for name, mine, tensor in (("dq", plain.dq, tq), ("dk", plain.dk, tk), ("dv", plain.dv, tv)):
        assert_close(mine, tensor.grad, name)


def test_fully_masked_rows_match_torch_reference_and_are_zero():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), \
        rng.standard_normal((2, 5, 2))
    G = rng.standard_normal((2, 4, 2))
    mask = rng.random((2, 4, 5)) < 0.7
    mask[0, 2] = False
    mask[1, :2] = False
    ours = sdpa_backward(q, k, v, G, mask)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    (torch_attention(tq, tk, tv, torch.tensor(mask)) * torch.tensor(G)).sum().backward()
    for name, mine, tensor in (("dq", ours.dq, tq), ("dk", ours.dk, tk), ("dv", ours.dv, tv)):
        assert np.isfinite(mine).all(), name
        assert_close(mine, tensor.grad, name)
    assert np.all(ours.dq[0, 2] == 0.0) and np.all(ours.dq[1, :2] == 0.0)


# ------------------------------------------------------------- multi-head attention


def torch_mha(mha: MultiHeadAttention, x, context, allowed=None, bias=None):
    """The same multi-head attention in torch, on leaf copies of ``mha``'s parameters."""
    params = {name: leaf(p) for name, p in mha.parameters().items()}
    H, Hkv = mha.num_heads, mha.num_kv_heads

    def project(inputs, w, b, heads):
        y = inputs @ params[w] + (params[b] if b in params else 0.0)  # (B, L, heads*dim)
        B, L, width = y.shape
        return y.reshape(B, L, heads, width // heads).transpose(1, 2)  # (B, heads, L, dim)

    q = project(x, "Wq", "bq", H)
    k = project(context, "Wk", "bk", Hkv).repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D)
    v = project(context, "Wv", "bv", Hkv).repeat_interleave(H // Hkv, dim=1)  # (B, H, S, Dv)
    heads = torch_attention(q, k, v, allowed, bias)  # (B, H, T, Dv)
    B, _, T, Dv = heads.shape
    merged = heads.transpose(1, 2).reshape(B, T, H * Dv)  # (B, T, H*Dv)
    out = merged @ params["Wo"] + (params["bo"] if "bo" in params else 0.0)
    return out, params


@pytest.mark.parametrize("cross", [False, True])
def test_mha_gqa_matches_torch_autograd(cross):
    rng = np.random.default_rng(11)
    # H = 6 query heads over Hkv = 2 kv heads, D = 2, Dv = 3 (Dv != D), E = 8, E_out = 5.
    Ekv = 7 if cross else 8
    mha = MultiHeadAttention(
        Wq=rng.standard_normal((8, 12)), Wk=rng.standard_normal((Ekv, 4)),
        Wv=rng.standard_normal((Ekv, 6)), Wo=rng.standard_normal((18, 5)),
        num_heads=6, num_kv_heads=2, bq=rng.standard_normal(12), bk=rng.standard_normal(4),
        bv=rng.standard_normal(6), bo=rng.standard_normal(5),
    )
    T, S = 3, (5 if cross else 3)
    x = rng.standard_normal((2, T, 8))
    context = rng.standard_normal((2, S, Ekv)) if cross else None
    mask = rng.random((2, 1, T, S)) < 0.8
    bias = rng.standard_normal((6, T, S))  # per head, like ALiBi
    G = rng.standard_normal((2, T, 5))
    ours = mha_backward(mha, x, G, context, mask, bias=bias, is_causal=True)

    tx = leaf(x)
    tctx = leaf(context) if cross else tx
    tbias = leaf(bias)
    allowed = torch.tensor(mask & bottom_right_causal(T, S))
    out, params = torch_mha(mha, tx, tctx, allowed, tbias)
    np.testing.assert_allclose(
        mha(x, context, mask=mask, bias=bias, is_causal=True)[0], out.detach().numpy(), **TOL
    )
    (out * torch.tensor(G)).sum().backward()
    for name, tensor in params.items():
        assert_close(ours.params[name], tensor.grad, name)
    assert_close(ours.dx, tx.grad, "dx")
    assert_close(ours.dbias, tbias.grad, "dbias")
    if cross:
        assert_close(ours.dcontext, tctx.grad, "dcontext")


def test_mha_matches_nn_multihead_attention_with_key_padding():
    rng = np.random.default_rng(5)
    mha = MultiHeadAttention.init(2, 8, seed=2)
    mha.bq, mha.bk, mha.bv, mha.bo = (rng.standard_normal(8) for _ in range(4))
    x = rng.standard_normal((2, 4, 8))
    key_padding = np.array([[True, True, True, False], [True, True, True, True]])
    G = rng.standard_normal((2, 4, 8))
    ours = mha_backward(mha, x, G, key_padding=key_padding)

    reference = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.tensor(np.concatenate([mha.Wq, mha.Wk, mha.Wv], 1).T))
        reference.in_proj_bias.copy_(torch.tensor(np.concatenate([mha.bq, mha.bk, mha.bv])))
        reference.out_proj.weight.copy_(torch.tensor(mha.Wo.T))
        reference.out_proj.bias.copy_(torch.tensor(mha.bo))
    tx = leaf(x)
    # torch's key_padding_mask is True = ignore: the opposite of attnlab's.
    out, _ = reference(tx, tx, tx, key_padding_mask=torch.tensor(~key_padding), need_weights=False)
    (out * torch.tensor(G)).sum().backward()
    d_in = np.concatenate([ours.params["Wq"], ours.params["Wk"], ours.params["Wv"]], 1).T
    assert_close(d_in, reference.in_proj_weight.grad, "in_proj_weight")
    d_in_bias = np.concatenate([ours.params["bq"], ours.params["bk"], ours.params["bv"]])
    assert_close(d_in_bias, reference.in_proj_bias.grad, "in_proj_bias")
    assert_close(ours.params["Wo"].T, reference.out_proj.weight.grad, "out_proj.weight")
    assert_close(ours.params["bo"], reference.out_proj.bias.grad, "out_proj.bias")
    assert_close(ours.dx, tx.grad, "dx")


# ---------------------------------------------------------------------- LayerNorm


def test_layer_norm_matches_torch():
    rng = np.random.default_rng(3)
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    x, G = rng.standard_normal((2, 3, 6)) * 2 + 0.5, rng.standard_normal((2, 3, 6))
    ours = layer_norm_backward(LayerNorm(6, 1e-5, gamma=gamma, beta=beta), x, G)
    tx, tgamma, tbeta = leaf(x), leaf(gamma), leaf(beta)
    (F.layer_norm(tx, (6,), tgamma, tbeta, 1e-5) * torch.tensor(G)).sum().backward()
    assert_close(ours.dx, tx.grad, "dx")
    assert_close(ours.dgamma, tgamma.grad, "dgamma")
    assert_close(ours.dbeta, tbeta.grad, "dbeta")
