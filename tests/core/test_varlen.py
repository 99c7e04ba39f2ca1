"""Variable-length (packed, unpadded) attention against each sequence run alone.

The reference is independent of the code under test: for every sequence b, the
plain :func:`scaled_dot_product_attention` (and :func:`sdpa_backward`) on that
sequence's rows alone, with its key/value heads repeated for GQA.

Tolerances, and why:
- float64, outputs and gradients: 1e-12 absolute. The same O(1) terms (at most
  a few dozen keys) summed in another order (batched products, tiles, an
  online softmax) differ by ~1e-15; a sequence boundary crossed or a wrong
  causal offset shows up at 1e-2 or more.
- float32, FlashAttention's rule: against the float64 reference, the error of
  the path under test is at most 2x that of the same-precision reference (the
  per-sequence plain path in float32), plus a floor of 8 float32 ulps of the
  reference's largest magnitude for a quantity whose plain error is ~0 by luck.
- Finite differences (float64, central, h = 1e-6): 1e-7 relative, the
  truncation error O(h²) plus rounding O(eps/h) ~ 1e-10 of O(1) values.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attnlab import AttnlabError, ShapeError, scaled_dot_product_attention
from attnlab.backward import sdpa_backward
from attnlab.fast.flash import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from attnlab.fast.varlen import (
    check_cu_seqlens,
    cu_seqlens_from_lengths,
    flash_varlen_attention,
    flash_varlen_attention_backward,
    varlen_attention,
    varlen_attention_backward,
)

EPS32 = float(np.finfo(np.float32).eps)

# (query lengths, key lengths, H, Hkv): ragged, equal groups, empty sequences,
# T < S (a cached prefix), T > S (causal: the first T - S queries see nothing), GQA.
CASES = [
    ([5, 3, 7], [5, 3, 7], 2, 2),
    ([4, 4, 1, 9, 4], [4, 4, 1, 9, 4], 4, 2),
    ([3, 0, 6, 2], [5, 2, 6, 0], 4, 1),
    ([6, 2, 5], [3, 8, 5], 3, 3),
    ([1, 1, 1], [7, 2, 11], 2, 1),
    ([0], [0], 2, 2),
]


def _problem(lq, lk, H, Hkv, dtype=np.float64, seed=0, D=8, Dv=6):
    rng = np.random.default_rng(seed)
    cu_q, cu_k = cu_seqlens_from_lengths(lq), cu_seqlens_from_lengths(lk)
    q = rng.standard_normal((int(cu_q[-1]), H, D)).astype(dtype)
    k = rng.standard_normal((int(cu_k[-1]), Hkv, D)).astype(dtype)
    v = rng.standard_normal((int(cu_k[-1]), Hkv, Dv)).astype(dtype)
    dout = rng.standard_normal((int(cu_q[-1]), H, Dv)).astype(dtype)
    return q, k, v, dout, cu_q, cu_k, max(lq), max(lk)


def _alone(q, k, v, dout, cu_q, cu_k, is_causal, **options):
    """Each sequence through the plain sdpa and its backward, alone; packed back."""
    H, Hkv = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], H, v.shape[2]), dtype=q.dtype)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rq.stop == rq.start:
            continue
        heads = [x.transpose(1, 0, 2) for x in (q[rq], np.repeat(k[rk], H // Hkv, axis=1),
                                                np.repeat(v[rk], H // Hkv, axis=1))]
        out[rq] = scaled_dot_product_attention(*heads, is_causal=is_causal,
                                               **options).transpose(1, 0, 2)
        g = sdpa_backward(*heads, dout[rq].transpose(1, 0, 2), is_causal=is_causal, **options)
        dq[rq] = g.dq.transpose(1, 0, 2)
        # A shared key/value head gets the sum over its H / Hkv query heads.
        dk[rk] = g.dk.reshape(Hkv, H // Hkv, -1, g.dk.shape[-1]).sum(1).transpose(1, 0, 2)
        dv[rk] = g.dv.reshape(Hkv, H // Hkv, -1, g.dv.shape[-1]).sum(1).transpose(1, 0, 2)
    return out, dq, dk, dv


def _all_paths(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal, block=(3, 4), **options):
    args = (cu_q, cu_k, max_q, max_k)
    plain = [varlen_attention(q, k, v, *args, is_causal=is_causal, **options)]
    plain += varlen_attention_backward(q, k, v, dout, *args, is_causal=is_causal, **options)
    out, lse = flash_varlen_attention(q, k, v, *args, is_causal=is_causal, block_q=block[0],
                                      block_k=block[1], return_lse=True, **options)
    flash = [out, *flash_varlen_attention_backward(q, k, v, out, lse, dout, *args,
                                                   is_causal=is_causal, block_q=block[0],
                                                   block_k=block[1], **options)]
    return plain, flash, lse


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_float64_equals_each_sequence_alone(case, is_causal):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem(*case)
    reference = _alone(q, k, v, dout, cu_q, cu_k, is_causal)
    plain, flash, _ = _all_paths(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal)
    for name, ref, p, f in zip(("out", "dq", "dk", "dv"), reference, plain, flash, strict=True):
        assert p.shape == f.shape == ref.shape and p.dtype == f.dtype == np.float64, name
        np.testing.assert_allclose(p, ref, atol=1e-12, rtol=0, err_msg=f"plain {name}")
        np.testing.assert_allclose(f, ref, atol=1e-12, rtol=0, err_msg=f"flash {name}")


@pytest.mark.parametrize("options", [
    {"window": (2, 1)}, {"window": (0, -1)}, {"window": 3}, {"softcap": 2.0},
    {"window": (3, 0), "softcap": 1.5},
])
@pytest.mark.parametrize("is_causal", [False, True])
def test_window_and_softcap_per_sequence(options, is_causal):
    # FlashAttention's varlen takes window_size and softcap: each applies to each sequence
    # alone, positions counted from its own start (bottom-right), as the plain sdpa does.
    if isinstance(options.get("window"), int) and not is_causal:
        options = {**options, "window": 5}  # a symmetric int window is odd
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem([5, 9, 1, 6], [7, 9, 4, 3], 4, 2)
    q, k = 3 * q, 3 * k  # scores past the soft cap, so that it bends them
    reference = _alone(q, k, v, dout, cu_q, cu_k, is_causal, **options)
    plain, flash, _ = _all_paths(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal, **options)
    for name, ref, p, f in zip(("out", "dq", "dk", "dv"), reference, plain, flash, strict=True):
        np.testing.assert_allclose(p, ref, atol=1e-12, rtol=0, err_msg=f"plain {name}")
        np.testing.assert_allclose(f, ref, atol=1e-12, rtol=0, err_msg=f"flash {name}")
    no_options = _alone(q, k, v, dout, cu_q, cu_k, is_causal)
    assert np.abs(no_options[0] - reference[0]).max() > 1e-3  # the option did something


@pytest.mark.parametrize("is_causal", [False, True])
def test_lse_is_each_sequences_log_sum_exp(is_causal):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem([3, 0, 6, 2], [5, 2, 6, 0], 4, 1)
    _, _, lse = _all_paths(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal)
    assert lse.shape == (4, q.shape[0])  # (H, total_q), FlashAttention's varlen layout
    for b in range(4):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        T, S = rq.stop - rq.start, rk.stop - rk.start
        scores = np.einsum("thd,shd->hts", q[rq], np.repeat(k[rk], 4, axis=1)) / np.sqrt(8)
        if is_causal:
            scores = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T, scores,
                              -np.inf)
        with np.errstate(divide="ignore"):
            expected = np.log(np.exp(scores).sum(-1)) if S else np.full((4, T), -np.inf)
        np.testing.assert_allclose(lse[:, rq], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_float32_flashattention_rule(seed, is_causal):
    lq = [17, 1, 40, 33, 33]
    lk = [17, 9, 40, 33, 33] if not is_causal else [20, 9, 40, 33, 33]
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem(lq, lk, 4, 2, np.float32, seed, D=16,
                                                       Dv=16)
    f64 = [x.astype(np.float64) for x in (q, k, v, dout)]
    golden = _alone(*f64, cu_q, cu_k, is_causal)
    same_precision = _alone(q, k, v, dout, cu_q, cu_k, is_causal)
    plain, flash, _ = _all_paths(q, k, v, dout, cu_q, cu_k, max_q, max_k, is_causal,
                                 block=(8, 16))
    for name, g, ref32, p, f in zip(("out", "dq", "dk", "dv"), golden, same_precision, plain,
                                    flash, strict=True):
        assert p.dtype == f.dtype == np.float32, name
        allowed = 2 * np.abs(ref32 - g).max() + 8 * EPS32 * np.abs(g).max()
        assert np.abs(p - g).max() <= allowed, (name, "plain")
        assert np.abs(f - g).max() <= allowed, (name, "flash")


def test_gradients_match_finite_differences():
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _problem([3, 4], [3, 5], 2, 1, D=3, Dv=2)
    args = (cu_q, cu_k, max_q, max_k)
    grads = varlen_attention_backward(q, k, v, dout, *args, is_causal=True)

    def loss(qq, kk, vv):
        return float((varlen_attention(qq, kk, vv, *args, is_causal=True) * dout).sum())

    h = 1e-6
    for index, arr in enumerate((q, k, v)):
        numeric = np.zeros_like(arr)
        for pos in np.ndindex(arr.shape):
            up, down = [x.copy() for x in (q, k, v)], [x.copy() for x in (q, k, v)]
            up[index][pos] += h
            down[index][pos] -= h
            numeric[pos] = (loss(*up) - loss(*down)) / (2 * h)
        np.testing.assert_allclose(grads[index], numeric, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_computes_in_float32_and_returns_its_own_dtype(half):
    # bfloat16 used to come back as float32 (float16 stayed float16; the core keeps both).
    if half == "bfloat16":
        # The NumPy-only tier runs without the optional ml_dtypes (the bfloat16 extra).
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
        ulp = 2**-7  # bfloat16 keeps 8 significant bits
    else:
        dtype, ulp = np.dtype(np.float16), 2**-10
    q, k, v, _, cu_q, cu_k, max_q, max_k = _problem([4, 6], [4, 6], 2, 2, np.float32)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k)
    flash = flash_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, block_q=2, block_k=2)
    ref = varlen_attention(*(x.astype(np.float32) for x in (q, k, v)), cu_q, cu_k, max_q, max_k)
    assert out.dtype == flash.dtype == dtype
    # Both are the float32 result rounded once: at most half an ulp apart from it.
    np.testing.assert_array_equal(out, ref.astype(dtype))
    np.testing.assert_allclose(flash.astype(np.float32), ref.astype(dtype).astype(np.float32),
                               rtol=ulp, atol=ulp * 2**-4)
    grads = varlen_attention_backward(q, k, v, np.ones_like(out), cu_q, cu_k, max_q, max_k)
    assert all(g.dtype == dtype for g in grads)


def test_attention_never_crosses_a_sequence_boundary():
    # Changing sequence 0's keys and values leaves every other sequence's output as it was.
    q, k, v, _, cu_q, cu_k, max_q, max_k = _problem([4, 5, 3], [4, 5, 3], 2, 2)
    before = flash_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, block_q=4, block_k=4)
    k2, v2 = k.copy(), v.copy()
    k2[:4] *= 50.0
    v2[:4] += 100.0
    for path in (varlen_attention, flash_varlen_attention):
        after = path(q, k2, v2, cu_q, cu_k, max_q, max_k)
        np.testing.assert_allclose(after[4:], before[4:], atol=1e-12, rtol=0)
        assert np.abs(after[:4] - before[:4]).max() > 1.0  # and sequence 0 did change


def test_flash_memory_is_linear_at_16k_total_tokens():
    # 16,384 packed tokens in sixteen sequences of 1,024, causal, one head, D = 32,
    # float32. A (total, total) score matrix would be 1 GiB; one sequence's
    # (T, S) alone 4 MiB. Flash holds the output, one sequence's copy of v and
    # a few (block_q, block_k) tiles; the backward its gradients.
    lengths = [1024] * 16
    total, D = sum(lengths), 32
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((total, 1, D), dtype=np.float32) for _ in range(4))
    cu = cu_seqlens_from_lengths(lengths)
    item = 4
    bound = 4 * 2 * total * (D + 1) * item + 4 * DEFAULT_BLOCK_Q * DEFAULT_BLOCK_K * item

    tracemalloc.start()
    try:
        out, lse = flash_varlen_attention(q, k, v, cu, cu, 1024, 1024, is_causal=True,
                                          return_lse=True)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        flash_varlen_attention_backward(q, k, v, out, lse, dout, cu, cu, 1024, 1024,
                                        is_causal=True)
        backward_peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert forward_peak <= bound, (forward_peak, bound)  # 20.5 MiB; measured 4.0 MiB
    assert backward_peak <= bound, (backward_peak, bound)  # measured 10.1 MiB (dq, dk, dv: 6 MiB)
    assert total * total * item / forward_peak >= 64  # the (total, total) matrix: 64x+ more
    # Spot check: the last sequence's last query against the plain path alone.
    last = slice(total - 1024, total)
    ref = scaled_dot_product_attention(q[last, 0][-1:], k[last, 0], v[last, 0])
    np.testing.assert_allclose(out[-1, 0], ref[0], atol=1e-5)


# ------------------------------------------------------------------------ errors


def _good():
    return _problem([3, 2], [3, 2], 2, 2)


@pytest.mark.parametrize("cu_q, match", [
    ([1, 3, 5], "cu_seqlens_q: expected the first entry to be 0, got 1"),
    ([0, 4, 3, 5], "cu_seqlens_q: expected non-decreasing cumulative lengths, got 4 then 3"),
    ([0, 3, 4], r"cu_seqlens_q: expected the last entry to equal q.shape\[0\] = 5 .* got 4"),
    ([0.0, 3.0, 5.0], "cu_seqlens_q: expected a 1-D integer array"),
    ([[0, 3, 5]], "cu_seqlens_q: expected a 1-D integer array"),
    ([], "cu_seqlens_q: expected .* got an empty array"),
    ([True, False], "cu_seqlens_q: expected a 1-D integer array"),
])
def test_bad_cu_seqlens_are_named(cu_q, match):
    q, k, v, _, _, cu_k, _, _ = _good()
    for path in (varlen_attention, flash_varlen_attention):
        with pytest.raises(AttnlabError, match=match):
            path(q, k, v, cu_q, cu_k, 5, 5)


def test_sequence_counts_and_max_seqlen_are_checked():
    q, k, v, _, cu_q, cu_k, _, _ = _good()
    with pytest.raises(AttnlabError, match="cu_seqlens_k: expected as many sequences as "
                                           "cu_seqlens_q, 2 .* got 3"):
        varlen_attention(q, k, v, cu_q, [0, 1, 3, 5], 3, 3)
    with pytest.raises(AttnlabError, match="max_seqlen_q: expected at least the longest "
                                           "sequence of cu_seqlens_q, 3 .* got 2"):
        flash_varlen_attention(q, k, v, cu_q, cu_k, 2, 3)
    with pytest.raises(AttnlabError, match="max_seqlen_k: expected an integer"):
        varlen_attention(q, k, v, cu_q, cu_k, 3, 3.0)
    assert varlen_attention(q, k, v, cu_q, cu_k, 100, 100).shape == (5, 2, 6)  # larger: fine


def test_bad_shapes_are_named():
    q, k, v, dout, cu_q, cu_k, max_q, max_k = _good()
    args = (cu_q, cu_k, max_q, max_k)
    with pytest.raises(ShapeError, match=r"q: expected the packed layout \(total_q, H, D\)"):
        varlen_attention(q[None], k, v, *args)
    with pytest.raises(ShapeError, match="k: expected Hkv key/value heads dividing q's H = 2"):
        varlen_attention(q, np.repeat(k, 3, 1), np.repeat(v, 3, 1), *args)
    with pytest.raises(ShapeError, match="v: expected"):
        varlen_attention(q, k, v[:, :1], *args)
    with pytest.raises(ShapeError, match="dout: expected"):
        varlen_attention_backward(q, k, v, dout[:-1], *args)
    out, lse = flash_varlen_attention(q, k, v, *args, return_lse=True)
    with pytest.raises(ShapeError, match=r"lse: expected the forward's \(H, total_q\)"):
        flash_varlen_attention_backward(q, k, v, out, lse.T, dout, *args)
    with pytest.raises(AttnlabError, match="q: expected finite values"):
        varlen_attention(np.where(q > 1, np.nan, q), k, v, *args)


def test_check_cu_seqlens_returns_int64():
    assert check_cu_seqlens(np.array([0, 2, 2, 5], np.int32), "cu", 5, "total").dtype == np.int64
    with pytest.raises(AttnlabError, match="lengths: expected lengths >= 0"):
        cu_seqlens_from_lengths([2, -1])


def test_lengths_whose_total_overflows_int64_are_refused():
    # np.cumsum wrapped: [2**62, 2**62] gave cu_seqlens [0, 2**62, -2**63].
    with pytest.raises(AttnlabError, match=r"lengths: expected a total length that fits int64 "
                                           r"\(at most 9223372036854775807\), got "
                                           r"9223372036854775808"):
        cu_seqlens_from_lengths([2**62, 2**62])
    assert cu_seqlens_from_lengths([2**62, 2**62 - 1]).tolist() == [0, 2**62, 2**63 - 1]
