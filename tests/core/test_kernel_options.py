"""The kernel's options on the NumPy paths: each fast path against its plain twin, the
plain path against a float64 formula written out here, and flash's memory at T = 16k.

(Against the peers, torch, FlashAttention's reference, and with gradients by autograd:
tests/conformance/test_kernel_features.py. This tier runs without torch.)

Tolerances: float64 to 1e-12 for outputs of O(1) and 1e-10 for gradients (sums of a
few hundred terms, each rounding ~1e-16).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import attnlab
from attnlab.backward import sdpa_backward
from attnlab.errors import AttnlabError
from attnlab.fast.flash import flash_attention, flash_attention_backward

BLOCKS = {"block_q": 8, "block_k": 16}


def formula(q, k, v, *, allowed=None, softcap=None, bias=None):
    """softmax(cap(q kᵀ/√D) + bias, where allowed) v and its lse, in float64, written out."""
    s = np.einsum("...td,...sd->...ts", q, k) / np.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    w = e / np.where(total == 0, 1.0, total)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return w @ v, lse


def band(T, S, left, right, offset):
    """query i at offset + i sees keys j with p - left <= j <= p + right (None = unbounded)."""
    p = np.arange(T)[:, None] + offset
    j = np.arange(S)[None, :]
    ok = np.ones((T, S), bool)
    if left is not None:
        ok &= j >= p - left
    if right is not None:
        ok &= j <= p + right
    return ok


@pytest.mark.parametrize("T,S", [(12, 20), (20, 12), (17, 17)])
@pytest.mark.parametrize("options,left,right,top_left", [
    (dict(is_causal=True, causal_alignment="top_left"), None, 0, True),
    (dict(window=(2, 3)), 2, 3, False),
    (dict(window=(4, -1), is_causal=True), 4, 0, False),
    (dict(window=(-1, 1), causal_alignment="top_left"), None, 1, True),
    (dict(window=(0, 0)), 0, 0, False),
])
def test_band_options_on_every_path_equal_the_written_out_mask(T, S, options, left, right,
                                                                top_left):
    rng = np.random.default_rng(T * S)
    q, k, v = rng.standard_normal((2, T, 8)), rng.standard_normal((2, S, 8)), \
        rng.standard_normal((2, S, 5))
    allowed = band(T, S, left, right, 0 if top_left else S - T)
    out_ref, lse_ref = formula(q, k, v, allowed=allowed)
    out, lse = attnlab.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    f_out, f_lse = flash_attention(q, k, v, return_lse=True, **BLOCKS, **options)
    for got, got_lse in ((out, lse), (f_out, f_lse)):
        np.testing.assert_allclose(got, out_ref, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse_ref))
        np.testing.assert_allclose(np.where(np.isneginf(got_lse), 0, got_lse),
                                   np.where(np.isneginf(lse_ref), 0, lse_ref), rtol=0, atol=1e-12)
    assert np.array_equal(attnlab.window_mask(T, S, window=options.get("window"),
                                              is_causal=options.get("is_causal", False),
                                              causal_alignment="top_left" if top_left
                                              else "bottom_right")
                          if "window" in options else
                          attnlab.causal_mask(T, S, causal_alignment="top_left"), allowed)
    dout = rng.standard_normal(out.shape)
    plain_grads = sdpa_backward(q, k, v, dout, **options)
    flash_grads = flash_attention_backward(q, k, v, f_out, f_lse, dout, **BLOCKS, **options)
    mask_grads = sdpa_backward(q, k, v, dout, allowed)  # the same band as an explicit mask
    for a, b, c in zip(plain_grads[:3], flash_grads, mask_grads[:3], strict=True):
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-10)
        np.testing.assert_allclose(b, c, rtol=0, atol=1e-10)


def test_softcap_alibi_and_gqa_on_the_plain_and_flash_paths():
    rng = np.random.default_rng(4)
    B, H, Hkv, T, S = 2, 4, 2, 15, 21
    q = rng.standard_normal((B, H, T, 8)) * 2
    k, v = rng.standard_normal((B, Hkv, S, 8)) * 2, rng.standard_normal((B, Hkv, S, 5))
    slopes = rng.random((B, H)) * 0.5
    options = dict(softcap=1.5, alibi_slopes=slopes, enable_gqa=True, is_causal=True)
    distance = np.abs(np.arange(T)[:, None] + (S - T) - np.arange(S)[None, :])
    out_ref, lse_ref = formula(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1),
                               allowed=band(T, S, None, 0, S - T), softcap=1.5,
                               bias=-slopes[..., None, None] * distance)
    out, lse = attnlab.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    f_out, f_lse = flash_attention(q, k, v, return_lse=True, **BLOCKS, **options)
    for got, got_lse in ((out, lse), (f_out, f_lse)):
        np.testing.assert_allclose(got, out_ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got_lse, lse_ref, rtol=0, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    plain_grads = sdpa_backward(q, k, v, dout, **options)
    flash_grads = flash_attention_backward(q, k, v, f_out, f_lse, dout, **BLOCKS, **options)
    assert plain_grads.dk.shape == k.shape and flash_grads[1].shape == k.shape
    for a, b in zip(plain_grads[:3], flash_grads, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10)


def test_softcap_gradient_matches_finite_differences():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((5, 4)) * 2, rng.standard_normal((6, 4)) * 2, \
        rng.standard_normal((6, 3))
    dout = rng.standard_normal((5, 3))
    dq = sdpa_backward(q, k, v, dout, softcap=0.7, is_causal=True).dq
    h = 1e-6
    numeric = np.zeros_like(q)
    for idx in np.ndindex(*q.shape):
        plus, minus = q.copy(), q.copy()
        plus[idx] += h
        minus[idx] -= h
        f = [np.sum(attnlab.scaled_dot_product_attention(x, k, v, softcap=0.7, is_causal=True)
                    * dout) for x in (plus, minus)]
        numeric[idx] = (f[0] - f[1]) / (2 * h)
    # central differences: error O(h²·f''') + rounding 1e-16/h ≈ 1e-10
    np.testing.assert_allclose(dq, numeric, rtol=0, atol=1e-8)


def test_flash_keeps_linear_memory_at_16k_with_windows_softcap_and_alibi():
    # T = S = 16,384, two heads: the score matrix alone would be 2 · 16384² · 4 B = 2 GiB.
    # A causal window of 128 keys in tiles of 128 leaves 2 key tiles per query block (the
    # other 126 are skipped), so this stays fast; softcap and per-batch ALiBi slopes are
    # made per tile.
    T = S = 16_384
    H, D, block = 2, 8, 128
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((1, H, n, D), dtype=np.float32) for n in (T, S, S))
    dout = rng.standard_normal((1, H, T, D), dtype=np.float32)
    slopes = np.array([[0.25, 0.0625]], dtype=np.float32)
    options = dict(window=(127, 0), is_causal=True, softcap=20.0, alibi_slopes=slopes,
                   block_q=block, block_k=block)
    item = 4
    score_matrix = H * T * S * item
    # output, lse (float64), v with a column of ones, the gradients, a few tiles of every head
    bound = 4 * H * (T + S) * (D + 2) * item + 16 * H * block * block * item

    tracemalloc.start()
    try:
        stats = attnlab.FlashStats()
        out, lse = flash_attention(q, k, v, return_lse=True, stats=stats, **options)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        flash_attention_backward(q, k, v, out, lse, dout, **options)
        backward_peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()

    assert forward_peak <= bound, (forward_peak, bound)  # 12 MiB; measured 2.7 MiB
    assert backward_peak <= bound, (backward_peak, bound)  # measured 4.2 MiB
    assert score_matrix / max(forward_peak, backward_peak) >= 256
    blocks = T // block
    assert stats.computed == 2 * blocks - 1  # its diagonal tile and the one before it
    # The last 64 queries against the plain path on the keys their window reaches.
    rows = slice(T - 64, T)
    keys = slice(T - 64 - 127, T)
    plain = attnlab.scaled_dot_product_attention(
        q[..., rows, :], k[..., keys, :], v[..., keys, :], window=(127, 0), is_causal=True,
        softcap=20.0, alibi_slopes=slopes)
    np.testing.assert_allclose(out[..., rows, :], plain, rtol=0, atol=2e-6)  # float32 sums


def test_flash_options_give_the_same_numbers_on_any_number_of_threads():
    # The parts (query blocks of a few batch-heads) carry their own ALiBi slopes and band.
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 4, 600, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 700, 16)).astype(np.float32) for _ in range(2))
    options = dict(window=(150, 20), softcap=5.0, enable_gqa=True,
                   alibi_slopes=rng.random((2, 4)).astype(np.float32), block_q=128,
                   block_k=128, return_lse=True)
    out, lse = flash_attention(q, k, v, **options)
    out2, lse2 = flash_attention(q, k, v, num_threads=2, **options)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    plain = attnlab.scaled_dot_product_attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
        **{key: val for key, val in options.items() if key not in ("block_q", "block_k")})
    np.testing.assert_allclose(out, plain[0], rtol=0, atol=1e-5)  # float32 vs float64


@pytest.mark.parametrize("path", ["plain", "flash"])
@pytest.mark.parametrize("slopes", [[-1e308, 0.5], [1e308, 0.5], [0.5, -1e38]])
def test_alibi_slopes_that_would_overflow_the_bias_are_refused(path, slopes):
    # -slope·|i' - j| at slope -1e308 is +inf (1e308 cast to float32 too): the rows
    # came back NaN on both paths. Now the slopes are bounded by the dtype's range
    # and their positive bias counts in the score-range check.
    attend = attnlab.scaled_dot_product_attention if path == "plain" else flash_attention
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    with pytest.raises(AttnlabError, match=r"alibi_slopes: expected \|slope\|·\(T \+ S\) below "
                                           r"8\.51e\+37 .* got max\|slope\| = 1e\+(308|38) "
                                           r"with T \+ S = 8"):
        attend(q, k, v, alibi_slopes=np.array(slopes))
    # within the bound, huge and ordinary slopes (negative ones too) give finite numbers
    for within in ([-1e37, 0.5], [-0.5, 0.25]):
        assert np.isfinite(attend(q, k, v, alibi_slopes=np.array(within))).all()


@pytest.mark.parametrize("path", ["plain", "flash"])
def test_a_window_longer_than_any_sequence_is_unbounded_and_a_negative_seed_is_named(path):
    # window=10**30 (an int with is_causal, or a side of a pair) ended in OverflowError
    # from int64 arithmetic; a side that long reaches past any sequence: no window.
    attend = attnlab.scaled_dot_product_attention if path == "plain" else flash_attention
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    causal = attend(q, k, v, is_causal=True)
    for window in (10**30, (10**30, 0), (10**30, 10**30)):
        np.testing.assert_array_equal(attend(q, k, v, is_causal=True, window=window), causal)
    np.testing.assert_array_equal(attend(q, k, v, window=(10**30, 10**30)), attend(q, k, v))
    if path == "plain":  # dropout's rng=-1 ended in NumPy's bare "expected non-negative integer"
        with pytest.raises(AttnlabError, match=r"^rng: expected an integer >= 0, got -1$"):
            attend(q, k, v, dropout_p=0.1, rng=-1)
