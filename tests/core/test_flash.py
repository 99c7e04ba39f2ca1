"""flash_attention (tiled, online softmax) against its plain twin, scaled_dot_product_attention.

Tolerances, and why:
- float64 flash vs float64 plain, outputs and gradients: 1e-12 absolute. Both
  sum the same O(1) terms (a few dozen keys here) in different orders (tiles,
  a running rescale, exp not shifted by the exact max); each order is off by
  ~1e-15, so 1e-12 has room without hiding a bug (a wrong tile edge, mask or
  rescale shows up at 1e-2 or more).
- float32, FlashAttention's fidelity rule: against a float64 golden, the flash
  error is at most 2x the plain path's float32 error, for out, dq, dk and dv,
  plus a floor of 8 float32 ulps of the *terms* each result is a sum of
  (e.g. Σ_j P_ij |v_j| for out). The floor matters only where the plain error
  is ~0: float32 cannot resolve a difference below a few ulps of the terms
  being summed, and the plain path is sometimes exact by luck (P rebuilt from
  ``lse`` is a few ulps from the plain path's normalised weights). Any real
  bug is ~1e6 ulps. (The floor is FlashAttention-3's form: 2x the plain error
  plus the dtype's rounding of the reference's magnitude.)
- The realistic-size check below uses the bare 2x rule, on every BLAS kernel:
  it failed on AVX-512 (OpenBLAS SkylakeX) while flash took δ = rowsum(dout ⊙
  out) as FlashAttention-2 does; δ = Σ P ⊙ dP fixed it (see flash.py).
- merge_partials and lse in float64: 1e-12 (same sums, different order).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import tracemalloc
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.kernel
from attnlab import AttnlabError, ShapeError, causal_mask, scaled_dot_product_attention
from attnlab.backward import sdpa_backward
from attnlab.fast.flash import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    FlashStats,
    flash_attention,
    flash_attention_backward,
    merge_partials,
)
from attnlab.kernel import MAX_SCORE_ELEMENTS, check_inputs

EPS32 = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------- helpers


def _f64(a):
    return None if a is None else (a if a.dtype == bool else a.astype(np.float64))


def reference_lse(q, k, mask=None, bias=None, is_causal=False, scale=None):
    """log Σ_S exp(scaled scores) written out on the full (T, S) matrix; -inf if none allowed."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scaled = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., T, S)
    if bias is not None:
        scaled = scaled + bias
    allowed = np.ones(scaled.shape, dtype=bool)
    if mask is not None:
        allowed &= mask
    if is_causal:
        allowed &= causal_mask(q.shape[-2], k.shape[-2])
    scaled = np.where(allowed, scaled, -np.inf)
    row_max = scaled.max(axis=-1, keepdims=True) if scaled.shape[-1] else None
    if row_max is None:
        return np.full(scaled.shape[:-1], -np.inf)
    row_max = np.where(np.isneginf(row_max), 0.0, row_max)
    total = np.exp(scaled - row_max).sum(axis=-1)
    with np.errstate(divide="ignore"):
        return np.log(total) + row_max[..., 0]


def term_scales(q, k, v, dout, mask, bias, is_causal):
    """Magnitude of the terms summed into out, dq, dk, dv (float64): the rounding floor.

    dq = scale · Σ_j P_ij (dP_ij − δ_i) k_j with dP_ij = Σ_d dout_id v_jd and
    δ_i = Σ_d dout_id out_id: each sum is replaced by the sum of absolute terms.
    """
    scale = 1 / math.sqrt(q.shape[-1])
    out, weights = scaled_dot_product_attention(
        q, k, v, mask, bias=bias, is_causal=is_causal, return_weights=True
    )  # (..., T, Dv), (..., T, S)
    dweights_terms = np.abs(dout) @ np.swapaxes(np.abs(v), -1, -2)  # (..., T, S)
    delta_terms = np.sum(np.abs(dout * out), axis=-1, keepdims=True)  # (..., T, 1)
    dz_terms = weights * (dweights_terms + delta_terms)  # (..., T, S)
    return (
        (weights @ np.abs(v)).max(),
        (scale * dz_terms @ np.abs(k)).max(),
        (scale * np.swapaxes(dz_terms, -1, -2) @ np.abs(q)).max(),
        (np.swapaxes(weights, -1, -2) @ np.abs(dout)).max(),
    )


def max_err(x, golden):
    return float(np.abs(x - golden).max()) if golden.size else 0.0


