"""Inputs chosen to break attnlab.torch (and the twins' agreement): each gives the right
result or one clear AttnlabError.

The torch half of tests/core/test_adversarial.py, whose docstring says how the
errors are matched. Every test here failed before its fix with a bare exception
(IndexError, RuntimeError, ...), silently wrong numbers or twins that disagreed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError


def _qkv(*shape_q, S=5, Dv=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    *batch, T, D = shape_q
    q = torch.randn(*batch, T, D, generator=gen, dtype=dtype)
    k = torch.randn(*batch, S, D, generator=gen, dtype=dtype)
    v = torch.randn(*batch, S, Dv, generator=gen, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------- A. masks of any rank


# 1-D and 0-d masks broadcast to (..., T, S) like any other: torch's fused kernel
# indexes dim -2 of its attn_mask, so they used to end in a bare IndexError.
LOW_RANK_MASKS = [
    torch.tensor([True, False, True, True, False]),  # (S,)
    torch.tensor([False, False, False, False, False]),  # (S,), every row fully masked
    torch.tensor(True),  # ()
    torch.tensor(False),  # ()
]


@pytest.mark.parametrize("mask", LOW_RANK_MASKS, ids=["S", "S-none", "0d", "0d-none"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_torch_sdpa_takes_a_mask_of_rank_below_two(mask, return_weights):
    q, k, v = _qkv(2, 3, 4, 8)  # (B, H, T, D), S = 5
    got = at.scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = got[0] if return_weights else got
    full = mask.expand(2, 3, 4, 5)  # the mask expanded by hand: (B, H, T, S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    expected = expected.masked_fill(~full.any(-1, keepdim=True), 0.0)  # attnlab: no key -> 0
    # float64 end to end: the two kernels differ only in summation order.
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    numpy_out = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                     mask.numpy())
    np.testing.assert_allclose(out.numpy(), numpy_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [torch.tensor([0.0, -1.0, float("-inf"), 2.0, 0.5]),
                                  torch.tensor(-3.0)], ids=["S", "0d"])
def test_torch_sdpa_takes_a_bias_of_rank_below_two(bias):
    q, k, v = _qkv(2, 3, 4, 8)
    out = at.scaled_dot_product_attention(q, k, v, bias=bias)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(2, 3, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64, as above
    plain = at.scaled_dot_product_attention(q, k, v, bias=bias, return_weights=True)[0]
    torch.testing.assert_close(out, plain, rtol=1e-12, atol=1e-12)


def test_torch_sdpa_takes_a_1d_mask_and_a_1d_bias_together():
    q, k, v = _qkv(2, 3, 4, 8)
    mask, bias = torch.tensor([True, True, False, True, True]), torch.arange(5.0).double()
    out = at.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")).expand(2, 3, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64


def test_torch_multihead_takes_a_1d_mask_without_weights():
    torch.manual_seed(0)
    mha = at.MultiHeadAttention(2, 8, dtype=torch.float64)
    x, mask = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([True, False] * 2 + [True])
    out, _ = mha(x, x, x, mask=mask, return_weights=False)
    with_weights, _ = mha(x, x, x, mask=mask, return_weights=True)
    torch.testing.assert_close(out, with_weights, rtol=1e-12, atol=1e-12)  # float64, two paths


# ---------------------------------------------------------------- F. tensors the core cannot read


def test_numpy_core_names_a_tensor_that_requires_grad():
    q = torch.ones(3, 4, requires_grad=True)
    with pytest.raises(AttnlabError, match=r"^q: expected a NumPy array, got a Tensor that "
                                           r"requires grad; pass q\.detach\(\)"):
        attnlab.scaled_dot_product_attention(q, np.ones((5, 4)), np.ones((5, 2)))
    with pytest.raises(AttnlabError, match=r"^mask: expected a NumPy array"):
        attnlab.scaled_dot_product_attention(
            np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2)), torch.ones(3, 5, requires_grad=True))


META = "on the meta device, which holds none"


def _meta(*shape):
    return torch.zeros(*shape, device="meta")


@pytest.mark.parametrize("call,name", [
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2)), "q"),
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2),
                                             return_weights=True), "q"),
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2),
                                             bias=_meta(3, 5)), "bias"),
    (lambda: at.softmax(_meta(3, 4)), "x"),
    (lambda: at.apply_rope(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long,
                                                          device="meta")), "positions"),
    (lambda: at.MultiHeadAttention(2, 8, device="meta")(_meta(2, 3, 8), _meta(2, 3, 8),
                                                        _meta(2, 3, 8)), "query"),
    (lambda: at.KVCache(1, 1, 4, device="meta").attend(_meta(1, 1, 2, 4), _meta(1, 1, 2, 4),
                                                       _meta(1, 1, 2, 4)), "k"),
], ids=["sdpa", "sdpa-weights", "bias", "softmax", "rope", "mha", "kv-cache"])
def test_torch_names_a_meta_tensor_instead_of_failing_in_item(call, name):
    """Only debug_checks() reads values (by default meta tensors give shapes, see
    test_debug_checks.py)."""
    with at.debug_checks(), pytest.raises(
            AttnlabError, match=rf"^{name}: expected a tensor holding values .*{META}"):
        call()


# ---------------------------------------------------------------- H, I. flags and scalars


@pytest.mark.parametrize("flag", ["no", "", 0, 1, None, np.array(True), torch.tensor(True)],
                         ids=["str", "empty-str", "0", "1", "None", "0d-array", "0d-tensor"])
def test_both_twins_refuse_a_flag_that_is_not_a_bool(flag):
    q = np.ones((3, 4))
    for name in ("return_weights", "is_causal"):
        with pytest.raises(AttnlabError, match=rf"^{name}: expected True or False, got "):
            attnlab.scaled_dot_product_attention(q, q, q, **{name: flag})
        with pytest.raises(AttnlabError, match=rf"^{name}: expected True or False, got "):
            at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4),
                                             torch.ones(3, 4), **{name: flag})


@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.25), np.int64(2), 3, 0.5])
@pytest.mark.parametrize("is_causal", [np.bool_(True), np.bool_(False), True])
def test_both_twins_take_numpy_scalars_and_agree(scale, is_causal):
    q, k, v = _qkv(2, 4, 8, S=4)
    numpy_out, numpy_weights = attnlab.scaled_dot_product_attention(
        q.numpy(), k.numpy(), v.numpy(), scale=scale, is_causal=is_causal,
        return_weights=np.bool_(True))
    for return_weights in (False, True):
        got = at.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=is_causal,
                                              return_weights=return_weights)
        out = got[0] if return_weights else got
        # float64 on both sides; the fused kernel sums in another order.
        np.testing.assert_allclose(out.numpy(), numpy_out, rtol=1e-12, atol=1e-12)
    assert numpy_weights.shape == (2, 4, 4)


@pytest.mark.parametrize("scale,message", [
    ("0.5", "expected a real number or None, got '0.5'"),
    (True, "expected a real number or None, got True"),
    (np.bool_(True), "expected a real number or None, got "),
    (np.array(0.5), "expected a real number or None, got "),
    (torch.tensor(0.5), "expected a real number or None, got "),
    (float("nan"), "expected a finite number, got nan"),
    (np.float32("inf"), "expected a finite number, got inf"),
    (1 + 2j, "expected a real number or None, got "),
])
def test_both_twins_refuse_the_same_bad_scales(scale, message):
    q = np.ones((3, 4))
    with pytest.raises(AttnlabError, match=rf"^scale: {message}"):
        attnlab.scaled_dot_product_attention(q, q, q, scale=scale)
    with pytest.raises(AttnlabError, match=rf"^scale: {message}"):
        at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4), torch.ones(3, 4),
                                        scale=scale)


def test_torch_rope_flag_is_checked_not_truth_tested():
    with pytest.raises(AttnlabError, match=r"^interleaved: expected True or False, got 1$"):
        at.apply_rope(torch.ones(3, 4), interleaved=1)


def test_torch_kv_cache_refuses_a_query_with_no_heads_and_appends_nothing():
    lib, make = at, torch.zeros
    cache = lib.KVCache(1, 2, 4)
    k = make((1, 2, 3, 4))
    with pytest.raises(AttnlabError, match=r"^q: expected \(B, H, T, D\) = \(1, H, 3, 4\) "
                                           r"with H a positive multiple of Hkv = 2"):
        cache.attend(make((1, 0, 3, 4)), k, k)
    assert cache.length == 0  # refused before anything was written


@pytest.mark.parametrize("scale", [np.float32(0.5), np.int64(2)])
def test_kv_cache_twins_take_numpy_scalars_and_agree(scale):
    q, k, v = _qkv(1, 4, 3, 4, S=3, Dv=4)  # (B, H, T, D) with H = Hkv = 4
    numpy_cache, torch_cache = attnlab.KVCache(1, 4, 4), at.KVCache(1, 4, 4, dtype=torch.float64)
    expected = numpy_cache.attend(q.numpy(), k.numpy(), v.numpy(), scale=scale)
    got = torch_cache.attend(q, k, v, scale=scale)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)  # float64


# ---------------------------------------------------------------- E. sizes from arguments


LIMIT = r"more than attnlab's limit of 2,147,483,648 \(attnlab\.checks\.MAX_ELEMENTS\)"

HUGE = [
    (lambda: at.causal_mask(10**6), r"T: the causal mask \(T, S\)"),
    (lambda: at.sliding_window_mask(10**6, 3, is_causal=True),
     r"T: the sliding-window mask \(T, S\)"),
    (lambda: at.alibi_bias(8, 10**5), r"num_heads, T: the bias \(H, T, S\)"),
    (lambda: at.alibi_slopes(10**10), r"num_heads: the slopes \(H,\)"),
    (lambda: at.sinusoidal_encoding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: at.PositionalEncoding(512, 10**9), r"max_len, d_model: the table"),
    (lambda: at.KVCache(1, 8, 64, capacity=10**9), r"capacity: the cache's buffer"),
    (lambda: at.KVCache(1, 8, 64, max_len=10**9), r"max_len: the cache's buffer"),
    (lambda: at.SlidingWindowKVCache(1, 8, 64, window=10**9), r"window: the cache's buffer"),
]


@pytest.mark.parametrize("call,message", HUGE, ids=[m.split(":")[0] + f"-{i}"
                                                      for i, (_, m) in enumerate(HUGE)])
def test_a_huge_size_is_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


def test_a_torch_kv_cache_refuses_to_grow_past_the_limit(monkeypatch):
    monkeypatch.setattr(attnlab.checks, "MAX_ELEMENTS", 1000)
    lib, make = at, torch.zeros
    cache = lib.KVCache(1, 2, 4, capacity=100)  # (1, 2, 100, 4): 800 elements
    cache.append(make((1, 2, 100, 4)), make((1, 2, 100, 4)))
    with pytest.raises(AttnlabError, match=r"^k: the cache's buffer \(B, Hkv, length, D\) = "
                                           r"\(1, 2, 200, 4\) would hold 1,600 elements"):
        cache.append(make((1, 2, 1, 4)), make((1, 2, 1, 4)))
    assert cache.length == 100


# ---------------------------------------------------------------- found by test_property_errors.py


@pytest.mark.parametrize("scale", [0.0, -1.0, 1e-300])
def test_torch_causal_attention_with_a_scale_torch_masks_wrongly(scale):
    """torch's fused is_causal applies its -inf mask before the scale: 0·-inf = NaN."""
    q, k, v = _qkv(1, 2, 3, 4, S=3, Dv=4, dtype=torch.float32)
    out = at.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    expected = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                    is_causal=True, scale=scale)
    # float32; summation orders differ between the fused kernel and NumPy.
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_torch_scale_zero_with_scores_that_overflow_before_scaling_is_refused():
    """q·kᵀ overflows float32 before the scale 0 is applied: inf·0 was NaN (refused under
    debug_checks, which reads the values)."""
    q, k, v = np.float32([[1e20]]), np.float32([[1e20]]), np.float32([[1.0]])
    with at.debug_checks(), pytest.raises(AttnlabError,
                                          match=r"^q, k: the scores q·kᵀ could reach"):
        at.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), scale=0.0,
                                        return_weights=True)


