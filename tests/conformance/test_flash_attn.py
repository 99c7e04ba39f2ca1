"""Conformance with FlashAttention's reference semantics (Dao-AILab/flash-attention).

The reference is FlashAttention's ``attention_ref`` (tests/test_flash_attn.py),
re-implemented here in float64 NumPy: ``fa_attention_ref`` below, in its
(batch, seqlen, heads, head_dim) layout, with its masks
(``construct_local_mask``), its ALiBi bias (``attn_bias_from_alibi_slopes``),
its key/query padding masks and its handling of grouped key/value heads.
Each test names the FlashAttention test it mirrors
(Dao-AILab/flash-attention:tests/test_flash_attn.py::<name>).

Convention map (FlashAttention -> attnlab):

- layout (B, T, H, D) -> attnlab's (..., T, D): transpose to (B, H, T, D).
- ``causal=True`` is bottom-right aligned in FlashAttention (query i at
  position i + S - T): exactly attnlab's ``is_causal=True``, including T > S,
  where the first T - S rows see nothing and give 0 in both.
- MQA/GQA (nheads_k < nheads; query head h reads key head h // G): attnlab
  broadcasts q (B, Hk, G, T, D) against k, v (B, Hk, 1, S, D); gradients for
  k, v are summed over the G axis by attnlab's backward, as the reference's
  ``repeat`` sums them.
- ``window_size=(W - 1, 0)`` (with or without causal) is attnlab's causal
  sliding window of W keys (itself included); ``(w, w)`` is attnlab's
  symmetric window ``causal=False`` of W = 2w + 1; ``causal=True`` with
  ``(left, right)`` ignores right, as FlashAttention does.
- ``key_padding_mask`` (True = real key) is part of attnlab's bool ``mask``;
  ``query_padding_mask`` rows are fully masked in attnlab, which returns 0 for
  them, the value FlashAttention's reference fills in. With padding, the
  reference aligns causality to each sequence's true lengths (varlen); in
  attnlab that is ``causal_mask(len_q, len_k)`` placed in the sequence's corner.
- ALiBi slopes -> attnlab's ``alibi_bias``; FlashAttention's causal bias is
  ``slope * (j - S + 1)``, a per-row shift of attnlab's ``-slope * |i + S - T - j|``
  on the allowed keys, so softmax gives the same weights.
- ``flash_attn_with_kvcache`` (one cache length for the whole batch) ->
  attnlab's KVCache / SlidingWindowKVCache; ``softmax_lse`` -> ``return_lse``;
  split-KV combination -> ``merge_partials``.

Tolerances: float64 against the float64 reference to 1e-12 (outputs, weights of
O(1)) and 1e-10 (gradients, sums of more terms). float32 by FlashAttention's
rule: the error against the float64 reference (on the same rounded inputs) is
at most 2x that of a plain float32 reference computed with the scale moved onto
k (``reorder_ops=True``), plus 1e-7 (one float32 ulp at 1) of slack for the
gradient sums it accumulates over.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab

from ._reference import (
    assert_close,
    assert_two_x_rule,
    reference_attention,
    reference_backward,
)

F64_TOL = 1e-12  # float64 outputs of O(1)
F64_GRAD_TOL = 1e-10  # float64 gradients: longer sums, larger values
BLOCKS = {"block_q": 8, "block_k": 8}  # several tiles even at these small sizes


# ----------------------------------------------------------------- the reference


def fa_local_mask(T, S, window, q_lens=None, k_lens=None):
    """FlashAttention's construct_local_mask: True = masked OUT. -> (B | 1, 1, T, S).

    Query i sits at i + sk - sq (sk, sq: the true lengths when padding masks are
    given); keys outside [pos - left, pos + right] are masked; left < 0 means no
    left limit.
    """
    row = np.arange(T)[:, None]
    col = np.arange(S)[None, :]
    sk = S if k_lens is None else np.asarray(k_lens)[:, None, None, None]
    sq = T if q_lens is None else np.asarray(q_lens)[:, None, None, None]
    left, right = window
    if left < 0:
        blocked = col > row + sk - sq + right
    else:
        blocked = (col > np.minimum(row + sk - sq + right, sk)) | (col < row + sk - sq - left)
    return np.broadcast_to(blocked, np.broadcast_shapes(np.shape(blocked), (1, 1, T, S)))


def fa_attention_ref(q, k, v, query_padding_mask=None, key_padding_mask=None, attn_bias=None,
                     causal=False, window_size=(-1, -1), dtype=np.float64, reorder_ops=False):
    """FlashAttention's attention_ref: q (B, T, H, D), k, v (B, S, Hk, D).

    -> out (B, T, H, D), attention (B, H, T, S), lse (B, H, T). Rows with no key
    left give 0 (the reference's masked_fill of fully masked rows); padded
    query rows give 0. ``reorder_ops`` puts the scale on k (FlashAttention's
    estimate of plain low-precision error).
    """
    if causal:
        window_size = (window_size[0], 0)
    B, T, H, D = q.shape
    S, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    k = np.repeat(k, g, axis=2)  # "b s h d -> b s (h g) d"
    v = np.repeat(v, g, axis=2)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))  # (B, H, T | S, D)
    allowed = np.ones((1, 1, T, S), dtype=bool)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    if window_size[0] >= 0 or window_size[1] >= 0:
        q_lens = None if query_padding_mask is None else query_padding_mask.sum(-1)
        k_lens = None if key_padding_mask is None else key_padding_mask.sum(-1)
        allowed = allowed & ~fa_local_mask(T, S, window_size, q_lens, k_lens)
    scale = 1.0 / np.sqrt(D)
    if reorder_ops:
        out, attn, lse = reference_attention(qh, kh * np.asarray(scale, dtype), vh, allowed,
                                             attn_bias, scale=1.0, dtype=dtype)
    else:
        out, attn, lse = reference_attention(qh, kh, vh, allowed, attn_bias, scale=scale,
                                             dtype=dtype)
    if query_padding_mask is not None:
        attn = attn * query_padding_mask[:, None, :, None]
        out = out * query_padding_mask[:, None, :, None]
    return np.swapaxes(out, 1, 2), attn, lse


def fa_alibi_bias(slopes, T, S, causal):
    """FlashAttention's attn_bias_from_alibi_slopes, slopes (B, H) -> (B, H, 1 | T, S)."""
    slopes = np.asarray(slopes, dtype=np.float64)[:, :, None, None]
    if causal:
        return np.arange(-S + 1, 1, dtype=np.float64) * slopes
    row = np.arange(T)[:, None]
    col = np.arange(S)[None, :]
    return -slopes * np.abs(row + S - T - col)


def paper_alibi_slopes(n):
    """ALiBi's reference slopes (Press et al.): geometric from 2^(-8/n); for n not a power
    of two, those of the closest power of two below, then every other slope of twice it."""
    def power_of_2(m):
        start = 2.0 ** (-(2.0 ** -(np.log2(m) - 3)))
        return [start * start**i for i in range(m)]
    if np.log2(n).is_integer():
        return np.array(power_of_2(n))
    closest = 2 ** int(np.floor(np.log2(n)))
    return np.array(power_of_2(closest) + power_of_2(2 * closest)[0::2][: n - closest])


# ------------------------------------------------------------------ mapping helpers


def make_qkv(seed, B, T, S, H, Hk, D, *, scale_q=1.0, scale_kv=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, D)) * scale_q
    k = rng.standard_normal((B, S, Hk, D)) * scale_kv
    v = rng.standard_normal((B, S, Hk, D)) * scale_kv
    return q, k, v