@st.composite
def problems(draw, max_len=40):
    """Random attention problems: broadcast batch dims, T != S, masks, bias, causal, tiles."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batch = draw(st.sampled_from([(), (2,), (2, 3), (1, 2)]))
    T, S = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    D, Dv = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    # k and v may share one head across the query heads (size-1 batch dims broadcast).
    kv_batch = tuple(1 if draw(st.booleans()) else n for n in batch)
    q_gain = draw(st.sampled_from([0.5, 1.0, 3.0]))  # 3: peaked softmax, scores up to ~15
    q = (rng.standard_normal((*batch, T, D)) * q_gain).astype(np.float32)
    k = rng.standard_normal((*kv_batch, S, D)).astype(np.float32)
    v = rng.standard_normal((*kv_batch, S, Dv)).astype(np.float32)
    mask_kind = draw(st.sampled_from(["none", "full", "shared", "key_padding"]))
    density = draw(st.sampled_from([0.1, 0.5, 0.9]))  # 0.1: many fully masked rows
    mask = {
        "none": None,
        "full": rng.random((*batch, T, S)) < density,
        "shared": rng.random((T, S)) < density,
        "key_padding": rng.random((*batch[:1], *(1,) * len(batch[1:]), 1, S)) < density,
    }[mask_kind]
    bias = None
    if draw(st.booleans()):
        bias = rng.standard_normal((T, S)).astype(np.float32)
        bias[rng.random((T, S)) < 0.1] = -np.inf
    is_causal = draw(st.booleans())
    block_q, block_k = draw(st.integers(1, T + 3)), draw(st.integers(1, S + 3))
    dout = rng.standard_normal((*batch, T, Dv)).astype(np.float32)
    return q, k, v, mask, bias, is_causal, block_q, block_k, dout


# ------------------------------------------------------------------ fidelity rule


@contextlib.contextmanager
def _scores_in_base(base):
    """Flash makes scores in base 2 where NumPy's exp2 is SIMD code, else in base e:
    force either, so that both are tested on every machine."""
    tiles_module = importlib.import_module("attnlab.fast.flash_tiles")
    with mock.patch.object(tiles_module, "exp2_is_vectorised", lambda dtype: base == 2):
        yield


@settings(max_examples=60, deadline=None)
@given(problems())
def test_float32_fidelity_rule_outputs_and_gradients(problem):
    _check_fidelity_rule(problem)


@settings(max_examples=30, deadline=None)
@given(problems(), st.sampled_from([2, math.e]))
def test_float32_fidelity_rule_in_base_2_and_base_e(problem, base):
    with _scores_in_base(base):
        _check_fidelity_rule(problem)


def _check_fidelity_rule(problem):
    q, k, v, mask, bias, is_causal, block_q, block_k, dout = problem
    opts = {"bias": bias, "is_causal": is_causal}
    tiles = {"block_q": block_q, "block_k": block_k}
    golden = [scaled_dot_product_attention(_f64(q), _f64(k), _f64(v), mask, **{
        **opts, "bias": _f64(bias)})]
    golden += sdpa_backward(_f64(q), _f64(k), _f64(v), _f64(dout), mask, bias=_f64(bias),
                            is_causal=is_causal)[:3]
    naive = [scaled_dot_product_attention(q, k, v, mask, **opts)]
    naive += sdpa_backward(q, k, v, dout, mask, **opts)[:3]
    out, lse = flash_attention(q, k, v, mask, **opts, **tiles, return_lse=True)
    flash = [out, *flash_attention_backward(q, k, v, out, lse, dout, mask, **opts, **tiles)]
    floors = term_scales(_f64(q), _f64(k), _f64(v), _f64(dout), mask, _f64(bias), is_causal)

    for name, g, n, f, terms in zip(("out", "dq", "dk", "dv"), golden, naive, flash, floors,
                                    strict=True):
        assert f.dtype == np.float32 and f.shape == g.shape, name
        assert not np.isnan(f).any(), name
        flash_err, naive_err = max_err(f, g), max_err(n, g)
        assert flash_err <= 2 * naive_err + 8 * EPS32 * terms, (name, flash_err, naive_err)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_float64_equals_plain_path(problem):
    _check_float64_equals_plain_path(problem)


@settings(max_examples=20, deadline=None)
@given(problems(), st.sampled_from([2, math.e]))
def test_float64_equals_plain_path_in_base_2_and_base_e(problem, base):
    with _scores_in_base(base):
        _check_float64_equals_plain_path(problem)


def _check_float64_equals_plain_path(problem):
    q, k, v, mask, bias, is_causal, block_q, block_k, dout = (_f64(a) if isinstance(
        a, np.ndarray) else a for a in problem)
    opts = {"bias": bias, "is_causal": is_causal}
    out, lse = flash_attention(q, k, v, mask, **opts, block_q=block_q, block_k=block_k,
                               return_lse=True)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, mask, **opts),
                               rtol=0, atol=1e-12)
    expected_lse = reference_lse(q, k, mask, bias, is_causal)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    finite = np.isfinite(expected_lse)
    np.testing.assert_allclose(lse[finite], expected_lse[finite], rtol=0, atol=1e-12)
    grads = flash_attention_backward(q, k, v, out, lse, dout, mask, **opts,
                                     block_q=block_q, block_k=block_k)
    expected = sdpa_backward(q, k, v, dout, mask, **opts)[:3]
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected, strict=True):
        assert got.shape == want.shape, name  # summed over broadcast dims like autograd
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=name)


def test_float32_fidelity_at_a_realistic_size():
    # Errors are many ulps here, so the floor is negligible: the bare 2x rule is checked.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 300, 64)).astype(np.float32) for _ in range(3))
    dout = rng.standard_normal(q.shape).astype(np.float32)
    mask = rng.random((2, 1, 1, 300)) < 0.9  # key padding
    for is_causal in (False, True):
        golden = [scaled_dot_product_attention(_f64(q), _f64(k), _f64(v), mask,
                                               is_causal=is_causal)]
        golden += sdpa_backward(_f64(q), _f64(k), _f64(v), _f64(dout), mask,
                                is_causal=is_causal)[:3]
        naive = [scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)]
        naive += sdpa_backward(q, k, v, dout, mask, is_causal=is_causal)[:3]
        out, lse = flash_attention(q, k, v, mask, is_causal=is_causal, block_q=96, block_k=80,
                                   return_lse=True)
        flash = [out, *flash_attention_backward(q, k, v, out, lse, dout, mask,
                                                is_causal=is_causal, block_q=96, block_k=80)]
        for name, g, n, f in zip(("out", "dq", "dk", "dv"), golden, naive, flash, strict=True):
            assert max_err(f, g) <= 2 * max_err(n, g), (name, is_causal)


# ------------------------------------------------------------------- edge cases


def test_fully_masked_rows_give_zero_and_lse_minus_inf():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 6, 4)).astype(np.float32) for _ in range(3))
    mask = rng.random((2, 6, 6)) < 0.6
    mask[0, 2] = False  # a fully masked row
    bias = np.zeros((6, 6), dtype=np.float32)
    bias[4] = -np.inf  # a row fully masked by bias alone
    out, lse = flash_attention(q, k, v, mask, bias=bias, block_q=4, block_k=4, return_lse=True)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_array_equal(out[:, 4], 0.0)
    assert lse[0, 2] == -np.inf and (lse[:, 4] == -np.inf).all()
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, np.ones_like(out), mask, bias=bias,
                                          block_q=4, block_k=4)
    np.testing.assert_array_equal(dq[0, 2], 0.0)  # a row with no keys passes no gradient
    assert not any(np.isnan(g).any() for g in (dq, dk, dv))


def test_a_row_given_lse_minus_inf_passes_no_gradient_on_the_unbiased_path():
    # Without a bias or soft cap the backward subtracts the lse inside the score matmul;
    # a row whose lse says "nothing to attend to" must still pass no gradient there (its
    # keys are allowed, so no mask zeroes it): dq's row is 0 and dk, dv are what the other
    # rows give, i.e. the gradients with that row's dout zeroed (float32 sums of the same
    # terms, rtol 1e-5).
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 6, 4)).astype(np.float32) for _ in range(3))
    out, lse = flash_attention(q, k, v, block_q=4, block_k=4, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    lse[1, 3] = -np.inf
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, block_q=4, block_k=4)
    np.testing.assert_array_equal(dq[1, 3], 0.0)
    quiet = dout.copy()
    quiet[1, 3] = 0.0
    _, lse_true = flash_attention(q, k, v, block_q=4, block_k=4, return_lse=True)
    _, dk_ref, dv_ref = flash_attention_backward(q, k, v, out, lse_true, quiet, block_q=4,
                                                 block_k=4)
    np.testing.assert_allclose(dk, dk_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dv, dv_ref, rtol=1e-5, atol=1e-6)


def test_causal_with_more_queries_than_keys():
    # Bottom-right alignment: the first T - S queries see nothing and get 0.
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((9, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    out, lse = flash_attention(q, k, v, is_causal=True, block_q=2, block_k=3, return_lse=True)
    np.testing.assert_array_equal(out[:5], 0.0)
    assert (lse[:5] == -np.inf).all() and np.isfinite(lse[5:]).all()
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-12)


def test_one_query():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 1, 8)), rng.standard_normal((3, 50, 8)), \
        rng.standard_normal((3, 50, 5))
    out = flash_attention(q, k, v, is_causal=True, block_k=7)  # T = 1 sees all S keys
    assert out.shape == (3, 1, 5)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v), atol=1e-12)


def test_no_keys():
    q = np.ones((2, 3, 4), dtype=np.float32)
    k, v = np.ones((2, 0, 4), dtype=np.float32), np.ones((2, 0, 5), dtype=np.float32)
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert out.shape == (2, 3, 5) and out.dtype == np.float32
    np.testing.assert_array_equal(out, scaled_dot_product_attention(q, k, v))  # zeros
    assert (lse == -np.inf).all()
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, np.ones_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    np.testing.assert_array_equal(dq, 0.0)


@pytest.mark.parametrize("gain", [1e2, 1e3])
def test_huge_logits(gain):
    # Scores of ±1e4..1e5: no overflow and no NaN; every tile re-centres its rows.
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 20, 16)) * gain
    k, v = rng.standard_normal((2, 30, 16)), rng.standard_normal((2, 30, 3))
    for dtype in (np.float32, np.float64):
        qd, kd, vd = (a.astype(dtype) for a in (q, k, v))
        out, lse = flash_attention(qd, kd, vd, block_q=8, block_k=7, return_lse=True)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        expected = scaled_dot_product_attention(qd, kd, vd)
        # 1e-4 (float32) / 1e-9 (float64): exp turns the scores' own rounding, eps · 1e5,
        # into a relative error of the weights; both paths round the scores alike.
        np.testing.assert_allclose(out, expected, atol=1e-4 if dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("dtype,atol,grad_atol", [(np.float64, 1e-12, 1e-10),
                                                  (np.float32, 2e-6, 1e-5)])
@pytest.mark.parametrize("pattern", ["rising", "falling", "all_very_negative", "minus_1e9_fill"])
def test_running_reference_moves_up_and_down(pattern, dtype, atol, grad_atol):
    # Scores that leave the ±20 window in different tiles: the per-row reference
    # must move (up, or down while the row is still empty) without losing mass,
    # overflowing (exp(300) is inf in float32) or making 0 · inf = NaN.
    # atol: float64 as above; float32 2e-6 = a few ulps of outputs of size ~1,
    # since both paths see the same rounded scores. Gradients sum S = 40 such
    # terms (measured: 1e-14 and 1e-6). One exception: in float64, -1e9 + s
    # keeps s only to ±6e-8 (the spacing at 1e9 is 1.2e-7), and the two paths
    # round s differently ((q·scale)·k vs (q·k)·scale), so the "masked" row's
    # weights, hence its gradients, differ by ~1e-8 (measured 1.2e-8): 1e-7.
    if pattern == "minus_1e9_fill" and dtype == np.float64:
        grad_atol = 1e-7
    rng = np.random.default_rng(5)
    T, S = 6, 40
    q, k, v = rng.standard_normal((T, 4)), rng.standard_normal((S, 4)), rng.standard_normal((S, 2))
    ramp = np.linspace(0.0, 120.0, S)
    bias = {
        "rising": np.broadcast_to(ramp, (T, S)),
        "falling": np.broadcast_to(ramp[::-1], (T, S)),
        "all_very_negative": np.full((T, S), -300.0) + rng.standard_normal((T, S)),
        "minus_1e9_fill": np.where(rng.random((T, S)) < 0.5, -1e9, 0.0),  # seed 000's mask
    }[pattern]
    if pattern == "minus_1e9_fill":
        bias[0] = -1e9  # the seed's fully "masked" row: a uniform average, not 0
    q, k, v, bias = (a.astype(dtype) for a in (q, k, v, bias))
    out, lse = flash_attention(q, k, v, bias=bias, block_q=4, block_k=6, return_lse=True)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, bias=bias), atol=atol)
    np.testing.assert_allclose(lse, reference_lse(q, k, bias=bias), rtol=atol, atol=atol)
    grads = flash_attention_backward(q, k, v, out, lse, np.ones_like(out), bias=bias,
                                     block_q=4, block_k=6)
    expected = sdpa_backward(q, k, v, np.ones_like(out), bias=bias)[:3]
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=grad_atol)


def test_dtypes_and_non_contiguous_inputs():
    rng = np.random.default_rng(6)
    base = rng.standard_normal((4, 12, 8))
    q, k, v = base.transpose(1, 0, 2), base.transpose(1, 0, 2)[:, ::-1], base.transpose(1, 0, 2)
    assert not q.flags.c_contiguous
    np.testing.assert_allclose(flash_attention(q, k, v, block_q=3, block_k=3),
                               scaled_dot_product_attention(q, k, v), atol=1e-12)
    half = flash_attention(*(a.astype(np.float16) for a in (q, k, v)))
    assert half.dtype == np.float16  # computed in float32, returned as float16
    np.testing.assert_allclose(half.astype(np.float32), scaled_dot_product_attention(
        *(a.astype(np.float16) for a in (q, k, v))).astype(np.float32), atol=2e-3)
    ints = np.arange(24).reshape(4, 6) % 5
    assert flash_attention(ints, ints, ints).dtype == np.float64


# ------------------------------------------------------------------- skipped tiles


def _tiles_with_any_allowed(allowed, block_q, block_k):
    T, S = allowed.shape[-2:]
    return sum(bool(allowed[..., q0:q0 + block_q, k0:k0 + block_k].any())
               for q0 in range(0, T, block_q) for k0 in range(0, S, block_k))


@pytest.mark.parametrize("T,S", [(1024, 1024), (300, 1000), (1000, 300)])
def test_causal_skips_the_masked_tiles(T, S):
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((T, 8)), rng.standard_normal((S, 8)), rng.standard_normal((S, 4))
    stats = FlashStats()
    out, lse = flash_attention(q, k, v, is_causal=True, block_q=128, block_k=128,
                               return_lse=True, stats=stats)
    n_tiles = math.ceil(T / 128) * math.ceil(S / 128)
    expected = _tiles_with_any_allowed(causal_mask(T, S), 128, 128)
    assert (stats.computed, stats.skipped) == (expected, n_tiles - expected)
    if T == S:  # 8 x 8 tiles: the 28 above the diagonal are skipped, ~half computed
        assert (stats.computed, stats.skipped) == (36, 28)
    backward = FlashStats()
    flash_attention_backward(q, k, v, out, lse, np.ones_like(out), is_causal=True,
                             block_q=128, block_k=128, stats=backward)
    assert backward == stats


def test_all_false_mask_tiles_are_skipped_too():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((2, 200, 8)), rng.standard_normal((2, 260, 8)), \
        rng.standard_normal((2, 260, 4))
    key_padding = np.arange(260) < np.array([[100], [150]])  # (B, S): real tokens first
    mask = key_padding[:, None, :]  # (B, 1, S)
    stats = FlashStats()
    out = flash_attention(q, k, v, mask, block_q=64, block_k=64, stats=stats)
    # Keys 150.. are padding in both batch rows: their tiles (key blocks 3 and 4) are skipped.
    assert stats.skipped == _tiles_with_any_allowed(np.ones((200, 260)), 64, 64) - \
        _tiles_with_any_allowed(np.broadcast_to(mask, (2, 200, 260)), 64, 64) == 4 * 2
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, mask), atol=1e-12)


# ------------------------------------------------------------------------ memory


def test_memory_is_linear_in_sequence_length():
    # T = S = 8192, one head, D = 64: the plain path's score matrix alone is
    # 8192² · 4 B = 256 MiB (and softmax makes two more). Flash holds its output,
    # a copy of v and a few (block_q, block_k) tiles; the backward its gradients.
    T = S = 8192
    D = 64
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, n, D), dtype=np.float32) for n in (T, S, S))
    dout = rng.standard_normal((1, T, D), dtype=np.float32)
    item = 4
    score_matrix = T * S * item
    bound = 4 * (T + S) * (D + 1) * item + 4 * DEFAULT_BLOCK_Q * DEFAULT_BLOCK_K * item

    tracemalloc.start()
    try:
        out, lse = flash_attention(q, k, v, return_lse=True)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        flash_attention_backward(q, k, v, out, lse, dout, is_causal=False)
        backward_peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()

    assert forward_peak <= bound, (forward_peak, bound)  # 18 MiB; measured 5.3 MiB
    assert backward_peak <= bound, (backward_peak, bound)  # measured 7.7 MiB
    assert score_matrix / forward_peak >= 16  # the plain path needs 16x+ more (measured 48x)


# ------------------------------------------------- the plain path's size limit


def test_plain_path_refuses_a_huge_score_matrix_and_suggests_flash():
    # Broadcast views: no memory is allocated to build these inputs.
    T = math.isqrt(MAX_SCORE_ELEMENTS) + 1
    q = np.broadcast_to(np.zeros(1, dtype=np.float32), (T, 1))
    with pytest.raises(AttnlabError, match="flash"):
        scaled_dot_product_attention(q, q, q)
    with pytest.raises(AttnlabError, match="flash"):
        sdpa_backward(q, q, q, q)
    # Flash's own checks accept the same inputs (it never builds the matrix).
    inputs = check_inputs(q, q, q, is_causal=True, tiled=True)
    assert inputs.allowed is None  # no dense causal mask either: flash applies it per tile
    assert inputs.q.shape == (T, 1) and inputs.is_causal


def test_flash_computes_what_the_plain_path_refuses(monkeypatch):
    rng = np.random.default_rng(10)
    q, k, v = rng.standard_normal((2, 96, 8)), rng.standard_normal((2, 80, 8)), \
        rng.standard_normal((2, 80, 3))
    expected = scaled_dot_product_attention(q, k, v, is_causal=True)
    monkeypatch.setattr(attnlab.kernel, "MAX_SCORE_ELEMENTS", 1000)  # 2·96·80 is over
    with pytest.raises(AttnlabError, match="the plain path.s limit of 1,000"):
        scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(flash_attention(q, k, v, is_causal=True, block_q=32,
                                               block_k=32), expected, atol=1e-12)


# --------------------------------------------------------------- merge_partials


@pytest.mark.parametrize("split", [0, 1, 9, 22, 23])
def test_merging_two_key_ranges_equals_attention_over_all_keys(split):
    rng = np.random.default_rng(11)
    T, S = 7, 23
    q, k, v = rng.standard_normal((2, T, 5)), rng.standard_normal((2, S, 5)), \
        rng.standard_normal((2, S, 3))
    mask = (rng.random((2, T, S)) < 0.5) & causal_mask(T, S)
    mask[0, 1] = False  # empty in both halves
    mask[1, 3, split:] = False  # empty in the right half only
    bias = rng.standard_normal((T, S))
    left = flash_attention(q, k[:, :split], v[:, :split], mask[..., :split],
                           bias=bias[:, :split], block_k=4, return_lse=True)
    right = flash_attention(q, k[:, split:], v[:, split:], mask[..., split:],
                            bias=bias[:, split:], block_k=4, return_lse=True)
    out, lse = merge_partials(*left, *right)
    full_out, full_lse = flash_attention(q, k, v, mask, bias=bias, return_lse=True)
    np.testing.assert_allclose(out, full_out, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(full_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], full_lse[np.isfinite(full_lse)],
                               atol=1e-12)
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, mask, bias=bias),
                               atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fill", ["finfo.min", -1e30, -1e6])
def test_merging_under_a_fill_over_a_whole_row_is_right_or_refused(dtype, fill):
    # Keys 0-4 / 5-7, row 0 under the fill everywhere: each part's lse is the fill
    # + log n, and float64 rounds log n away at |fill| >= 1e16, so the merge used
    # to return out1 + out2 (off by 0.77). It must equal the plain path over
    # all keys (float64 is the float64 reference) or refuse, naming lse1, lse2.
    # Rows 1-3 (fill over part of the row, none) still merge: 1e-12 in float64,
    # 2e-6 in float32 (the parts' float32 rounding). -1e6 is within float64's
    # exact range: it merges, to 1e-10 (one ulp of 1e6 moves the weights ~3e-11).
    fill = float(np.finfo(dtype).min) if fill == "finfo.min" else fill
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(shape) for shape in ((4, 6), (8, 6), (8, 3)))
    bias = np.zeros((4, 8))
    bias[0, :], bias[1, :5], bias[2, 6:] = fill, fill, fill
    q, k, v, bias = (a.astype(dtype) for a in (q, k, v, bias))
    parts = [flash_attention(q, k[cols], v[cols], bias=bias[:, cols], return_lse=True)
             for cols in (slice(0, 5), slice(5, 8))]
    plain = scaled_dot_product_attention(q, k, v, bias=bias)  # (T, Dv), over all keys
    tol = 2e-6 if dtype == np.float32 else (1e-12 if abs(fill) > 1e6 else 1e-10)
    if abs(fill) > 1e6:
        with pytest.raises(AttnlabError, match=r"lse1, lse2: expected log-sum-exps that can "
                                               r"weigh the two parts, got .* at row \(0,\)"):
            merge_partials(*parts[0], *parts[1])
        parts = [(out[1:], lse[1:]) for out, lse in parts]
        plain = plain[1:]
    out, _ = merge_partials(*parts[0], *parts[1])
    np.testing.assert_allclose(out, plain, rtol=0, atol=tol)


def test_return_lse_is_a_flag():
    # return_lse="no" was accepted (truthy: out and lse came back); every other
    # flag of the call is checked.
    q = np.ones((2, 4))
    for bad in ("no", 1, None):
        with pytest.raises(AttnlabError, match=r"return_lse: expected True or False, got"):
            flash_attention(q, q, q, return_lse=bad)
    assert isinstance(flash_attention(q, q, q, return_lse=np.bool_(False)), np.ndarray)


def test_merge_partials_checks_shapes():
    with pytest.raises(ShapeError, match=r"out2: expected the shape of out1 .* = \(3, 2\)"):
        merge_partials(np.zeros((3, 2)), np.zeros(3), np.zeros((3, 4)), np.zeros(3))
    with pytest.raises(ShapeError, match=r"lse2: expected the forward's \(\.\.\., T\) = \(3\)"):
        merge_partials(np.zeros((3, 2)), np.zeros(3), np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(AttnlabError, match="lse1: expected finite values or -inf"):
        merge_partials(np.zeros((3, 2)), np.full(3, np.nan), np.zeros((3, 2)), np.zeros(3))


# ------------------------------------------------------------------------ errors

BAD_INPUTS = [  # (q, k, v, kwargs): each is refused by the plain path
    (np.zeros(4), np.zeros((3, 4)), np.zeros((3, 2)), {}),
    (np.zeros((2, 4)), np.zeros((3, 5)), np.zeros((3, 2)), {}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((4, 2)), {}),
    (np.zeros((2, 2, 4)), np.zeros((3, 3, 4)), np.zeros((3, 3, 2)), {}),
    (np.full((2, 4), np.nan), np.zeros((3, 4)), np.zeros((3, 2)), {}),
    (np.zeros((2, 4), dtype=bool), np.zeros((3, 4)), np.zeros((3, 2)), {}),
    (None, np.zeros((3, 4)), np.zeros((3, 2)), {}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"mask": np.ones((2, 3))}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"mask": np.ones((2, 4), bool)}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"bias": np.full((2, 3), np.nan)}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"bias": np.zeros((5, 3))}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"scale": float("inf")}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"scale": "0.5"}),
    (np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 2)), {"is_causal": 1}),
]


@pytest.mark.parametrize("q,k,v,kwargs", BAD_INPUTS)
def test_refuses_exactly_what_the_plain_path_refuses(q, k, v, kwargs):
    with pytest.raises(AttnlabError) as plain:
        scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(AttnlabError) as flash:
        flash_attention(q, k, v, **kwargs)
    assert type(flash.value) is type(plain.value)
    assert str(flash.value) == str(plain.value)


def test_block_and_backward_argument_errors():
    q = k = v = np.zeros((3, 4))
    with pytest.raises(AttnlabError, match="block_q: expected an integer >= 1, got 0"):
        flash_attention(q, k, v, block_q=0)
    with pytest.raises(AttnlabError, match="block_k: expected an integer, got float 2.0"):
        flash_attention(q, k, v, block_k=2.0)
    out, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ShapeError, match=r"lse: expected the forward's \(\.\.\., T\) = \(3\)"):
        flash_attention_backward(q, k, v, out, lse[:2], out)
    with pytest.raises(ShapeError, match=r"out: expected the forward's \(\.\.\., T, Dv\)"):
        flash_attention_backward(q, k, v, out[:, :2], lse, out)
    with pytest.raises(ShapeError, match=r"dout: expected the output's shape"):
        flash_attention_backward(q, k, v, out, lse, out[:2])
    with pytest.raises(AttnlabError, match="lse: expected finite values or -inf"):
        flash_attention_backward(q, k, v, out, np.full(3, np.inf), out)


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e306), (np.float32, 3e38),
                                        (np.float32, 1e33)])
def test_huge_values_do_not_overflow_the_running_sums(dtype, big):
    """Σ p·v with p up to e^20 overflowed to inf (or NaN) where the output is finite."""
    rng = np.random.default_rng(0)
    q = (3 * rng.standard_normal((2, 40, 8))).astype(dtype)
    k = (3 * rng.standard_normal((2, 60, 8))).astype(dtype)
    v = rng.standard_normal((2, 60, 3)).astype(dtype)
    v[..., 0] = big * np.sign(v[..., 0])
    v[..., 1] *= 1e-30  # a tiny column next to a huge one keeps its precision
    out = flash_attention(q, k, v, is_causal=True, block_q=16, block_k=8)
    ref = scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)),
                                       is_causal=True)
    assert np.isfinite(out).all()
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for col in range(3):
        scale = np.abs(ref[..., col]).max()
        assert np.abs(out[..., col] - ref[..., col]).max() <= rtol * scale


def test_scores_that_would_overflow_are_refused():
    q = np.full((3, 4), 1e20, np.float32)
    with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
        flash_attention(q, q, q)
    with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
        flash_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), scale=1e308)


# ------------------------------------------- the masks people really pass (issue 9)
#
# A large finite negative *bias* over a query's first key tiles, with its real
# keys later: left padding written as seed 000's ``mask * -1e9``, or Hugging
# Face's ``torch.finfo(dtype).min`` additive mask. Flash used to keep its
# exponent reference near -1e9 and round the real scores against it (out off by
# 0.79, the mean of v). The plain path and a float64 log-sum-exp written out in
# this file are the references. Tolerances: float32 out/grads 2e-6 absolute
# (O(1) values, a few dozen keys: the plain float32 path itself is ~1e-7 off);
# float64 1e-12 (same sums, other order); lse in float32 compute 1e-5 (scores
# rounded to float32 before the float64 log).

FILLS = [
    ("seed000_-1e9", np.float32, -1e9),
    ("hf_finfo_min_f32", np.float32, float(np.finfo(np.float32).min)),
    ("fill_-1e4", np.float32, -1e4),
    ("fill_-1e6", np.float32, -1e6),
    ("fill_-1e20_f64", np.float64, -1e20),
    ("hf_finfo_min_f64", np.float64, float(np.finfo(np.float64).min)),
]


def _left_padded(dtype, fill, T, S, pad, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, n, 16)).astype(dtype) for n in (T, S, S))
    dout = rng.standard_normal((2, T, 16)).astype(dtype)
    bias = np.zeros((2, 1, S), dtype=dtype)  # (B, 1, S): key padding as an additive bias
    bias[0, :, :pad] = fill  # sample 0 left-padded by `pad` keys
    bias[1, :, : pad // 2] = fill
    return q, k, v, dout, bias


def _tol(dtype):
    return 2e-6 if dtype == np.float32 else 1e-12


@pytest.mark.parametrize("name,dtype,fill", FILLS, ids=[f[0] for f in FILLS])
@pytest.mark.parametrize("T,S,pad,blocks", [
    (4, 40, 32, {"block_k": 16}),  # the reported case: two whole tiles of padding
    (4, 520, 513, {}),  # default tiles, padding longer than a tile
    (9, 50, 7, {"block_q": 4, "block_k": 5}),  # padding ending inside a tile
])
def test_flash_equals_plain_under_a_huge_finite_fill(name, dtype, fill, T, S, pad, blocks):
    q, k, v, dout, bias = _left_padded(dtype, fill, T, S, pad)
    out, lse = flash_attention(q, k, v, bias=bias, return_lse=True, **blocks)
    plain = scaled_dot_product_attention(q, k, v, bias=bias)
    np.testing.assert_allclose(out, plain, rtol=0, atol=_tol(dtype))
    golden_lse = reference_lse(_f64(q), _f64(k), bias=_f64(bias))
    np.testing.assert_allclose(lse, golden_lse, rtol=1e-12, atol=1e-5 if dtype == np.float32
                               else 1e-12)
    grads = flash_attention_backward(q, k, v, out, lse, dout, bias=bias, **blocks)
    for got, want in zip(grads, sdpa_backward(q, k, v, dout, bias=bias)[:3], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=_tol(dtype))


@pytest.mark.parametrize("name,dtype,fill", FILLS, ids=[f[0] for f in FILLS])
def test_a_row_under_the_fill_everywhere_gives_the_plain_paths_uniform_weights(name, dtype, fill):
    # A finite fill over *every* key is not masking: softmax of equal scores is
    # uniform, and the plain path says so. Its lse (fill + log S) has a
    # fractional part float64 cannot hold at |fill| >= 1e16, so the backward must
    # rebuild that row's reference from the scores.
    q, k, v, dout, bias = _left_padded(dtype, fill, 6, 30, 30)
    blocks = {"block_q": 4, "block_k": 8}
    out, lse = flash_attention(q, k, v, bias=bias, return_lse=True, **blocks)
    if abs(fill) >= (1e9 if dtype == np.float32 else 1e20):  # fill + score rounds to fill
        np.testing.assert_allclose(out[0], np.broadcast_to(v[0].mean(axis=0), out[0].shape),
                                   rtol=0, atol=_tol(dtype))
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, bias=bias),
                               rtol=0, atol=_tol(dtype))
    grads = flash_attention_backward(q, k, v, out, lse, dout, bias=bias, **blocks)
    for got, want in zip(grads, sdpa_backward(q, k, v, dout, bias=bias)[:3], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=_tol(dtype))


def test_seed000_mask_times_minus_1e9_left_padding():
    # Seed 000 writes masks as 1 = blocked and adds mask * -1e9.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, n, 8)).astype(np.float32) for n in (5, 600, 600))
    blocked = np.zeros((1, 1, 1, 600), dtype=np.float32)
    blocked[..., :530] = 1.0  # 530 padded keys: more than one default key tile (512)
    out = flash_attention(q, k, v, bias=blocked * -1e9)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, bias=blocked * -1e9),
                               rtol=0, atol=2e-6)
    # and it equals the bool mask with the same meaning (True = may attend)
    np.testing.assert_allclose(out, flash_attention(q, k, v, blocked == 0), rtol=0, atol=2e-6)


def test_a_query_that_sees_one_key_gets_exactly_zero_dq():
    # Causal, T = S: query 0 sees key 0 only, so P = 1 and dq_0 = dz_0 k_0 with
    # dz_0 = 1 · (dP_00 - δ_0) = 0 exactly. The plain path gives 0; flash used to
    # give ~4e-7 on AVX-512 BLAS kernels (δ taken from ``out``).
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 300, 64)).astype(np.float32) for _ in range(3))
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = flash_attention(q, k, v, is_causal=True, block_q=96, block_k=80, return_lse=True)
    dq, _, _ = flash_attention_backward(q, k, v, out, lse, dout, is_causal=True,
                                         block_q=96, block_k=80)
    np.testing.assert_array_equal(dq[..., 0, :], 0.0)


def test_broadcast_batch_dims_too_large_for_memory_are_refused_before_allocating():
    # q (8192, 1, T, D) and k, v (1, 8192, S, D) broadcast to a (8192, 8192, T, Dv)
    # output: 32 GiB at T = 32, Dv = 4 in float32. It used to end in a bare MemoryError.
    q = np.zeros((8192, 1, 32, 4), dtype=np.float32)
    k = np.zeros((1, 8192, 8, 4), dtype=np.float32)
    with pytest.raises(AttnlabError, match=r"q, k, v: the output \(\.\.\., T, Dv\) = "
                                           r"\(8192, 8192, 32, 4\)"):
        flash_attention(q, k, k)
    out = np.broadcast_to(np.float32(0.0), (8192, 8192, 32, 4))  # a view: no memory
    with pytest.raises(AttnlabError, match=r"q, k, v: the gradient dq = \(8192, 8192, 32, 4\)"):
        flash_attention_backward(q, k, k, out, out[..., 0], out)


def test_finfo_min_bias_on_a_huge_negative_score_warns_nothing():
    # Found by the property test: score -1.7e30 plus finfo.min overflows float32 to
    # -inf (that key is then blocked, as on the plain path); it used to raise
    # RuntimeWarning, an error under this suite's settings.
    q = np.array([[1257.3], [1.0]], dtype=np.float32)
    k = np.array([[-1.32e29], [1.0]], dtype=np.float32)
    v = np.array([[1.0], [2.0]], dtype=np.float32)
    bias = np.array([[np.finfo(np.float32).min, 0.0]] * 2, dtype=np.float32)
    out, lse = flash_attention(q, k, v, bias=bias, return_lse=True, block_k=1)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, bias=bias), atol=1e-6)
    grads = flash_attention_backward(q, k, v, out, lse, np.ones_like(out), bias=bias, block_k=1)
    assert all(np.isfinite(g).all() for g in grads)


def test_scores_near_the_largest_float_give_the_plain_result():
    # Scores of ±3e38 fit float32 (3.4e38) but not in base 2 (times log2 e = 1.44):
    # such inputs are computed in base e.
    q = np.array([[1e19], [-1e19]], dtype=np.float32)
    k = np.array([[3e19], [-3e19], [1.0]], dtype=np.float32)
    v = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    out, lse = flash_attention(q, k, v, scale=1.0, return_lse=True)
    np.testing.assert_array_equal(out, scaled_dot_product_attention(q, k, v, scale=1.0))
    np.testing.assert_allclose(lse, reference_lse(_f64(q), _f64(k), scale=1.0), rtol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pattern", ["rising", "falling"])
def test_running_reference_moves_without_a_bias_too(pattern, dtype):
    # As test_running_reference_moves_up_and_down, with the ramp in q·kᵀ instead
    # of a bias (so the scores are made in base 2): the later tiles of "rising"
    # leave the window after every row has mass, so they are first tried without
    # their max and then redone. Tolerance: the scores (up to 120) are rounded
    # differently on the two paths ((q·scale·log2 e)·k vs (q·k)·scale), and exp
    # turns an absolute error of the score into a relative error of the weight:
    # 8 ulps of the largest score, times the largest |v|.
    rng = np.random.default_rng(6)
    T, S = 6, 40
    q, k, v = rng.standard_normal((T, 4)), rng.standard_normal((S, 4)), rng.standard_normal((S, 2))
    ramp = np.linspace(0.0, 240.0, S)  # · scale 1/2: scores up to 120 apart
    q[:, 0], k[:, 0] = 1.0, ramp if pattern == "rising" else ramp[::-1]
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    out, lse = flash_attention(q, k, v, block_q=4, block_k=6, return_lse=True)
    golden = scaled_dot_product_attention(_f64(q), _f64(k), _f64(v))
    atol = 8 * float(np.finfo(dtype).eps) * 125 * float(np.abs(v).max())
    np.testing.assert_allclose(out, golden, rtol=0, atol=atol)
    np.testing.assert_allclose(lse, reference_lse(_f64(q), _f64(k)), rtol=0, atol=atol)


# -------------------------------------------------------------- parts and threads


def _problem_split_into_parts(dtype):
    """Batch (2, 3), T = S = 300: one tile of all six heads holds 540,000 scores, more
    than a part's 2**18, so the forward splits the batch into one part per head;
    the mask and bias have fewer and size-1 batch dims, which the parts must broadcast."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 3, 300, 16)).astype(dtype)
    k = rng.standard_normal((2, 1, 300, 16)).astype(dtype)  # one k head shared by 3 q heads
    v = rng.standard_normal((3, 300, 8)).astype(dtype)
    mask = rng.random((2, 1, 1, 300)) < 0.8  # (B, 1, 1, S) key padding
    mask[1, ..., :] = False  # batch row 1: no key at all, rows of 0 and lse -inf
    bias = rng.standard_normal((3, 300, 300)).astype(dtype)  # (H, T, S)
    return q, k, v, mask, bias


