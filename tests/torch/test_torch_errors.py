"""Every validation error of attnlab.torch: which argument, what was expected, what came.

Each case names the exception class and matches the message, so a check that
stops firing, or starts blaming the wrong argument, fails here. Inputs on the
"meta" device stand in for tensors on another device (no GPU needed).

``CASES`` are checked from metadata on every call; ``VALUE_CASES`` read values and
fire only under ``attnlab.torch.debug_checks()`` (each is also run without it, where
it must not raise).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError, ShapeError

Z = torch.zeros
sdpa = at.scaled_dot_product_attention
q3, k5, v5 = Z(3, 4), Z(5, 4), Z(5, 2)  # T = 3, S = 5, D = 4, Dv = 2


def mha(**kw):
    return at.MultiHeadAttention(2, 8, **kw)


X, CTX = Z(2, 3, 8), Z(2, 5, 8)  # (B, T, E), (B, S, E)

CASES = [
    # ---- scaled_dot_product_attention: q, k, v
    (lambda: sdpa(None, k5, v5), AttnlabError, r"^q: expected a torch.Tensor, got None$"),
    (lambda: sdpa(q3.numpy(), k5, v5), AttnlabError,
     r"^q: expected a torch.Tensor, got ndarray; convert NumPy arrays with torch.from_numpy"),
    (lambda: sdpa(q3.bool(), k5, v5), AttnlabError,
     r"^q: expected a numeric tensor, got dtype torch.bool$"),
    (lambda: sdpa(q3, k5.to(torch.complex64), v5), AttnlabError,
     r"^k: expected a real float or integer tensor, got dtype torch.complex64$"),
    (lambda: sdpa(Z(4), k5, v5), ShapeError, r"^q: expected \(\.\.\., T, D\), got \(4\)$"),
    (lambda: sdpa(q3, Z(4), v5), ShapeError, r"^k: expected \(\.\.\., S, D\), got \(4\)$"),
    (lambda: sdpa(q3, k5, Z(2)), ShapeError, r"^v: expected \(\.\.\., S, Dv\), got \(2\)$"),
    (lambda: sdpa(q3, Z(5, 3), v5), ShapeError,
     r"^k: expected \(\.\.\., S, 4\) to match q's last dim 4, got \(5, 3\)$"),
    (lambda: sdpa(q3, k5, Z(6, 2)), ShapeError,
     r"^v: expected \(\.\.\., 5, Dv\) to match k's length S = 5, got \(6, 2\)$"),
    (lambda: sdpa(Z(2, 3, 4), Z(3, 5, 4), Z(3, 5, 2)), ShapeError,
     r"^q, k, v: expected leading \(batch\) dims that broadcast together, got "
     r"q \(2, 3, 4\), k \(3, 5, 4\), v \(3, 5, 2\)$"),
    (lambda: sdpa(q3, Z(5, 4, device="meta"), v5), AttnlabError,
     r"^k: expected a tensor on q's device cpu, got meta$"),
    (lambda: sdpa(q3, k5, v5.to("meta")), AttnlabError,
     r"^v: expected a tensor on q's device cpu, got meta$"),
    (lambda: sdpa(Z(1, 1, 1).expand(2**16, 2**16, 1), Z(1, 1).expand(2**16, 1),
                  Z(1, 1).expand(2**16, 1), return_weights=True), AttnlabError,
     r"^q, k: the score matrix \(65536, 65536, 65536\) would hold .* elements, more than "
     r"the plain path's limit"),
    # ---- mask, bias, options
    (lambda: sdpa(q3, k5, v5, Z(3, 5)), AttnlabError,
     r"^mask: expected a bool tensor \(True = may attend\), got dtype torch.float32\. "
     r"For a 0/1 mask use m == 1"),
    (lambda: sdpa(q3, k5, v5, [[True] * 5] * 3), AttnlabError,
     r"^mask: expected a bool torch.Tensor \(True = may attend\), got list$"),
    (lambda: sdpa(q3, k5, v5, Z(2, 5, dtype=torch.bool)), ShapeError,
     r"^mask: expected a shape broadcastable to \(\.\.\., T, S\) = \(3, 5\), got \(2, 5\)$"),
    (lambda: sdpa(q3, k5, v5, Z(3, 5, dtype=torch.bool, device="meta")), AttnlabError,
     r"^mask: expected a tensor on q's device cpu, got meta$"),
    (lambda: sdpa(q3, k5, v5, bias=Z(4, 5)), ShapeError,
     r"^bias: expected a shape broadcastable to \(\.\.\., T, S\) = \(3, 5\), got \(4, 5\)$"),
    (lambda: sdpa(q3, k5, v5, bias=Z(3, 5, dtype=torch.bool)), AttnlabError,
     r"^bias: expected a numeric tensor, got dtype torch.bool$"),
    (lambda: sdpa(q3, k5, v5, scale="0.5"), AttnlabError,
     r"^scale: expected a real number or None, got '0.5'$"),
    (lambda: sdpa(q3, k5, v5, scale=float("inf")), AttnlabError,
     r"^scale: expected a finite number, got inf$"),
    (lambda: sdpa(q3, k5, v5, is_causal=1), AttnlabError,
     r"^is_causal: expected True or False, got 1$"),
    (lambda: sdpa(q3, k5, v5, dropout_p=1.0), AttnlabError,
     r"^dropout_p: expected a probability in \[0, 1\), got 1.0$"),
    # ---- softmax, causal_mask
    (lambda: at.softmax(torch.tensor(1.0)), ShapeError,
     r"^x: expected at least 1 dimension, got a scalar$"),
    (lambda: at.softmax(Z(2, 3), dim=2), AttnlabError,
     r"^dim: expected an int in \[-2, 1\], got 2$"),
    (lambda: at.causal_mask(-1), AttnlabError, r"^T: expected an integer >= 0, got -1$"),
    (lambda: at.causal_mask(2, 2.0), AttnlabError, r"^S: expected an integer, got float 2.0$"),
    # ---- MultiHeadAttention(...)
    (lambda: at.MultiHeadAttention(0, 8), AttnlabError,
     r"^num_heads: expected an integer >= 1, got 0$"),
    (lambda: at.MultiHeadAttention(3, 8), AttnlabError,
     r"^d_model: expected a multiple of num_heads = 3 \(or pass head_dim\), got 8$"),
    (lambda: at.MultiHeadAttention(4, 8, num_kv_heads=3), AttnlabError,
     r"^num_kv_heads: expected a divisor of num_heads = 4, got 3$"),
    (lambda: at.MultiHeadAttention(2, 8, 0.1), TypeError, r"positional argument"),
    (lambda: at.MultiHeadAttention(2, 8, head_dim=0), AttnlabError,
     r"^head_dim: expected an integer >= 1, got 0$"),
    (lambda: mha(dropout=-0.1), AttnlabError,
     r"^dropout: expected a probability in \[0, 1\), got -0.1$"),
    (lambda: mha(use_bias=1), AttnlabError, r"^use_bias: expected True or False, got 1$"),
    (lambda: at.MultiHeadAttention(2, 6, rope=True), AttnlabError,
     r"^head_dim: RoPE rotates pairs of features, expected an even D, got 3$"),
    (lambda: mha(rope_base=0), AttnlabError, r"^rope_base: expected a finite number > 0, got 0$"),
    (lambda: mha(v_gain=-1.0), AttnlabError, r"^v_gain: expected a finite number >= 0, got -1.0$"),
    # ---- MultiHeadAttention.forward
    (lambda: mha()(X.numpy(), X, X), AttnlabError, r"^query: expected a torch.Tensor, got ndarray"),
    (lambda: mha()(X.double(), X, X), AttnlabError,
     r"^query: expected dtype torch.float32 \(the module's parameters\), got torch.float64"),
    (lambda: mha()(X, X.to("meta"), X), AttnlabError,
     r"^key: expected a tensor on the module's device cpu, got meta$"),
    (lambda: mha()(Z(1, 2, 3, 8), X, X), ShapeError,
     r"^query: expected \(B, T, 8\) or \(T, 8\) with E = d_model, got \(1, 2, 3, 8\)$"),
    (lambda: mha()(Z(2, 3, 6), X, X), ShapeError,
     r"^query: expected \(B, T, 8\) or \(T, 8\) with E = d_model, got \(2, 3, 6\)$"),
    (lambda: mha()(X, Z(3, 5, 8), Z(3, 5, 8)), ShapeError,
     r"^key: expected \(2, S, 8\) to match query's batch and d_context = 8, got \(3, 5, 8\)$"),
    (lambda: mha(d_context=5)(X, CTX, CTX), ShapeError,
     r"^key: expected \(2, S, 5\) to match query's batch and d_context = 5, got \(2, 5, 8\)$"),
    (lambda: mha()(X, CTX, Z(2, 4, 8)), ShapeError,
     r"^value: expected \(2, 5, 8\) to match key's length, got \(2, 4, 8\)$"),
    (lambda: mha()(X, CTX, CTX, mask=Z(3, 5)), AttnlabError,
     r"^mask: expected a bool tensor \(True = may attend\), got dtype torch.float32"),
    (lambda: mha()(X, CTX, CTX, mask=Z(3, 3, 5, dtype=torch.bool)), ShapeError,
     r"^mask: expected a shape broadcastable to \(B, H, T, S\) = \(2, 2, 3, 5\), got \(3, 3, 5\)$"),
    (lambda: mha()(X[0], CTX[0], CTX[0], mask=Z(3, 3, 5, dtype=torch.bool)), ShapeError,
     r"^mask: expected a shape broadcastable to \(H, T, S\) = \(2, 3, 5\), got \(3, 3, 5\)$"),
    (lambda: mha()(X, CTX, CTX, key_padding=Z(2, 5)), ShapeError,
     r"^key_padding: expected bool \(2, 5\) \(True = real token\), got torch.float32 \(2, 5\)$"),
    (lambda: mha()(X, CTX, CTX, key_padding=Z(2, 3, dtype=torch.bool)), ShapeError,
     r"^key_padding: expected bool \(2, 5\) \(True = real token\), got torch.bool \(2, 3\)$"),
    (lambda: mha()(X, CTX, CTX, key_padding=[[True] * 5] * 2), ShapeError,
     r"^key_padding: expected bool \(2, 5\) \(True = real token\), got list$"),
    (lambda: mha()(X, CTX, CTX, bias=Z(2, 3, 5, dtype=torch.int64)), AttnlabError,
     r"^bias: expected a float tensor, got torch.int64$"),
    (lambda: mha()(X, CTX, CTX, bias=Z(4, 3, 5)), ShapeError,
     r"^bias: expected a shape broadcastable to \(B, H, T, S\) = \(2, 2, 3, 5\), got \(4, 3, 5\)$"),
    (lambda: mha()(X, CTX, CTX, is_causal="yes"), AttnlabError,
     r"^is_causal: expected True or False, got 'yes'$"),
    (lambda: mha()(X, CTX, CTX, return_weights=None), AttnlabError,
     r"^return_weights: expected True or False, got None$"),
    (lambda: mha()(Z(1, 8).expand(2**16, 8), Z(1, 8).expand(2**16, 8), Z(1, 8).expand(2**16, 8),
                   return_weights=True), AttnlabError,
     r"^q, k: the score matrix \(2, 65536, 65536\) would hold .* elements"),
    (lambda: mha(rope=True)(CTX, X, X), AttnlabError,
     r"^query: RoPE places queries at positions S - T \.\. S - 1, expected T <= S, "
     r"got T = 5, S = 3$"),
    # ---- conversions
    (lambda: at.MultiHeadAttention.from_numpy("weights"), AttnlabError,
     r"^mha: expected an attnlab.MultiHeadAttention, got str$"),
    (lambda: at.from_numpy(object()), AttnlabError,
     r"^obj: expected an attnlab MultiHeadAttention, SelfAttentionLayer, LayerNorm or "
     r"SinusoidalPositionalEncoding, got object$"),
    (lambda: at.to_numpy(nn.Linear(2, 2)), AttnlabError,
     r"^module: expected an attnlab.torch MultiHeadAttention, .* got Linear$"),
    (lambda: at.to_torch_multihead(nn.Linear(2, 2)), AttnlabError,
     r"^mha: expected an attnlab.torch.MultiHeadAttention, got Linear$"),
    (lambda: at.to_torch_multihead(at.MultiHeadAttention(4, 8, num_kv_heads=2)), AttnlabError,
     r"^mha: expected Hkv = H, .* got num_kv_heads = 2 \(GQA\)$"),
    (lambda: at.to_torch_multihead(at.MultiHeadAttention(2, 8, head_dim=3)), AttnlabError,
     r"got head dims D = 3, Dv = 3 with H = 2, E = 8$"),
    (lambda: at.to_torch_multihead(mha(d_out=4)), AttnlabError, r"got d_out = 4$"),
    (lambda: at.to_torch_multihead(mha(alibi=True)), AttnlabError, r"got rope/alibi$"),
    (lambda: at.to_torch_multihead(mha(scale=0.5)), AttnlabError,
     r"got scale = 0.5 \(nn.MultiheadAttention scales by 1/√D\)$"),
    (lambda: at.from_torch_multihead(nn.Linear(2, 2)), AttnlabError,
     r"^module: expected a torch.nn.MultiheadAttention, got Linear$"),
    (lambda: at.MultiHeadAttention(2, 8, add_bias_kv=True).to_numpy(), AttnlabError,
     r"^module: expected add_bias_kv=False and add_zero_attn=False"),
    (lambda: at.MultiHeadAttention(2, 8, d_context=5, d_value_context=6)(X, Z(2, 5, 5),
                                                                          Z(2, 5, 5)),
     ShapeError, r"^value: expected \(2, S, 6\) to match query's batch and d_value_context = 6, "
                 r"got \(2, 5, 5\)$"),
    # ---- LayerNorm, SelfAttentionLayer
    (lambda: at.LayerNorm(0), AttnlabError, r"^d_model: expected an integer >= 1, got 0$"),
    (lambda: at.LayerNorm(8, eps=0.0), AttnlabError,
     r"^eps: expected a finite number > 0, got 0.0$"),
    (lambda: at.LayerNorm(8)(Z(2, 7)), ShapeError, r"^x: expected \(\.\.\., 8\), got \(2, 7\)$"),
    (lambda: at.LayerNorm(8)(Z(2, 8, dtype=torch.float64)), AttnlabError,
     r"^x: expected dtype torch.float32 \(the module's parameters\), got torch.float64"),
    (lambda: at.LayerNorm.from_numpy(attnlab.Dropout()), AttnlabError,
     r"^norm: expected an attnlab.LayerNorm, got Dropout$"),
    (lambda: at.SelfAttentionLayer(8, 2, dropout=2), AttnlabError,
     r"^dropout: expected a probability in \[0, 1\), got 2$"),
    (lambda: at.SelfAttentionLayer(8, 2, norm=True), AttnlabError,
     r"^norm: expected 'post' or 'pre', got True$"),
    (lambda: at.SelfAttentionLayer(8, 2, 0.1, "pre"), TypeError, r"positional argument"),
    (lambda: at.SelfAttentionLayer(8, 2)(X, key_padding=Z(2, 3)), ShapeError,
     r"^key_padding: expected bool \(2, 3\) \(True = real token\), got torch.float32 \(2, 3\)$"),
    (lambda: at.SelfAttentionLayer(8, 2)(Z(2, 3, 6)), ShapeError,
     r"^x: expected \(B, T, 8\) or \(T, 8\) with E = d_model, got \(2, 3, 6\)$"),
    (lambda: at.SelfAttentionLayer(8, 2)(X, mask=Z(3, 3)), AttnlabError,
     r"^mask: expected a bool tensor \(True = may attend\), got dtype torch.float32"),
    (lambda: at.SelfAttentionLayer.from_numpy(attnlab.EncoderBlock(8, 2, 16)), AttnlabError,
     r"^layer: expected an attnlab.SelfAttentionLayer, got EncoderBlock$"),
]


VALUE_CASES = [
    (lambda: sdpa(torch.tensor([[float("nan"), 0.0]]), Z(1, 2), Z(1, 2)), AttnlabError,
     r"^q: expected finite values, got 1 non-finite \(first: NaN at index \(0, 0\)\)$"),
    (lambda: sdpa(q3, k5, torch.full((5, 2), float("inf"))), AttnlabError,
     r"^v: expected finite values, got 10 non-finite \(first: Inf at index \(0, 0\)\)$"),
    (lambda: sdpa(q3, k5, v5, bias=torch.full((3, 5), float("nan"))), AttnlabError,
     r"^bias: expected finite values or -inf, got NaN or \+inf$"),
    (lambda: sdpa(q3, k5, v5, bias=torch.full((3, 5), float("inf"))), AttnlabError,
     r"^bias: expected finite values or -inf, got NaN or \+inf$"),
    (lambda: at.softmax(torch.tensor([float("inf")])), AttnlabError,
     r"^x: expected finite values or -inf, got NaN or \+inf$"),
    (lambda: mha()(X, CTX, CTX, bias=torch.full((3, 5), float("nan"))), AttnlabError,
     r"^bias: expected finite values or -inf, got NaN or \+inf$"),
    (lambda: mha()(X, CTX, torch.full((2, 5, 8), float("nan"))), AttnlabError,
     r"^value: expected finite values, got 80 non-finite \(first: NaN at index \(0, 0, 0\)\)$"),
    (lambda: at.LayerNorm(2)(torch.tensor([float("inf"), 0.0])), AttnlabError,
     r"^x: expected finite values, got 1 non-finite \(first: Inf at index \(0,\)\)$"),
]


@pytest.mark.parametrize("call,error,match", CASES)
def test_validation_error(call, error, match):
    with pytest.raises(error, match=match):
        call()
    with at.debug_checks(), pytest.raises(error, match=match):  # the same under debug checks
        call()


@pytest.mark.parametrize("call,error,match", VALUE_CASES)
def test_value_error_under_debug_checks_only(call, error, match):
    with at.debug_checks(), pytest.raises(error, match=match):
        call()
    call()  # by default values are not read: NaN and Inf propagate as in torch


def test_errors_are_value_errors():
    # AttnlabError subclasses ValueError, so existing `except ValueError` code keeps working.
    with pytest.raises(ValueError):
        sdpa(q3, k5, v5, is_causal=1)


# ---- adversarial values, under debug_checks: never NaN, never a bare torch error

HUGE = torch.full((2, 4), 1e20)  # float32: q·kᵀ = 4e40 overflows to inf, softmax to NaN


@pytest.mark.parametrize("call", [
    lambda: sdpa(HUGE, HUGE, Z(2, 4)),
    lambda: sdpa(HUGE, HUGE, Z(2, 4), return_weights=True),
    lambda: sdpa(HUGE.double() * 1e180, HUGE.double() * 1e180, Z(2, 4, dtype=torch.float64)),
    lambda: sdpa(torch.tensor([[3e38, 3e38]]), torch.ones(2, 2), torch.ones(2, 2)),
    lambda: mha()(*[torch.full((1, 3, 8), 1e30)] * 3),
])
def test_scores_that_would_overflow_are_refused_not_nan(call):
    with at.debug_checks(), pytest.raises(AttnlabError,
                                          match="q, k: the scaled scores could reach"):
        call()


@pytest.mark.parametrize("dim", ["0", 0.5, True])
def test_softmax_dim_must_be_an_int(dim):
    with pytest.raises(AttnlabError, match=r"^dim: expected an int in \[-1, 0\], got"):
        at.softmax(torch.zeros(3), dim=dim)


@pytest.mark.parametrize("make", [
    lambda dtype: at.MultiHeadAttention(2, 8, dtype=dtype),
    lambda dtype: at.LayerNorm(4, dtype=dtype),
    lambda dtype: at.SelfAttentionLayer(8, 2, dtype=dtype),
])
@pytest.mark.parametrize("dtype", [torch.int64, "float32"])
def test_module_dtype_must_be_a_torch_float_dtype(make, dtype):
    with pytest.raises(AttnlabError, match="^dtype: expected a torch float dtype or None"):
        make(dtype)


@pytest.mark.parametrize("cache", [at.KVCache(1, 1, 4),
                                   at.SlidingWindowKVCache(1, 1, 4, window=2)])
def test_kv_cache_refuses_values_its_dtype_cannot_hold_and_overflowing_scores(cache):
    huge = torch.full((1, 1, 2, 4), 1e300, dtype=torch.float64)
    with at.debug_checks():
        with pytest.raises(AttnlabError, match=r"^k: values up to 1e\+300 do not fit the "
                                               r"cache's dtype torch.float32"):
            cache.append(huge, torch.ones(1, 1, 2, 4, dtype=torch.float64))
        assert cache.length == 0
        big, one = torch.full((1, 1, 1, 4), 1e20), torch.ones(1, 1, 1, 4)
    cache.append(big, one)  # appended without debug checks: still checked against below
    with at.debug_checks():
        with pytest.raises(AttnlabError, match="q, k: the scaled scores could reach"):
            cache.attend(big, one, one)  # against the huge key appended before
        assert cache.length == 1
        cache.reset()
        assert torch.isfinite(cache.attend(big, one, one)).all()