def to_attnlab(q, k, v):
    """(B, T, H, D), (B, S, Hk, D) -> q (B, Hk, G, T, D), k, v (B, Hk, 1, S, D)."""
    B, T, H, D = q.shape
    Hk = k.shape[2]
    q5 = np.swapaxes(q, 1, 2).reshape(B, Hk, H // Hk, T, D)
    k5 = np.swapaxes(k, 1, 2)[:, :, None]
    v5 = np.swapaxes(v, 1, 2)[:, :, None]
    return q5, k5, v5


def from_attnlab(out5):
    """(B, Hk, G, T, D) -> (B, T, H, D)."""
    B, Hk, G, T, D = out5.shape
    return np.swapaxes(out5.reshape(B, Hk * G, T, D), 1, 2)


def heads_first_bias(bias, Hk):
    """A (B | 1, H, T | 1, S) bias -> (B | 1, Hk, G, T | 1, S) for the broadcast layout."""
    b, H = bias.shape[:2]
    return bias.reshape(b, Hk, H // Hk, *bias.shape[2:])


def attnlab_paths(q, k, v, mask=None, *, bias=None, is_causal=False, dtype=np.float64):
    """attnlab's plain and flash outputs in FlashAttention's layout."""
    q5, k5, v5 = (a.astype(dtype) for a in to_attnlab(q, k, v))
    kwargs = {"bias": None if bias is None else bias.astype(dtype), "is_causal": is_causal}
    plain = attnlab.scaled_dot_product_attention(q5, k5, v5, mask, **kwargs)
    flash = attnlab.flash_attention(q5, k5, v5, mask, **kwargs, **BLOCKS)
    return from_attnlab(plain), from_attnlab(flash)


def mha_heads(mha_type, H=6):
    return {"mha": H, "mqa": 1, "gqa": 2}[mha_type]


def rounded(*arrays):
    """float32 copies, and the float64 values they hold (the golden's inputs)."""
    lo = [a.astype(np.float32) for a in arrays]
    return lo, [a.astype(np.float64) for a in lo]


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output
# (dropout 0, no softcap, alibi and local covered by their own tests below). Shapes scaled
# down from FlashAttention's (113, 203), (128, 217), (108, 256), (256, 512), (512, 256),
# (1023, 1024), (1024, 1023): T < S, T > S and off-by-one, with tiles of 8 so that no
# size is a multiple of the tile. float64: 1e-12; float32: the 2x rule (module doc).

OUTPUT_SEQLENS = [(13, 23), (16, 27), (8, 24), (24, 12), (32, 32), (31, 32), (32, 31)]


@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", OUTPUT_SEQLENS)
def test_flash_attn_output(seqlen_q, seqlen_k, causal, mha_type):
    B, H, D = 2, 6, 16
    q, k, v = make_qkv(seqlen_q * 100 + seqlen_k, B, seqlen_q, seqlen_k, H, mha_heads(mha_type),
                       D)
    out_ref, _, lse_ref = fa_attention_ref(q, k, v, causal=causal)
    plain, flash = attnlab_paths(q, k, v, is_causal=causal)
    assert_close(plain, out_ref, atol=F64_TOL, what="plain float64")
    assert_close(flash, out_ref, atol=F64_TOL, what="flash float64")
    _, lse = attnlab.flash_attention(*to_attnlab(q, k, v), is_causal=causal, return_lse=True,
                                     **BLOCKS)
    lse = lse.reshape(B, H, seqlen_q)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    finite = np.isfinite(lse_ref)
    assert_close(lse[finite], lse_ref[finite], atol=F64_TOL, what="softmax_lse")

    (q32, k32, v32), (q64, k64, v64) = rounded(q, k, v)
    golden, _, _ = fa_attention_ref(q64, k64, v64, causal=causal)
    baseline, _, _ = fa_attention_ref(q32, k32, v32, causal=causal, dtype=np.float32,
                                      reorder_ops=True)
    plain32, flash32 = attnlab_paths(q32, k32, v32, is_causal=causal, dtype=np.float32)
    assert plain32.dtype == flash32.dtype == np.float32
    assert_two_x_rule(flash32, baseline, golden, slack=1e-7, what="flash float32")
    assert_two_x_rule(plain32, baseline, golden, slack=1e-7, what="plain float32")


# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output (its gradient
# half: dq, dk, dv against autograd through attention_ref; here against the reference's
# chain rule, with dk, dv summed over the key head's query group for MQA/GQA).
# float64: 1e-10; float32: FlashAttention's 3x rule for gradients, plus 1e-7 of slack.

@pytest.mark.parametrize("mha_type", ["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(13, 23), (24, 12), (32, 32)])
def test_flash_attn_output_grads(seqlen_q, seqlen_k, causal, mha_type):
    B, H, D = 2, 6, 16
    Hk = mha_heads(mha_type)
    q, k, v = make_qkv(seqlen_q + 7 * seqlen_k, B, seqlen_q, seqlen_k, H, Hk, D)
    dout = np.random.default_rng(99).standard_normal((B, seqlen_q, H, D))

    def ref_grads(q, k, v, dout, dtype, reorder=False):
        allowed = attnlab.causal_mask(seqlen_q, seqlen_k) if causal else None
        G = H // Hk
        qh = np.swapaxes(q, 1, 2)
        kh, vh = (np.repeat(np.swapaxes(a, 1, 2), G, axis=1) for a in (k, v))
        scale = 1.0 / np.sqrt(D)
        if reorder:
            dq, dk, dv, _ = reference_backward(qh, kh * np.asarray(scale, dtype), vh,
                                               np.swapaxes(dout, 1, 2), allowed, scale=1.0,
                                               dtype=dtype)
            dk = dk * np.asarray(scale, dtype)
        else:
            dq, dk, dv, _ = reference_backward(qh, kh, vh, np.swapaxes(dout, 1, 2), allowed,
                                               dtype=dtype)
        dk = dk.reshape(B, Hk, G, seqlen_k, D).sum(2)
        dv = dv.reshape(B, Hk, G, seqlen_k, D).sum(2)
        return dq.reshape(B, Hk, G, seqlen_q, D), dk[:, :, None], dv[:, :, None]

    def attnlab_grads(q, k, v, dout):
        q5, k5, v5 = to_attnlab(q, k, v)
        d5 = to_attnlab(dout, k, v)[0]
        out, lse = attnlab.flash_attention(q5, k5, v5, is_causal=causal, return_lse=True,
                                           **BLOCKS)
        flash = attnlab.flash_attention_backward(q5, k5, v5, out, lse, d5, is_causal=causal,
                                                 **BLOCKS)
        plain = attnlab.sdpa_backward(q5, k5, v5, d5, is_causal=causal)[:3]
        return plain, flash

    want = ref_grads(q, k, v, dout, np.float64)
    plain, flash = attnlab_grads(q, k, v, dout)
    for name, p, f, w in zip("qkv", plain, flash, want, strict=True):
        assert_close(p, w, atol=F64_GRAD_TOL, what=f"plain d{name}")
        assert_close(f, w, atol=F64_GRAD_TOL, what=f"flash d{name}")

    (q32, k32, v32, d32), (q64, k64, v64, d64) = rounded(q, k, v, dout)
    golden = ref_grads(q64, k64, v64, d64, np.float64)
    baseline = ref_grads(q32, k32, v32, d32, np.float32, reorder=True)
    plain32, flash32 = attnlab_grads(q32, k32, v32, d32)
    for name, p, f, b, w in zip("qkv", plain32, flash32, baseline, golden,
                                     strict=True):
        assert_two_x_rule(f, b, w, factor=3.0, slack=1e-7, what=f"flash float32 d{name}")
        assert_two_x_rule(p, b, w, factor=3.0, slack=1e-7, what=f"plain float32 d{name}")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_causal
# causal=True at FlashAttention's (1, 239), (3, 799), (127, 512), (127, 513), (113, 203),
# (128, 217) scaled down, each also with seqlen_q and seqlen_k swapped (swap_sq_sk): the
# bottom-right alignment with T < S and T > S, through the plain path, flash and
# attnlab.torch (whose fused call must get the bottom-right mask, not torch's own flag).

CAUSAL_SEQLENS = [(1, 39), (3, 79), (27, 52), (27, 53), (13, 23), (16, 27)]


@pytest.mark.parametrize("swap_sq_sk", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", CAUSAL_SEQLENS)
def test_flash_attn_causal(seqlen_q, seqlen_k, swap_sq_sk):
    import torch

    import attnlab.torch as at

    if swap_sq_sk:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    B, H, D = 2, 3, 16
    q, k, v = make_qkv(seqlen_q * 31 + seqlen_k, B, seqlen_q, seqlen_k, H, H, D)
    out_ref, _, _ = fa_attention_ref(q, k, v, causal=True)
    plain, flash = attnlab_paths(q, k, v, is_causal=True)
    assert_close(plain, out_ref, atol=F64_TOL, what="plain")
    assert_close(flash, out_ref, atol=F64_TOL, what="flash")
    qt, kt, vt = (torch.from_numpy(np.swapaxes(a, 1, 2).copy()) for a in (q, k, v))
    out_t = at.scaled_dot_product_attention(qt, kt, vt, is_causal=True).numpy()
    assert_close(np.swapaxes(out_t, 1, 2), out_ref, atol=F64_TOL, what="attnlab.torch")
    if seqlen_q > seqlen_k:  # queries before the first key see nothing: 0
        assert np.all(plain[:, : seqlen_q - seqlen_k] == 0)
        assert np.all(flash[:, : seqlen_q - seqlen_k] == 0)


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[local=True]
# (and test_flash_attn_causal[local=True]): window_size (left, right) in the windows attnlab
# can express: (W - 1, 0) = causal window of W keys, (w, w) = symmetric window of 2w + 1;
# with causal=True FlashAttention drops right, so (3, 2) and (5, 5) are windows of 4 and 6.
# Checked through sliding_window_attention, and the plain and flash paths given
# sliding_window_mask. T != S uses the same bottom-right positions on both sides.

LOCAL_CASES = [((0, 0), False), ((3, 0), False), ((7, 0), False), ((1, 1), False),
               ((4, 4), False), ((3, 2), True), ((5, 5), True)]


@pytest.mark.parametrize("window_size,causal", LOCAL_CASES)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(16, 16), (9, 21), (21, 9)])
def test_flash_attn_local(seqlen_q, seqlen_k, window_size, causal):
    B, H, D = 2, 2, 8
    q, k, v = make_qkv(seqlen_q + sum(window_size) * 13, B, seqlen_q, seqlen_k, H, H, D)
    out_ref, _, _ = fa_attention_ref(q, k, v, causal=causal, window_size=window_size)
    left, right = window_size
    if causal or right == 0:
        W, sym = left + 1, False
    else:
        W, sym = 2 * left + 1, True
    mask = attnlab.sliding_window_mask(seqlen_q, W, is_causal=not sym, S=seqlen_k)
    plain, flash = attnlab_paths(q, k, v, mask)
    assert_close(plain, out_ref, atol=F64_TOL, what="plain + sliding_window_mask")
    assert_close(flash, out_ref, atol=F64_TOL, what="flash + sliding_window_mask")
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    sw = attnlab.sliding_window_attention(qh, kh, vh, W, is_causal=not sym)
    assert_close(np.swapaxes(sw, 1, 2), out_ref, atol=F64_TOL, what="sliding_window_attention")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[alibi=True]
# (attn_bias_from_alibi_slopes). attnlab's alibi_slopes are the paper's (checked against the
# paper's formula, also for H = 6, not a power of two); non-causal, attnlab's alibi_bias
# is FlashAttention's bias entry for entry (bottom-right positions); causal, FlashAttention
# uses slope * (j - S + 1), a per-row shift of attnlab's, so the outputs agree.

@pytest.mark.parametrize("nheads", [4, 6])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(8, 8), (5, 13), (13, 5)])
def test_flash_attn_alibi(seqlen_q, seqlen_k, causal, nheads):
    B, D = 2, 8
    slopes = paper_alibi_slopes(nheads)
    assert_close(attnlab.alibi_slopes(nheads), slopes, atol=0, rtol=1e-15, what="slopes")
    q, k, v = make_qkv(nheads * 10 + seqlen_q, B, seqlen_q, seqlen_k, nheads, nheads, D)
    fa_bias = fa_alibi_bias(np.broadcast_to(slopes, (B, nheads)), seqlen_q, seqlen_k, causal)
    bias = attnlab.alibi_bias(nheads, seqlen_q, seqlen_k)  # (H, T, S)
    if not causal:
        assert_close(np.broadcast_to(bias, fa_bias.shape), fa_bias, atol=F64_TOL,
                     what="alibi_bias")
    out_ref, _, _ = fa_attention_ref(q, k, v, attn_bias=fa_bias, causal=causal)
    plain, flash = attnlab_paths(q, k, v, bias=heads_first_bias(bias[None], nheads),
                                 is_causal=causal)
    assert_close(plain, out_ref, atol=F64_TOL, what="plain")
    assert_close(flash, out_ref, atol=F64_TOL, what="flash")


# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_output[alibi=True]
# with its random slopes (torch.rand(batch, nheads) * 0.3, one set per batch item): the
# bias is FlashAttention's own, passed as attnlab's bias, (B, H, 1, S) when causal.

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(8, 8), (5, 13), (13, 5)])
def test_flash_attn_alibi_random_slopes(seqlen_q, seqlen_k, causal):
    B, H, Hk, D = 3, 4, 2, 8
    rng = np.random.default_rng(seqlen_q * seqlen_k)
    slopes = rng.random((B, H)) * 0.3
    q, k, v = make_qkv(seqlen_q - seqlen_k + 50, B, seqlen_q, seqlen_k, H, Hk, D)
    fa_bias = fa_alibi_bias(slopes, seqlen_q, seqlen_k, causal)
    out_ref, _, _ = fa_attention_ref(q, k, v, attn_bias=fa_bias, causal=causal)
    plain, flash = attnlab_paths(q, k, v, bias=heads_first_bias(fa_bias, Hk), is_causal=causal)
    assert_close(plain, out_ref, atol=F64_TOL, what="plain")
    assert_close(flash, out_ref, atol=F64_TOL, what="flash")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_varlen_output