# ---------------------------------------------------------------- found by a sweep of bad arguments


def test_an_error_about_a_tensor_stays_on_one_line():
    with pytest.raises(AttnlabError) as info:
        at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4), torch.ones(3, 4),
                                        scale=torch.ones(3, 3, requires_grad=True))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("call,name", [
    (lambda: attnlab.apply_rope(np.ones((2, 4)), positions=torch.ones(2, requires_grad=True)),
     "positions"),
    (lambda: at.apply_rope(torch.ones(2, 4), positions="01"), "positions"),
    (lambda: at.apply_rope(torch.ones(2, 4), positions=[[0, 1], [2]]), "positions"),
    (lambda: at.rope_angles(object(), 4), "positions"),
    (lambda: attnlab.mask_to_bias(np.ones(2, bool), dtype=torch.ones(2)), "dtype"),
    (lambda: attnlab.KVCache(1, 1, 4, dtype=torch.float32), "dtype"),
], ids=["rope-grad", "t-rope-str", "t-rope-ragged", "t-angles-object",
        "bias-dtype-tensor", "cache-torch-dtype"])
def test_unreadable_arguments_are_named(call, name):
    with pytest.raises(AttnlabError, match=rf"^{name}: "):
        call()


@pytest.mark.parametrize("call,message", [
    (lambda: at.rope_angles(torch.arange(3), 10**12), r"head_dim: the angles \(T, D\)"),
    (lambda: at.MultiHeadAttention(2, 10**6), r"num_heads, d_model: the weight of q_proj"),
])
def test_more_huge_sizes_are_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