@pytest.mark.parametrize("with_bias", [False, True])
def test_parts_of_the_batch_equal_the_plain_path(with_bias):
    q, k, v, mask, bias = _problem_split_into_parts(np.float64)
    bias = bias if with_bias else None
    stats = FlashStats()
    out, lse = flash_attention(q, k, v, mask, bias=bias, is_causal=True, return_lse=True,
                               stats=stats)
    expected = scaled_dot_product_attention(q, k, v, mask, bias=bias, is_causal=True)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)  # 1e-12: as above
    expected_lse = reference_lse(q, k, mask, bias, is_causal=True)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    finite = np.isfinite(expected_lse)
    np.testing.assert_allclose(lse[finite], expected_lse[finite], rtol=0, atol=1e-12)
    # One tile (300 < 512) over all batch-heads; batch row 0 has keys in it.
    assert (stats.computed, stats.skipped) == (1, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_give_the_same_numbers_bit_for_bit(dtype):
    # num_threads only chooses which thread computes each part; the parts, and
    # the BLAS thread count inside them (1), are the same: equal to the last bit.
    # num_threads=None lets BLAS use its own threads inside each matmul, which
    # may split a matmul's output differently but not its sums: allowed 4 ulps.
    q, k, v, mask, bias = _problem_split_into_parts(dtype)
    for opts in ({"is_causal": True}, {"bias": bias}, {"block_q": 64, "block_k": 100}):
        runs = {}
        for num_threads in (None, 1, 2, 3):
            stats = FlashStats()
            out, lse = flash_attention(q, k, v, mask, **opts, return_lse=True,
                                       stats=stats, num_threads=num_threads)
            runs[num_threads] = out, lse, stats
        for num_threads in (2, 3):
            np.testing.assert_array_equal(runs[num_threads][0], runs[1][0])
            np.testing.assert_array_equal(runs[num_threads][1], runs[1][1])
            assert runs[num_threads][2] == runs[1][2]
        eps = float(np.finfo(dtype).eps)
        np.testing.assert_allclose(runs[None][0], runs[1][0], rtol=0, atol=4 * eps)
        np.testing.assert_allclose(runs[None][1], runs[1][1], rtol=4 * eps, atol=0)
        assert runs[None][2] == runs[1][2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_threads_give_the_same_numbers_bit_for_bit(dtype):
    # As for the forward: the backward's parts (batch-heads, each with all its
    # query blocks) are the same whichever thread computes them. The gradients
    # are checked against the plain backward in float64 above; here only that
    # the threads change nothing, and that parts of the batch broadcast mask,
    # bias and a shared k head correctly (float64 vs the plain path, 1e-12).
    q, k, v, mask, bias = _problem_split_into_parts(dtype)
    dout = np.random.default_rng(12).standard_normal((2, 3, 300, 8)).astype(dtype)
    for opts in ({"is_causal": True}, {"bias": bias}, {"block_q": 64, "block_k": 100}):
        out, lse = flash_attention(q, k, v, mask, **opts, return_lse=True)
        runs = {n: flash_attention_backward(q, k, v, out, lse, dout, mask, **opts, num_threads=n)
                for n in (None, 1, 2, 3)}
        for n in (2, 3):
            for got, want in zip(runs[n], runs[1], strict=True):
                np.testing.assert_array_equal(got, want)
        eps = float(np.finfo(dtype).eps)
        # BLAS's own threads may split a matmul's sums differently: each gradient is a
        # sum of a few hundred terms, rounded afresh, so 32 ulps of the largest gradient.
        for got, want in zip(runs[None], runs[1], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=32 * eps * float(np.abs(want).max()))
        if dtype == np.float64:
            plain_opts = {key: value for key, value in opts.items() if key in ("is_causal", "bias")}
            expected = sdpa_backward(q, k, v, dout, mask, **plain_opts)[:3]
            for got, want in zip(runs[2], expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_num_threads_is_checked():
    q = k = v = np.zeros((3, 4))
    with pytest.raises(AttnlabError, match="num_threads: expected an integer >= 1, got 0"):
        flash_attention(q, k, v, num_threads=0)
    with pytest.raises(AttnlabError, match="num_threads: expected an integer, got float 2.0"):
        flash_attention(q, k, v, num_threads=2.0)
    with pytest.raises(AttnlabError, match="num_threads: expected an integer >= 1, got 0"):
        flash_attention_backward(q, k, v, q, np.zeros(3), q, num_threads=0)