# (generate_random_padding_mask modes "full", "random", "third"; padding at the end of each
# sequence). attnlab: mask = query_padding[:, None] & key_padding[None, :], and for causal
# the true-length alignment causal_mask(len_q, len_k) in each sequence's corner. Tiles of
# 4, so padding spans whole tiles.

def random_padding_mask(rng, max_seqlen, batch, mode):
    if mode == "full":
        lengths = np.full((batch, 1), max_seqlen)
    elif mode == "random":
        lengths = rng.integers(max(1, max_seqlen - 20), max_seqlen + 1, (batch, 1))
    else:
        lengths = rng.integers(max_seqlen // 3, max_seqlen + 1, (batch, 1))
    return np.arange(max_seqlen)[None, :] < lengths


@pytest.mark.parametrize("mode", ["full", "random", "third"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(24, 24), (17, 31), (31, 17)])
def test_flash_attn_varlen_output(seqlen_q, seqlen_k, causal, mode):
    import torch

    import attnlab.torch as at

    B, H, D = 3, 2, 8
    rng = np.random.default_rng(seqlen_q * 3 + seqlen_k + len(mode))
    qpm = random_padding_mask(rng, seqlen_q, B, mode)
    kpm = random_padding_mask(rng, seqlen_k, B, mode)
    q, k, v = make_qkv(int(rng.integers(1000)), B, seqlen_q, seqlen_k, H, H, D)
    out_ref, _, _ = fa_attention_ref(q, k, v, qpm, kpm, causal=causal)
    mask = qpm[:, :, None] & kpm[:, None, :]  # (B, T, S)
    if causal:
        for b in range(B):
            lq, lk = int(qpm[b].sum()), int(kpm[b].sum())
            mask[b, :lq, :lk] &= attnlab.causal_mask(lq, lk)
    mask = mask[:, None]  # (B, 1, T, S)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    plain = attnlab.scaled_dot_product_attention(qh, kh, vh, mask)
    flash = attnlab.flash_attention(qh, kh, vh, mask, block_q=4, block_k=4)
    torch_out = at.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (qh, kh, vh)),
                                                torch.from_numpy(mask)).numpy()
    for name, out in (("plain", plain), ("flash", flash), ("attnlab.torch", torch_out)):
        assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what=name)
        assert np.all(np.swapaxes(out, 1, 2)[~qpm] == 0)  # padded queries: 0


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_kvcache
# (new_kv=True, causal, mha / mqa / gqa, no rotary, no paged blocks, one cache length for
# the whole batch): append seqlen_new keys to a cache holding cache_len, attend from the
# new queries; equal to attention_ref over the whole cache with causal=True (bottom-right).
# The cache must hold exactly the old and new keys (FlashAttention checks k_cache too).