LONG = 80_000  # T = S = 80,000: every (T, S) tensor is 6.4e9 elements (6-24 GiB)


def _long(*lead):
    return torch.zeros(*lead, LONG, 8)  # (..., T, D): 2.5 MB


@pytest.mark.parametrize("call,message", [
    (lambda: at.scaled_dot_product_attention(_long(1, 1), _long(1, 1), _long(1, 1),
                                             window=(16, 0), is_causal=True),
     r"q, k: the window mask \(T, S\) = \(80000, 80000\)"),
    (lambda: at.scaled_dot_product_attention(_long(1, 1), _long(1, 1), _long(1, 1), softcap=5.0),
     r"q, k: the score matrix \(\.\.\., T, S\) = \(1, 1, 80000, 80000\)"),
    (lambda: at.scaled_dot_product_attention(_long(1, 2), _long(1, 2), _long(1, 2),
                                             alibi_slopes=torch.tensor([0.5, 0.25])),
     r"q, k: the ALiBi bias \(\.\.\., H, T, S\) = \(2, 80000, 80000\)"),
    (lambda: at.scaled_dot_product_attention(_long(1, 1), _long(1, 1)[..., :-1, :],
                                             _long(1, 1)[..., :-1, :], is_causal=True),
     r"q, k: the causal mask \(T, S\) = \(80000, 79999\)"),
    (lambda: at.scaled_dot_product_attention(_long(1, 1), _long(1, 1), _long(1, 1),
                                             sinks=torch.zeros(1)),
     r"q, k: the sinks' float mask \(\.\.\., H, T, S \+ 1\) = \(1, 1, 80000, 80001\)"),
    (lambda: at.varlen_attention(_long(1)[0, :, None], _long(1)[0, :, None],
                                 _long(1)[0, :, None], [0, LONG], [0, LONG], LONG, LONG,
                                 window=(16, 0), is_causal=True),
     r"q, k: the window mask \(T, S\) = \(80000, 80000\)"),
])
def test_attention_options_at_a_huge_length_are_refused_before_allocating(call, message):
    # attnlab.torch had no size guard here: a window, a soft cap, ALiBi, a causal
    # mask with T != S, sinks and varlen's window each tried to build 6-24 GiB. Now
    # the NumPy twin's one-line check_alloc refusal, before anything is built.
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


def test_converting_a_meta_module_to_numpy_is_refused_by_name():
    with pytest.raises(AttnlabError, match=r"^module: expected parameters holding values, got "
                                           r"parameters on the meta device"):
        at.to_numpy(at.MultiHeadAttention(2, 8, device="meta"))
