"""The kernel's options against the peers that define them, on every path.

Each option is checked once per path (plain ``scaled_dot_product_attention``
and ``sdpa_backward``, ``flash_attention`` and its backward, attnlab.torch) and
against its peer's own semantics:

- ``causal_alignment="top_left"``: torch's ``F.scaled_dot_product_attention(is_causal=True)``
  for T != S (torch's causal is top-left), gradients by torch autograd;
- ``window=(left, right)``: FlashAttention's ``attention_ref`` with ``window_size``
  (``fa_attention_ref`` in test_flash_attn.py), -1 = unbounded, causal or not;
- ``softcap``: FlashAttention's ``attention_ref`` with ``softcap``
  (``scores = tanh(scores / softcap) * softcap`` on the scaled scores, before masking
  and ALiBi), written out below in float64; gradients by torch autograd;
- ``enable_gqa``: torch's ``F.scaled_dot_product_attention(enable_gqa=True)``;
- ``alibi_slopes``: FlashAttention's ``attn_bias_from_alibi_slopes`` (``fa_alibi_bias``);
- ``return_lse``: ``torch.logsumexp`` of the masked scaled scores, -inf for a row
  with nothing to attend to (the flash path's value);
- dropout: the formula ``(softmax · keep / (1 - p)) v`` with a supplied keep-mask,
  the same mask given to attnlab.torch, gradients by torch autograd.

Tolerances: float64 outputs to 1e-12 and gradients to 1e-10 (as test_flash_attn.py:
values of O(1), sums of at most a few hundred terms, each rounding ~1e-16). float32
by FlashAttention's 2x rule: the error against the float64 golden on the same
rounded inputs is at most twice that of a plain float32 reference, plus 1e-7 (one
float32 ulp at 1) for the gradient sums.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
import attnlab.torch as at
from attnlab import AttnlabError
from attnlab.backward import sdpa_backward
from attnlab.fast.flash import flash_attention, flash_attention_backward
from attnlab.masks import window_mask

from ._reference import assert_close, assert_two_x_rule, reference_attention
from .test_flash_attn import fa_alibi_bias, fa_attention_ref, fa_local_mask

F64_TOL = 1e-12
F64_GRAD_TOL = 1e-10
BLOCKS = {"block_q": 8, "block_k": 8}


def qkv(seed, B, H, Hkv, T, S, D=8, Dv=6, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, T, D)) * scale, rng.standard_normal((B, Hkv, S, D)) * scale,
            rng.standard_normal((B, Hkv, S, Dv)), rng.standard_normal((B, H, T, Dv)))


def all_paths(q, k, v, dout, **options):
    """out, lse and (dq, dk, dv) from the plain path, flash and attnlab.torch (autograd)."""
    out, lse = attnlab.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    grads = sdpa_backward(q, k, v, dout, **options)[:3]
    f_out, f_lse = flash_attention(q, k, v, return_lse=True, **BLOCKS, **options)
    f_grads = flash_attention_backward(q, k, v, f_out, f_lse, dout, **BLOCKS, **options)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    t_options = {key: torch.tensor(val) if isinstance(val, np.ndarray) else val
                 for key, val in options.items()}
    t_out, t_lse = at.scaled_dot_product_attention(tq, tk, tv, return_lse=True, **t_options)
    (t_out * torch.tensor(dout)).sum().backward()
    t_grads = tuple(t.grad.numpy() for t in (tq, tk, tv))
    return {
        "plain": (out, lse, grads),
        "flash": (f_out, f_lse, f_grads),
        "torch": (t_out.detach().numpy(), t_lse.detach().numpy(), t_grads),
    }


def check_all(paths, out_ref, lse_ref, grads_ref, *, what=""):
    for name, (out, lse, grads) in paths.items():
        assert_close(out, out_ref, atol=F64_TOL, what=f"{what} {name} out")
        assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref)), f"{what} {name} empty rows"
        finite = np.where(np.isneginf(lse_ref), 0.0, lse_ref)
        assert_close(np.where(np.isneginf(lse), 0.0, lse), finite, atol=F64_TOL,
                     what=f"{what} {name} lse")
        for label, g, g_ref in zip("qkv", grads, grads_ref, strict=True):
            assert_close(g, g_ref, atol=F64_GRAD_TOL, what=f"{what} {name} d{label}")


def torch_reference(q, k, v, dout, *, allowed=None, softcap=None, bias=None, groups=1,
                    keep=None, p=0.0):
    """The formula in float64 torch ops, written out: gradients by autograd.

    allowed: bool (..., T, S) or None; bias (..., T, S) added after the cap; groups:
    each key/value head repeated for that many query heads (torch's enable_gqa).
    """
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    kk, vv = tk.repeat_interleave(groups, dim=-3), tv.repeat_interleave(groups, dim=-3)
    scores = tq @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + torch.tensor(bias)
    if allowed is not None:
        scores = scores.masked_fill(~torch.tensor(allowed), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))  # empty rows: 0, attnlab's rule
    if keep is not None:
        weights = weights * torch.tensor(keep) / (1 - p)
    out = weights @ vv
    (out * torch.tensor(dout)).sum().backward()
    return (out.detach().numpy(), lse.detach().numpy(),
            tuple(t.grad.numpy() for t in (tq, tk, tv)))


# --------------------------------------------------------------------- causal alignment
# pytorch/pytorch:test/test_transformers.py::test_causal_variants[CausalVariant.UPPER_LEFT]:
# torch's is_causal (and causal_upper_left) is top-left: query i sees keys j <= i for T != S.

@pytest.mark.parametrize("T,S", [(5, 11), (11, 5), (9, 9), (1, 7)])
def test_top_left_causal_matches_torch_is_causal(T, S):
    q, k, v, dout = qkv(T * 31 + S, 2, 3, 3, T, S)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    peer = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # torch: top-left
    (peer * torch.tensor(dout)).sum().backward()
    allowed = np.tril(np.ones((T, S), bool))  # torch's documented upper-left mask
    _, _, lse_ref = reference_attention(q, k, v, allowed)
    grads_ref = tuple(t.grad.numpy() for t in (tq, tk, tv))
    paths = all_paths(q, k, v, dout, is_causal=True, causal_alignment="top_left")
    check_all(paths, peer.detach().numpy(), lse_ref, grads_ref, what="top_left")
    assert np.array_equal(attnlab.causal_mask(T, S, causal_alignment="top_left"), allowed)
    assert torch.equal(at.causal_mask(T, S, causal_alignment="top_left"), torch.tensor(allowed))


def test_the_two_alignments_agree_when_T_equals_S_and_differ_otherwise():
    q, k, v, _ = qkv(3, 1, 2, 2, 6, 6)
    a = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="top_left")
    assert_close(a, b, atol=0.0, what="T == S")
    q2 = q[..., :3, :]
    a2 = attnlab.scaled_dot_product_attention(q2, k, v, is_causal=True)
    b2 = attnlab.scaled_dot_product_attention(q2, k, v, is_causal=True,
                                              causal_alignment="top_left")
    assert np.abs(a2 - b2).max() > 0.1  # T < S: bottom-right rows see 3 more keys


# ------------------------------------------------------------------------------ windows
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[local=True]
# with every window_size it draws (asymmetric, even, one side unbounded), causal or not.

WINDOWS = [(0, 0), (3, 0), (2, 5), (4, 1), (-1, 2), (3, -1), (6, 6), (0, 3)]


@pytest.mark.parametrize("window_size", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(16, 16), (9, 21), (21, 9)])
def test_window_matches_flash_attention_window_size(T, S, window_size, causal):
    B, H = 2, 2
    q, k, v, dout = qkv(T * 7 + S + sum(window_size) * 3, B, H, H, T, S)
    # -1 = unbounded. FlashAttention's kernel substitutes seqlen_k for one side at -1
    # (flash_api.cpp), which is unbounded unless T > S (then queries sit at negative
    # positions); its reference's construct_local_mask wants a count: T + S reaches every key.
    fa_window = tuple(T + S if side < 0 else side for side in window_size)
    fa_out, _, _ = fa_attention_ref(*(np.swapaxes(a, 1, 2) for a in (q, k, v)), causal=causal,
                                    window_size=fa_window)
    out_ref = np.swapaxes(fa_out, 1, 2)
    win = fa_window if not causal else (fa_window[0], 0)
    allowed = ~fa_local_mask(T, S, win)[0, 0]
    _, lse_ref, grads_ref = torch_reference(q, k, v, dout, allowed=allowed)
    paths = all_paths(q, k, v, dout, window=window_size, is_causal=causal)
    check_all(paths, out_ref, lse_ref, grads_ref, what=f"window {window_size}")
    mask = window_mask(T, S, window=window_size, is_causal=causal)
    assert np.array_equal(mask, allowed)
    assert np.array_equal(at.window_mask(T, S, window=window_size, is_causal=causal).numpy(),
                          allowed)
    sw = attnlab.sliding_window_attention(q, k, v, window_size, is_causal=causal)
    assert_close(sw, out_ref, atol=F64_TOL, what="sliding_window_attention")
    assert np.array_equal(attnlab.sliding_window_mask(T, window_size, is_causal=causal, S=S),
                          mask)


def test_flash_skips_the_tiles_outside_the_window():
    q, k, v, _ = qkv(1, 1, 1, 1, 256, 256)
    stats = attnlab.FlashStats()
    flash_attention(q, k, v, window=(16, 16), block_q=32, block_k=32, stats=stats)
    # 8 query blocks; each reaches its own key block and one on each side (the edges one).
    assert (stats.computed, stats.skipped) == (8 * 3 - 2, 64 - (8 * 3 - 2))
    stats = attnlab.FlashStats()
    flash_attention(q, k, v, is_causal=True, causal_alignment="top_left", block_q=32,
                    block_k=32, stats=stats)
    assert (stats.computed, stats.skipped) == (36, 28)  # the lower triangle of 8 x 8 blocks


def test_an_int_window_keeps_its_meaning():
    q, k, v, _ = qkv(2, 1, 2, 2, 12, 12)
    for W, causal in ((4, True), (5, False)):
        mask = attnlab.sliding_window_mask(12, W, is_causal=causal)
        expected = attnlab.scaled_dot_product_attention(q, k, v, mask)
        for out in (attnlab.scaled_dot_product_attention(q, k, v, window=W, is_causal=causal),
                    flash_attention(q, k, v, window=W, is_causal=causal, **BLOCKS)):
            assert_close(out, expected, atol=F64_TOL, what=f"W = {W}")
    with pytest.raises(AttnlabError, match=r"^window: a symmetric window .* W must be odd"):
        attnlab.scaled_dot_product_attention(q, k, v, window=4)


# ----------------------------------------------------------------------------- soft cap
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[softcap=...]:
# attention_ref applies tanh(scores / softcap) * softcap to the scaled scores, then the
# masks and the ALiBi bias. Gemma 2 caps attention logits at 50; small caps bend more.

@pytest.mark.parametrize("softcap", [0.5, 2.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_matches_flash_attention_reference(softcap, causal):
    q, k, v, dout = qkv(int(softcap * 10) + causal, 2, 3, 3, 13, 19, scale=2.0)
    allowed = attnlab.causal_mask(13, 19) if causal else None
    out_ref, lse_ref, grads_ref = torch_reference(q, k, v, dout, allowed=allowed,
                                                  softcap=softcap)
    paths = all_paths(q, k, v, dout, softcap=softcap, is_causal=causal)
    check_all(paths, out_ref, lse_ref, grads_ref, what=f"softcap {softcap}")


def test_softcap_bounds_the_scores_and_zero_means_off():
    q, k, v, _ = qkv(5, 1, 1, 1, 4, 4, scale=30.0)
    _, weights = attnlab.scaled_dot_product_attention(q, k, v, softcap=1.0, return_weights=True)
    # every capped score lies in (-1, 1): no weight can exceed e^2 / (e^2 + 3 e^-2 ...)
    assert weights.max() <= np.exp(1) / (np.exp(1) + 3 * np.exp(-1)) + 1e-12
    plain = attnlab.scaled_dot_product_attention(q, k, v)
    assert_close(attnlab.scaled_dot_product_attention(q, k, v, softcap=0.0), plain, atol=0.0)


# -------------------------------------------------------------------------- enable_gqa
# pytorch/pytorch:test/test_transformers.py::test_scaled_dot_product_attention_gqa (enable_gqa).

@pytest.mark.parametrize("H,Hkv", [(6, 2), (4, 1), (3, 3)])
def test_enable_gqa_matches_torch(H, Hkv):
    q, k, v, dout = qkv(H * 10 + Hkv, 2, H, Hkv, 7, 10)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    peer = F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    (peer * torch.tensor(dout)).sum().backward()
    _, lse_ref, _ = torch_reference(q, k, v, dout, groups=H // Hkv)
    grads_ref = tuple(t.grad.numpy() for t in (tq, tk, tv))
    paths = all_paths(q, k, v, dout, enable_gqa=True)
    check_all(paths, peer.detach().numpy(), lse_ref, grads_ref, what=f"gqa {H}/{Hkv}")


def test_enable_gqa_refuses_heads_that_do_not_divide():
    q, k, v, _ = qkv(0, 1, 5, 2, 3, 3)
    message = r"^k: expected a number of key/value heads Hkv that divides q's H = 5 heads"
    for call in (lambda: attnlab.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 lambda: flash_attention(q, k, v, enable_gqa=True),
                 lambda: at.scaled_dot_product_attention(
                     *(torch.tensor(a) for a in (q, k, v)), enable_gqa=True)):
        with pytest.raises(AttnlabError, match=message):
            call()
    with pytest.raises(AttnlabError, match=r"^q: expected \(\.\.\., H, T, D\) with enable_gqa"):
        attnlab.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0], enable_gqa=True)


# -------------------------------------------------------------------------------- ALiBi
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[alibi=True]:
# alibi_slopes (B, H) = torch.rand * 0.3, or one (H,) set; attn_bias_from_alibi_slopes.

@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(8, 8), (5, 13), (13, 5)])
def test_alibi_slopes_match_flash_attention(T, S, causal, per_batch):
    B, H = 3, 4
    rng = np.random.default_rng(T * S + causal)
    slopes = rng.random((B, H)) * 0.3 if per_batch else rng.random(H) * 0.3
    q, k, v, dout = qkv(T + S, B, H, H, T, S)
    fa_bias = fa_alibi_bias(np.broadcast_to(slopes, (B, H)), T, S, causal)
    fa_out, _, _ = fa_attention_ref(*(np.swapaxes(a, 1, 2) for a in (q, k, v)),
                                    attn_bias=fa_bias, causal=causal)
    allowed = attnlab.causal_mask(T, S) if causal else None
    # attnlab's -slope·|i' - j| (FlashAttention's non-causal bias; with causal it differs
    # from FlashAttention's causal bias by a per-row constant, so lse differs: take ours)
    ours = attnlab.alibi_bias(H, T, S, slopes=slopes)
    if not causal:
        assert_close(np.broadcast_to(ours, fa_bias.shape), fa_bias, atol=F64_TOL, what="bias")
    _, lse_ref, grads_ref = torch_reference(q, k, v, dout, allowed=allowed, bias=ours)
    paths = all_paths(q, k, v, dout, alibi_slopes=slopes, is_causal=causal)
    check_all(paths, np.swapaxes(fa_out, 1, 2), lse_ref, grads_ref, what="alibi")
    t_bias = at.alibi_bias(H, T, S, slopes=torch.tensor(slopes))
    assert_close(t_bias.numpy(), ours, atol=0.0, what="torch alibi_bias")


def test_alibi_slopes_default_are_the_papers():
    assert_close(attnlab.alibi_bias(8, 3, 5, slopes=attnlab.alibi_slopes(8)),
                 attnlab.alibi_bias(8, 3, 5), atol=0.0)
    with pytest.raises(AttnlabError, match=r"^slopes: expected \(4,\) or \(B, 4\)"):
        attnlab.alibi_bias(4, 3, 3, slopes=np.ones(3))
    q, k, v, _ = qkv(0, 2, 4, 4, 3, 3)
    with pytest.raises(AttnlabError, match=r"^alibi_slopes: expected \(H,\) or \(B, H\)"):
        flash_attention(q, k, v, alibi_slopes=np.ones((2, 4, 1)))
    with pytest.raises(AttnlabError, match=r"^alibi_slopes: expected a shape broadcastable"):
        attnlab.scaled_dot_product_attention(q, k, v, alibi_slopes=np.ones(3))


# -------------------------------------------------------------------------- return_lse
# google/jax:tests/nn_test.py dot_product_attention(..., return_residual=True) / flash's
# softmax_lse: natural log of Σ exp(scaled scores) per query; -inf for a row with no key.

def test_return_lse_agrees_on_every_path_with_fully_masked_rows():
    q, k, v, dout = qkv(9, 2, 2, 2, 6, 8)
    mask = np.ones((2, 1, 6, 8), bool)
    mask[0, :, 2] = False  # a row with nothing to attend to
    out_ref, lse_ref, grads_ref = torch_reference(q, k, v, dout, allowed=mask)
    assert np.isneginf(lse_ref[0, :, 2]).all()  # torch.logsumexp's value too
    paths = all_paths(q, k, v, dout, mask=mask)
    check_all(paths, out_ref, lse_ref, grads_ref, what="lse")
    out, weights, lse = attnlab.scaled_dot_product_attention(q, k, v, mask, return_weights=True,
                                                             return_lse=True)
    assert lse.dtype == np.float64 and lse.shape == (2, 2, 6)
    assert_close(weights.sum(-1)[1], np.ones((2, 6)), atol=1e-15)


# ------------------------------------------------------------------------------ dropout
# torch's dropout on the weights: kept weights scaled by 1 / (1 - p); attnlab's NumPy core
# takes the keep-mask (or draws it from a seeded rng), so the twins can be compared.

def test_dropout_with_a_supplied_mask_matches_the_torch_twin_and_autograd():
    p = 0.3
    q, k, v, dout = qkv(11, 2, 2, 2, 5, 7)
    keep = np.random.default_rng(1).random((2, 2, 5, 7)) >= p
    out_ref, _, grads_ref = torch_reference(q, k, v, dout, allowed=attnlab.causal_mask(5, 7),
                                            keep=keep, p=p)
    out = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p,
                                               dropout_mask=keep)
    grads = sdpa_backward(q, k, v, dout, is_causal=True, dropout_p=p, dropout_mask=keep)
    t_out = at.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)),
                                            is_causal=True, dropout_p=p,
                                            dropout_mask=torch.tensor(keep))
    assert_close(out, out_ref, atol=F64_TOL, what="numpy")
    assert_close(t_out.numpy(), out_ref, atol=F64_TOL, what="torch twin")
    for label, g, g_ref in zip("qkv", grads[:3], grads_ref, strict=True):
        assert_close(g, g_ref, atol=F64_GRAD_TOL, what=f"d{label}")


def test_dropout_from_a_seed_is_reproducible_and_drops_about_p():
    q, k, v, dout = qkv(12, 4, 4, 4, 32, 32)
    a = attnlab.scaled_dot_product_attention(q, k, v, dropout_p=0.25, rng=7,
                                             return_weights=True)[1]
    b = attnlab.scaled_dot_product_attention(q, k, v, dropout_p=0.25,
                                             rng=np.random.default_rng(7), return_weights=True)[1]
    assert np.array_equal(a, b)
    dropped = float(np.mean(a == 0))
    assert 0.23 < dropped < 0.27  # 16k Bernoulli(0.25) draws: sd 0.0034, this is 5 sd
    with pytest.raises(AttnlabError, match=r"^rng: expected a np.random.Generator or an int"):
        attnlab.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(AttnlabError, match=r"^dropout_p: expected a probability in \[0, 1\)"):
        attnlab.scaled_dot_product_attention(q, k, v, dropout_p=1.0, rng=0)


# ------------------------------------------------------------------- everything at once

def test_every_option_together_on_every_path():
    B, H, Hkv, T, S = 2, 4, 2, 11, 23
    q, k, v, dout = qkv(21, B, H, Hkv, T, S, scale=1.5)
    slopes = np.random.default_rng(2).random((B, H)) * 0.3
    options = dict(window=(5, 2), is_causal=True, causal_alignment="top_left", softcap=3.0,
                   enable_gqa=True, alibi_slopes=slopes)
    allowed = window_mask(T, S, window=(5, 2), is_causal=True, causal_alignment="top_left")
    distance = np.abs(np.arange(T)[:, None] - np.arange(S)[None, :])  # top-left: i' = i
    bias = -slopes[..., None, None] * distance
    out_ref, lse_ref, grads_ref = torch_reference(q, k, v, dout, allowed=allowed, softcap=3.0,
                                                  bias=bias, groups=H // Hkv)
    check_all(all_paths(q, k, v, dout, **options), out_ref, lse_ref, grads_ref, what="all")


# ----------------------------------------------------------- float32: the 2x rule

@pytest.mark.parametrize("options", [
    dict(window=(3, 4)), dict(softcap=2.0, is_causal=True), dict(enable_gqa=True),
    dict(is_causal=True, causal_alignment="top_left"),
], ids=["window", "softcap", "gqa", "top_left"])
def test_float32_by_flash_attentions_two_x_rule(options):
    B, H, T, S = 2, 4, 40, 56
    Hkv = 2 if options.get("enable_gqa") else H
    q, k, v, dout = (a.astype(np.float32) for a in qkv(3, B, H, Hkv, T, S, D=16, Dv=16))
    golden = attnlab.scaled_dot_product_attention(
        *(a.astype(np.float64) for a in (q, k, v)), **options)
    g_golden = sdpa_backward(*(a.astype(np.float64) for a in (q, k, v, dout)), **options)[:3]
    baseline = attnlab.scaled_dot_product_attention(q, k, v, **options)  # plain float32
    g_base = sdpa_backward(q, k, v, dout, **options)[:3]
    out, lse = flash_attention(q, k, v, return_lse=True, **BLOCKS, **options)
    grads = flash_attention_backward(q, k, v, out, lse, dout, **BLOCKS, **options)
    assert out.dtype == np.float32
    assert_two_x_rule(out, baseline, golden, what="flash out")
    for label, g, b, gold in zip("qkv", grads, g_base, g_golden, strict=True):
        assert_two_x_rule(g, b, gold, slack=1e-7, what=f"flash d{label}")
    t_out = at.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)),
                                            **options).numpy()
    assert_two_x_rule(t_out, baseline, golden, what="torch out")


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs,message", [
    (dict(window=(1, 2, 3)), r"^window: expected an int W or a pair \(left, right\), got 3"),
    (dict(window=(-2, 0)), r"^window: expected left >= -1 \(-1 = unbounded\), got -2"),
    (dict(window=(1.5, 0)), r"^window: expected \(left = an int >= -1, \.\.\.\)"),
    (dict(causal_alignment="upper_left"),
     r"^causal_alignment: expected 'bottom_right' or 'top_left', got 'upper_left'"),
    (dict(softcap=-1.0), r"^softcap: expected a finite real number > 0 or None, got -1.0"),
    (dict(softcap="big"), r"^softcap: expected a real number > 0 or None"),
    (dict(enable_gqa=1), r"^enable_gqa: expected True or False"),
    (dict(return_lse="yes"), r"^return_lse: expected True or False"),
])
def test_bad_options_are_named(kwargs, message):
    q, k, v, _ = qkv(0, 1, 2, 2, 3, 3)
    with pytest.raises(AttnlabError, match=message):
        attnlab.scaled_dot_product_attention(q, k, v, **kwargs)
    if "return_lse" not in kwargs:
        with pytest.raises(AttnlabError, match=message):
            flash_attention(q, k, v, **kwargs)
    with pytest.raises(AttnlabError, match=message):
        at.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), **kwargs)


# ------------------------------------------------------------ the window table of docs/kernel.md
# Each row: the peer's own mask, built as its code builds it, against attnlab's setting;
# then attention with attnlab's window against attention with the peer's mask.

def hf_current(T, S, W):  # transformers sliding_window_overlay & causal: kv > q - W, kv <= q
    q_idx, kv_idx = np.arange(T)[:, None] + (S - T), np.arange(S)[None, :]
    return (kv_idx > q_idx - W) & (kv_idx <= q_idx)


def hf_old(T, S, W):  # AttentionMaskConverter._make_causal_mask(sliding_window=W), 0 = attend
    past = S - T
    causal = np.arange(S)[None, :] <= np.arange(T)[:, None] + past
    context = np.tril(np.ones((T, S), dtype=bool), k=past - W - 1)
    return causal & ~context


def hf_bidirectional(T, S, W):  # |q - kv| <= W, positions aligned at the end
    return np.abs(np.arange(T)[:, None] + (S - T) - np.arange(S)[None, :]) <= W


def fa_window_size(T, S, left, right, causal):  # construct_local_mask, right = 0 if causal
    return ~fa_local_mask(T, S, (left, 0 if causal else right))[0, 0]


def jax_local_window(T, S, window):  # jax.nn.dot_product_attention's _apply_masks
    left, right = (window, window) if isinstance(window, int) else window
    qpos, kpos = np.arange(T)[:, None], np.arange(S)[None, :]
    return (qpos <= kpos + left) & (qpos >= kpos - right)


def mistral_reference(T, W):  # one_file_ref.py: triu(tril(ones, 0), -sliding_window)
    return np.triu(np.tril(np.ones((T, T), dtype=bool), 0), -W)


WINDOW_ROWS = [
    ("hf current", lambda T, S: hf_current(T, S, 4), dict(window=4, is_causal=True)),
    ("hf current as a pair", lambda T, S: hf_current(T, S, 4),
     dict(window=(3, 0), is_causal=True)),
    ("hf old", lambda T, S: hf_old(T, S, 4), dict(window=(4, 0), is_causal=True)),
    ("hf bidirectional", lambda T, S: hf_bidirectional(T, S, 3), dict(window=(3, 3))),
    ("flash_attn", lambda T, S: fa_window_size(T, S, 5, 2, False), dict(window=(5, 2))),
    ("flash_attn causal", lambda T, S: fa_window_size(T, S, 5, 2, True),
     dict(window=(5, 2), is_causal=True)),
    ("jax pair", lambda T, S: jax_local_window(T, S, (2, 3)),
     dict(window=(2, 3), causal_alignment="top_left")),
    ("jax int", lambda T, S: jax_local_window(T, S, 2),
     dict(window=(2, 2), causal_alignment="top_left")),
    # Mistral's reference builds the square prefill mask; T new queries are its last T rows.
    ("mistral", lambda T, S: mistral_reference(S, 4)[S - T:], dict(window=(4, 0), is_causal=True)),
]


@pytest.mark.parametrize("T,S", [(12, 12), (7, 15)])
@pytest.mark.parametrize("name,peer_mask,options", WINDOW_ROWS, ids=[r[0] for r in WINDOW_ROWS])
def test_window_table(name, peer_mask, options, T, S):
    peer = peer_mask(T, S)
    ours = window_mask(T, S, **options)
    assert np.array_equal(ours, peer), f"{name}: attnlab's {options} is not the peer's mask"
    q, k, v, _ = qkv(T + S, 1, 2, 2, T, S)
    expected = attnlab.scaled_dot_product_attention(q, k, v, peer)
    for out in (attnlab.scaled_dot_product_attention(q, k, v, **options),
                flash_attention(q, k, v, **BLOCKS, **options),
                at.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)),
                                                **options).numpy()):
        assert_close(out, expected, atol=F64_TOL, what=name)


# ------------------------------------------------------------------------------ bfloat16
# NumPy bfloat16 (ml_dtypes) is computed in float32 and returned as bfloat16, as torch
# does on CPU. The golden is float64 on the same bfloat16 values; torch's own bfloat16
# F.scaled_dot_product_attention (and autograd) is the baseline of the 2x rule.

@pytest.mark.parametrize("options", [dict(is_causal=True), dict(window=(5, 3), softcap=4.0)],
                         ids=["causal", "window+softcap"])
def test_bfloat16_inputs_compute_in_float32_like_torch_on_cpu(options):
    bf16 = ml_dtypes.bfloat16  # a test extra, pinned in constraints.txt
    q, k, v, dout = (a.astype(bf16) for a in qkv(17, 2, 4, 4, 33, 40, D=16, Dv=16))
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    golden = attnlab.scaled_dot_product_attention(*wide[:3], **options)
    g_golden = sdpa_backward(*wide, **options)[:3]
    tq, tk, tv = (torch.tensor(a.astype(np.float32)).to(torch.bfloat16).requires_grad_()
                  for a in (q, k, v))
    t_options = dict(options)
    mask = torch.tensor(window_mask(33, 40, window=options.get("window"),
                                    is_causal=options.get("is_causal", False)))
    if "softcap" in options:  # torch has no soft cap: the formula in bfloat16 ops
        s = tq @ tk.transpose(-1, -2) / 4.0
        s = (torch.tanh(s / 4.0) * 4.0).masked_fill(~mask, float("-inf"))
        peer = torch.softmax(s, dim=-1) @ tv
    else:
        peer = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    (peer.float() * torch.tensor(dout.astype(np.float32))).sum().backward()
    for name, out in (("plain", attnlab.scaled_dot_product_attention(q, k, v, **options)),
                      ("flash", flash_attention(q, k, v, **BLOCKS, **options))):
        assert out.dtype == bf16, name
        assert_two_x_rule(out, peer.detach().float().numpy(), golden, what=name)
        # computed in float32: at most one rounding to bfloat16 away from the golden
        ulp = np.abs(golden) * 2.0**-8 + 1e-30
        assert np.all(np.abs(out.astype(np.float64) - golden) <= ulp), name
    grads = sdpa_backward(q, k, v, dout, **t_options)[:3]
    for label, g, t, gold in zip("qkv", grads, (tq, tk, tv), g_golden, strict=True):
        assert g.dtype == bf16
        assert_two_x_rule(g, t.grad.float().numpy(), gold, what=f"d{label}")


# ------------------------------------------------------------------------- the KV caches
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_kvcache (local=True,
# softcap): cached decoding (a prefill chunk, then one token at a time) equals the full
# forward with the same options, in both twins.

@pytest.mark.parametrize("options", [dict(softcap=0.7), dict(window=(3, 0)),
                                     dict(window=4, softcap=2.0)], ids=["softcap", "window",
                                                                        "both"])
def test_kv_cache_attend_takes_softcap_and_window(options):
    B, H, Hkv, T, D = 2, 4, 2, 12, 8
    q, k, v, _ = qkv(31, B, H, Hkv, T, T, D=D, Dv=D)
    full = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                **options)
    steps = [slice(0, 5)] + [slice(i, i + 1) for i in range(5, T)]
    cache, t_cache = attnlab.KVCache(B, Hkv, D), at.KVCache(B, Hkv, D, dtype=torch.float64)
    out = np.concatenate([cache.attend(q[:, :, s], k[:, :, s], v[:, :, s], **options)
                          for s in steps], axis=2)
    t_out = torch.cat([t_cache.attend(*(torch.tensor(a[:, :, s]) for a in (q, k, v)), **options)
                       for s in steps], dim=2)
    assert_close(out, full, atol=F64_TOL, what="KVCache")
    assert_close(t_out.numpy(), full, atol=F64_TOL, what="attnlab.torch KVCache")


def test_sliding_window_cache_takes_softcap():
    B, H, Hkv, T, D, W = 2, 4, 2, 12, 8, 4
    q, k, v, _ = qkv(32, B, H, Hkv, T, T, D=D, Dv=D)
    full = attnlab.scaled_dot_product_attention(q, k, v, window=W, is_causal=True,
                                                enable_gqa=True, softcap=0.5)
    steps = [slice(0, 6)] + [slice(i, i + 1) for i in range(6, T)]
    cache = attnlab.SlidingWindowKVCache(B, Hkv, D, window=W)
    t_cache = at.SlidingWindowKVCache(B, Hkv, D, window=W, dtype=torch.float64)
    out = np.concatenate([cache.attend(q[:, :, s], k[:, :, s], v[:, :, s], softcap=0.5)
                          for s in steps], axis=2)
    t_out = torch.cat([t_cache.attend(*(torch.tensor(a[:, :, s]) for a in (q, k, v)),
                                      softcap=0.5) for s in steps], dim=2)
    assert_close(out, full, atol=F64_TOL, what="SlidingWindowKVCache")
    assert_close(t_out.numpy(), full, atol=F64_TOL, what="attnlab.torch SlidingWindowKVCache")


# ------------------------------------------------------------------- multi-head attention
# Gemma 2's attention: the soft cap on the logits of every head, inside the module.

def test_multi_head_attention_takes_softcap_in_both_twins():
    num_heads, d_model, T = 4, 16, 9
    mha = attnlab.MultiHeadAttention.init(num_heads, d_model, seed=0)
    x = np.random.default_rng(5).standard_normal((2, T, d_model)) * 3
    out, weights = mha(x, is_causal=True, softcap=1.0, return_weights=True)
    # the formula by hand on the module's own projections
    q, k, v = mha.project(x, x)
    k = mha.expand_kv(k)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(attnlab.causal_mask(T), np.tanh(s), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert_close(weights, w, atol=F64_TOL, what="weights")
    t_mha = at.MultiHeadAttention.from_numpy(mha)
    xt = torch.tensor(x)
    t_out, _ = t_mha(xt, xt, xt, is_causal=True, softcap=1.0)
    assert_close(t_out.detach().numpy(), out, atol=F64_TOL, what="torch twin")
    plain, _ = mha(x, is_causal=True)
    assert np.abs(plain - out).max() > 1e-3  # the cap changes the result at these scales


def test_torch_lse_is_differentiable_by_autograd():
    # d lse_i / d q_i = scale · Σ_j P_ij k_j (the softmax's mean key); a row with nothing to
    # attend to has lse -inf and passes no gradient.
    q, k, v, _ = qkv(40, 1, 2, 2, 5, 7)
    mask = np.ones((5, 7), bool)
    mask[3] = False
    tq = torch.tensor(q, requires_grad=True)
    _, lse = at.scaled_dot_product_attention(tq, torch.tensor(k), torch.tensor(v),
                                             torch.tensor(mask), return_lse=True)
    lse.masked_fill(torch.isneginf(lse), 0.0).sum().backward()
    _, weights, _ = reference_attention(q, k, v, mask)
    expected = weights @ k / np.sqrt(q.shape[-1])
    assert_close(tq.grad.numpy(), expected, atol=F64_GRAD_TOL, what="d lse / d q")


# JAX's local_window_size is top-left; so is sliding_window_attention with causal_alignment.
@pytest.mark.parametrize("T,S", [(7, 15), (15, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_attention_takes_the_top_left_alignment(T, S, causal):
    q, k, v, _ = qkv(T * S, 2, 2, 2, T, S)
    peer = jax_local_window(T, S, (2, 3))
    if causal:
        peer = peer & np.tril(np.ones((T, S), bool))
    expected = attnlab.scaled_dot_product_attention(q, k, v, peer)
    got = attnlab.sliding_window_attention(q, k, v, (2, 3), is_causal=causal,
                                           causal_alignment="top_left", global_tokens=[1, 5])
    mask = attnlab.sliding_window_mask(T, (2, 3), is_causal=causal, S=S,
                                       causal_alignment="top_left", global_tokens=[1, 5])
    with_globals = attnlab.scaled_dot_product_attention(q, k, v, mask)
    assert_close(got, with_globals, atol=F64_TOL, what="sparse vs its mask")
    t_mask = at.sliding_window_mask(T, (2, 3), is_causal=causal, S=S,
                                    causal_alignment="top_left", global_tokens=[1, 5])
    assert np.array_equal(t_mask.numpy(), mask)
    plain = attnlab.sliding_window_attention(q, k, v, (2, 3), is_causal=causal,
                                             causal_alignment="top_left")
    assert_close(plain, expected, atol=F64_TOL, what="sparse vs JAX's local window")