@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("cache_len,seqlen_new", [(0, 5), (7, 1), (16, 3), (31, 8)])
def test_flash_attn_kvcache(cache_len, seqlen_new, mha_type, impl):
    B, H, D = 2, 6, 16
    Hk = mha_heads(mha_type)
    S = cache_len + seqlen_new
    q, k, v = make_qkv(cache_len * 10 + seqlen_new + Hk, B, seqlen_new, S, H, Hk, D)
    out_ref, _, _ = fa_attention_ref(q, k, v, causal=True)
    kh, vh = np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)  # (B, Hk, S, D)
    qh = np.swapaxes(q, 1, 2)
    if impl == "numpy":
        cache = attnlab.KVCache(batch=B, num_kv_heads=Hk, head_dim=D, capacity=4)
        if cache_len:
            cache.append(kh[:, :, :cache_len], vh[:, :, :cache_len])
        out = cache.attend(qh, kh[:, :, cache_len:], vh[:, :, cache_len:])
        keys, values = cache.keys, cache.values
    else:
        import torch

        import attnlab.torch as at

        cache = at.KVCache(B, Hk, D, dtype=torch.float64, capacity=4)
        t = torch.from_numpy
        if cache_len:
            cache.append(t(kh[:, :, :cache_len].copy()), t(vh[:, :, :cache_len].copy()))
        out = cache.attend(t(qh.copy()), t(kh[:, :, cache_len:].copy()),
                           t(vh[:, :, cache_len:].copy())).numpy()
        keys, values = cache.keys.numpy(), cache.values.numpy()
    assert np.array_equal(keys, kh) and np.array_equal(values, vh)
    assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what=impl)


# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_kvcache[local=True]
# with window_size = (W - 1, 0): attnlab's SlidingWindowKVCache(window=W). A prefill of
# cache_len tokens, then seqlen_new more; each call equals attention_ref with that window
# over every key so far (the cache itself keeps only the last W).

@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("window", [1, 3, 6])
@pytest.mark.parametrize("cache_len,seqlen_new", [(0, 7), (9, 1), (12, 4), (3, 9)])
def test_flash_attn_kvcache_local(cache_len, seqlen_new, window, impl):
    B, H, Hk, D = 2, 4, 2, 8
    S = cache_len + seqlen_new
    q, k, v = make_qkv(window * 100 + S, B, S, S, H, Hk, D)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    if impl == "numpy":
        cache = attnlab.SlidingWindowKVCache(B, Hk, D, window=window)

        def attend(lo, hi):
            return cache.attend(qh[:, :, lo:hi], kh[:, :, lo:hi], vh[:, :, lo:hi])
    else:
        import torch

        import attnlab.torch as at

        cache = at.SlidingWindowKVCache(B, Hk, D, window=window, dtype=torch.float64)

        def attend(lo, hi):
            parts = (torch.from_numpy(a[:, :, lo:hi].copy()) for a in (qh, kh, vh))
            return cache.attend(*parts).numpy()
    for lo, hi in ((0, cache_len), (cache_len, S)):
        if hi == lo:
            continue
        out = attend(lo, hi)
        ref, _, _ = fa_attention_ref(q[:, lo:hi], k[:, :hi], v[:, :hi], causal=True,
                                     window_size=(window - 1, 0))
        assert_close(np.swapaxes(out, 1, 2), ref, atol=F64_TOL, what=f"{impl} [{lo}:{hi})")


# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_kvcache
# (rotary_fraction=1.0, rotary_interleaved False / True, causal, new_kv): the new keys and
# the queries are rotated at positions cache_len .. cache_len + seqlen_new - 1 (FlashAttention's
# seqlen_offsets=cache_seqlens) before attention over the cache. FlashAttention's rotary
# reference (apply_rotary_emb_torch: rotate_half on halves, or on interleaved pairs) is
# re-implemented below; FlashAttention draws random angles, attnlab's are RoPE's
# position * base^(-2i/D), so both sides use those. attnlab: apply_rope(x, positions=
# cache.length) and KVCache.attend.

def fa_rotary(x, positions, interleaved, base=10000.0):
    """apply_rotary_emb_torch with cos/sin of positions * base^(-2i/D); x (B, T, H, D)."""
    D = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * base ** (
        -np.arange(0, D, 2) / D)[None, :]  # (T, D/2)
    if interleaved:
        cos, sin = (np.repeat(f(angles), 2, axis=-1) for f in (np.cos, np.sin))
        rotated = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    else:
        cos, sin = (np.concatenate([f(angles)] * 2, axis=-1) for f in (np.cos, np.sin))
        rotated = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("rotary_interleaved", [False, True])
@pytest.mark.parametrize("cache_len,seqlen_new", [(0, 5), (7, 1), (16, 3)])
def test_flash_attn_kvcache_rotary(cache_len, seqlen_new, rotary_interleaved, impl):
    B, H, Hk, D = 2, 4, 2, 16
    S = cache_len + seqlen_new
    q, k, v = make_qkv(cache_len + 3 * seqlen_new + rotary_interleaved, B, seqlen_new, S, H, Hk,
                       D)
    new_pos = np.arange(cache_len, S)
    q_ro = fa_rotary(q, new_pos, rotary_interleaved)
    k_ref = np.concatenate([k[:, :cache_len], fa_rotary(k[:, cache_len:], new_pos,
                                                        rotary_interleaved)], axis=1)
    out_ref, _, _ = fa_attention_ref(q_ro, k_ref, v, causal=True)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    if impl == "numpy":
        cache = attnlab.KVCache(batch=B, num_kv_heads=Hk, head_dim=D)
        if cache_len:
            cache.append(kh[:, :, :cache_len], vh[:, :, :cache_len])
        rope = {"positions": cache.length, "interleaved": rotary_interleaved}
        out = cache.attend(attnlab.apply_rope(qh, **rope),
                           attnlab.apply_rope(kh[:, :, cache_len:], **rope), vh[:, :, cache_len:])
    else:
        import torch

        import attnlab.torch as at

        t = torch.from_numpy
        cache = at.KVCache(B, Hk, D, dtype=torch.float64)
        if cache_len:
            cache.append(t(kh[:, :, :cache_len].copy()), t(vh[:, :, :cache_len].copy()))
        rope = {"positions": cache.length, "interleaved": rotary_interleaved}
        out = cache.attend(at.apply_rope(t(qh.copy()), **rope),
                           at.apply_rope(t(kh[:, :, cache_len:].copy()), **rope),
                           t(vh[:, :, cache_len:].copy())).numpy()
    assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what=impl)


# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_varlen_qkvpacked
# [local=True] (one padding mask for queries and keys, as packed qkv has): the windows
# attnlab expresses, through sliding_window_attention(key_padding=...). The reference
# zeroes padded query rows; attnlab lets them attend (they are padding: only the real rows
# are compared), and never lets a real query see a padded key.

@pytest.mark.parametrize("mode", ["random", "third"])
@pytest.mark.parametrize("window_size,causal", [((2, 0), False), ((1, 1), False),
                                                ((3, 3), False), ((4, 1), True)])
def test_flash_attn_varlen_qkvpacked_local(window_size, causal, mode):
    B, T, H, D = 3, 20, 2, 8
    rng = np.random.default_rng(sum(window_size) + 5 * causal + len(mode))
    pad = random_padding_mask(rng, T, B, mode)
    q, k, v = make_qkv(int(rng.integers(1000)), B, T, T, H, H, D)
    out_ref, _, _ = fa_attention_ref(q, k, v, pad, pad, causal=causal, window_size=window_size)
    left, right = window_size
    W, sym = (left + 1, False) if causal or right == 0 else (2 * left + 1, True)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    out = attnlab.sliding_window_attention(qh, kh, vh, W, is_causal=not sym,
                                           key_padding=pad[:, None, :])
    out = np.swapaxes(out, 1, 2)
    assert_close(out[pad], out_ref[pad], atol=F64_TOL, what="real query rows")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_splitkv (num_splits:
# the key range computed in parts and combined through softmax_lse). attnlab: lse from
# flash_attention(return_lse=True) equals the reference's log-sum-exp; two halves of the
# keys (mask sliced the same way, the causal mask taken from the whole T x S grid)
# combined by merge_partials equal the whole, including rows that see nothing in a half.

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,split", [(3, 40, 17), (1, 33, 8), (16, 16, 5),
                                                     (12, 20, 16)])
def test_flash_attn_splitkv(seqlen_q, seqlen_k, split, causal):
    B, H, D = 2, 3, 8
    q, k, v = make_qkv(split * 7 + seqlen_k, B, seqlen_q, seqlen_k, H, H, D)
    out_ref, _, lse_ref = fa_attention_ref(q, k, v, causal=causal)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    out, lse = attnlab.flash_attention(qh, kh, vh, is_causal=causal, return_lse=True, **BLOCKS)
    assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what="out")
    assert_close(lse, lse_ref, atol=F64_TOL, what="lse")
    mask = attnlab.causal_mask(seqlen_q, seqlen_k) if causal else np.ones(
        (seqlen_q, seqlen_k), bool)
    left = attnlab.flash_attention(qh, kh[:, :, :split], vh[:, :, :split], mask[:, :split],
                                   return_lse=True, **BLOCKS)
    right = attnlab.flash_attention(qh, kh[:, :, split:], vh[:, :, split:], mask[:, split:],
                                    return_lse=True, **BLOCKS)
    merged, merged_lse = attnlab.merge_partials(*left, *right)
    assert_close(np.swapaxes(merged, 1, 2), out_ref, atol=F64_TOL, what="merged out")
    assert_close(merged_lse, lse_ref, atol=F64_TOL, what="merged lse")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_bwd_overflow
# ("not masking elements beyond seqlen_k caused NaN in dQ when seqlen % block != 0"):
# seqlens 1, 2, 5, 17 with tiles of 8, q * 5 and k, v * 3. No NaN, and the gradients of
# both backward passes equal the reference's. float64; 1e-9 for these larger values.

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1, 2, 5, 17])
def test_flash_attn_bwd_overflow(seqlen, causal):
    B, H, D = 2, 5, 16
    q, k, v = make_qkv(seqlen, B, seqlen, seqlen, H, H, D, scale_q=5.0, scale_kv=3.0)
    qh, kh, vh = (np.swapaxes(a, 1, 2) for a in (q, k, v))
    dout = np.random.default_rng(seqlen + 1).standard_normal(qh.shape)
    allowed = attnlab.causal_mask(seqlen) if causal else None
    want = reference_backward(qh, kh, vh, dout, allowed)[:3]
    out, lse = attnlab.flash_attention(qh, kh, vh, is_causal=causal, return_lse=True, **BLOCKS)
    flash = attnlab.flash_attention_backward(qh, kh, vh, out, lse, dout, is_causal=causal,
                                             **BLOCKS)
    plain = attnlab.sdpa_backward(qh, kh, vh, dout, is_causal=causal)[:3]
    for name, f, p, w in zip("qkv", flash, plain, want, strict=True):
        assert_close(f, w, atol=1e-9, what=f"flash d{name}")
        assert_close(p, w, atol=1e-9, what=f"plain d{name}")


# --------------------------------------------------------------------------------------
# Dao-AILab/flash-attention:tests/test_flash_attn.py::test_flash_attn_varlen_output applied
# to masks written as additive values, the way models hand them over: left padding of 9
# keys (longer than a tile of 4) filled with -1e9 or finfo.min, rows that are entirely such
# values, and left padding under causal. The reference adds the same bias in float64.
# float64 to 1e-12. float32 only where the expected numbers do not depend on the dtype:
# finfo(float32).min (it swamps any score in both dtypes: a fully filled row is a uniform
# average), and -1e9 only where no row is filled entirely (filled keys get weight 0).

def _large_negative_case(pattern, fill, dtype):
    B, H, T, S, D = 2, 2, 16, 16, 8
    rng = np.random.default_rng(len(pattern) * 17 + int(abs(np.log10(-fill))))
    qh, kh, vh = (rng.standard_normal((B, H, n, D)) for n in (T, S, S))
    bias = np.zeros((B, 1, T, S))
    bias[0, :, :, :9] = fill  # batch item 0: 9 left-padded keys, more than two tiles of 4
    is_causal = pattern == "causal_left_pad"
    if pattern == "rows_filled":
        bias[1, :, :3, :] = fill  # batch item 1: the first three query rows see only fill
    qh, kh, vh, bias = (a.astype(dtype) for a in (qh, kh, vh, bias))
    return qh, kh, vh, bias, is_causal


LARGE_NEGATIVE_CASES = (
    [(p, f, np.float64) for p in ("left_pad", "rows_filled", "causal_left_pad")
     for f in (-1e9, float(np.finfo(np.float32).min), float(np.finfo(np.float64).min))]
    + [(p, float(np.finfo(np.float32).min), np.float32)
       for p in ("left_pad", "rows_filled", "causal_left_pad")]
    + [("left_pad", -1e9, np.float32)]
)


@pytest.mark.parametrize("pattern,fill,dtype", LARGE_NEGATIVE_CASES,
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_flash_attn_large_negative_bias(pattern, fill, dtype):
    qh, kh, vh, bias, is_causal = _large_negative_case(pattern, fill, dtype)
    T, S = qh.shape[-2], kh.shape[-2]
    allowed = attnlab.causal_mask(T, S) if is_causal else None
    q64, k64, v64, b64 = (a.astype(np.float64) for a in (qh, kh, vh, bias))
    golden, _, lse_ref = reference_attention(q64, k64, v64, allowed, b64)
    plain = attnlab.scaled_dot_product_attention(qh, kh, vh, bias=bias, is_causal=is_causal)
    flash, lse = attnlab.flash_attention(qh, kh, vh, bias=bias, is_causal=is_causal,
                                         block_q=4, block_k=4, return_lse=True)
    if dtype == np.float64:
        # Where a row's every allowed key carries the fill, its scores are only as fine as
        # the spacing of float64 at |fill| (1.2e-7 at 1e9): 64 spacings of tolerance there.
        filled = np.all((b64 != 0) | ~np.broadcast_to(
            True if allowed is None else allowed, b64.shape), axis=-1)  # (B, 1, T)
        quantum = abs(fill) * np.finfo(np.float64).eps  # float64 spacing at |fill|; finfo.min:
        # > 1e22, it swamps every score and the row is an exact uniform average
        row_tol = np.where(filled & (quantum < 1), 64 * quantum, F64_TOL)[..., None]
        assert_close(plain, golden, atol=row_tol, what="plain")
        assert_close(flash, golden, atol=row_tol, what="flash")
        big = np.abs(lse_ref) > 1e6  # rows whose log-sum-exp carries the fill
        assert_close(lse[~big], lse_ref[~big], atol=F64_TOL, what="lse")
        assert_close(lse[big], lse_ref[big], atol=0, rtol=1e-15, what="lse of filled rows")
    else:
        baseline, _, _ = reference_attention(qh, kh * np.float32(1 / np.sqrt(qh.shape[-1])),
                                             vh, allowed, bias, scale=1.0, dtype=np.float32)
        assert_two_x_rule(plain, baseline, golden, slack=1e-7, what="plain float32")
        assert_two_x_rule(flash, baseline, golden, slack=1e-7, what="flash float32")
