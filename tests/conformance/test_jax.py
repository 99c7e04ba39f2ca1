"""Conformance with JAX's ``jax.nn.dot_product_attention`` (its XLA reference path).

JAX is not a dependency: its semantics (jax/_src/nn/functions.py,
``_dot_product_attention_xla`` and ``_apply_masks``) are re-implemented in
float64 NumPy below (``jax_dpa_ref``), and the cases mirror
jax-ml/jax:tests/nn_test.py::NNFunctionsTest::<name>.

Convention map (JAX -> attnlab):

- layout BTNH (or TNH, made 4-D by adding a batch of 1) -> attnlab's
  (..., T, H): transpose to (B, N, T, H). GQA (K key/value heads, N = K·G, query
  head n reads key head n // G) -> q (B, K, G, T, H) broadcast against k, v
  (B, K, 1, S, H); gradients for k, v come back summed over G, as JAX's
  reference sums the repeated heads.
- ``mask`` (bool, True = take part) is attnlab's ``mask``; ``bias`` is ``bias``.
- ``is_causal`` is ``tril(ones(T, S))``, top-left; the same as attnlab's
  bottom-right ``is_causal`` when T == S (every JAX case here).
- ``local_window_size=(left, right)`` allows keys [i - left, i + right]: with
  right = 0 (or under is_causal, which cuts the right side) that is attnlab's
  causal window of W = left + 1 keys; an int w means (w, w), attnlab's symmetric
  window of W = 2w + 1.
- ``key_value_seq_lengths`` masks keys j >= length: part of attnlab's mask.
  ``query_seq_lengths`` masks query rows i >= length and zeroes their output:
  attnlab gets those rows fully masked, and returns 0 for them.
- Masked logits are a large finite negative (-0.7·float32 max) in JAX, -inf in
  attnlab. Rows with some allowed key agree exactly; a row with none is a
  uniform average with a finite log-sum-exp in JAX and 0 with lse -inf in
  attnlab (tested as such). ``return_residual`` (the log-sum-exp, BTN) is
  attnlab's ``flash_attention(return_lse=True)``.

Tolerances: float64 to 1e-12 (outputs) and 1e-10 (gradients); float32 by the
2x rule of the FlashAttention tests (error against the float64 reference at most
twice that of a plain float32 reference, plus 1e-7 of slack), 3x for gradients.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attnlab

from ._reference import (
    assert_close,
    assert_two_x_rule,
    reference_backward,
)

F64_TOL = 1e-12
F64_GRAD_TOL = 1e-10


# ----------------------------------------------------------------- the reference


def _large_negative(dtype):
    """JAX's masked-logit value: -0.7 times the dtype's max, capped at float32's."""
    return -0.7 * min(float(np.finfo(dtype).max), float(np.finfo(np.float32).max))


def _ensure_4d(x):
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


def jax_combined_mask(T, S, B, mask=None, is_causal=False, q_seqlen=None, kv_seqlen=None,
                      local_window_size=None):
    """JAX's _apply_masks as one bool array (B | 1, N | 1, T, S), True = keep."""
    keep = np.ones((1, 1, T, S), dtype=bool)
    if mask is not None:
        keep = keep & _ensure_4d(mask)
    if is_causal:
        keep = keep & np.tril(np.ones((T, S), dtype=bool))
    if local_window_size is not None:
        left, right = local_window_size
        qpos, kpos = np.arange(T)[:, None], np.arange(S)[None, :]
        keep = keep & (qpos <= kpos + left) & (qpos >= kpos - right)
    if q_seqlen is not None or kv_seqlen is not None:
        pad = np.ones((B, 1, T, S), dtype=bool)
        if q_seqlen is not None:
            pad = pad & (np.arange(T)[None, None, :, None] < np.asarray(q_seqlen)[:, None, None,
                                                                                  None])
        if kv_seqlen is not None:
            pad = pad & (np.arange(S)[None, None, None, :] < np.asarray(kv_seqlen)[:, None, None,
                                                                                    None])
        keep = keep & pad
    return keep


def jax_dpa_ref(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                dtype=np.float64):
    """jax.nn.dot_product_attention (implementation="xla"), return_residual=True.

    -> encoded (like query: BTNH or TNH), lse (BTN or TN). Computed in ``dtype``
    throughout (JAX's own softmax runs in float32; this is the float64 golden).
    """
    out_shape = np.shape(query)
    q, k, v = (_ensure_4d(a).astype(dtype) for a in (query, key, value))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    if isinstance(local_window_size, int):
        local_window_size = (local_window_size, local_window_size)
    scale = 1.0 / np.sqrt(H) if scale is None else scale
    kn, vn = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # head n reads n // G
    logits = np.einsum("btnh,bsnh->bnts", q, kn) * dtype(scale)
    if bias is not None:
        logits = logits + _ensure_4d(bias).astype(dtype)
    keep = jax_combined_mask(T, S, B, mask, is_causal, query_seq_lengths,
                             key_value_seq_lengths, local_window_size)
    if not keep.all():
        logits = np.where(keep, logits, dtype(_large_negative(dtype)))
    m = logits.max(-1, keepdims=True)
    p = np.exp(logits - m)
    probs = p / p.sum(-1, keepdims=True)
    lse = (m + np.log(p.sum(-1, keepdims=True)))[..., 0]  # (B, N, T)
    encoded = np.einsum("bnts,bsnh->btnh", probs, vn)
    if query_seq_lengths is not None:
        encoded = encoded * (np.arange(T)[None, :] < np.asarray(query_seq_lengths)[:, None]
                             )[:, :, None, None]
    lse = np.transpose(lse, (0, 2, 1))  # BNT -> BTN
    return encoded.reshape(out_shape), lse.reshape(out_shape[:-1])


# ------------------------------------------------------------------ mapping helpers


def to_attnlab(q, k, v):
    """BTNH, BSKH -> q (B, K, G, T, H), k, v (B, K, 1, S, H)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    q5 = np.transpose(q, (0, 2, 1, 3)).reshape(B, K, N // K, T, H)
    k5 = np.transpose(k, (0, 2, 1, 3))[:, :, None]
    v5 = np.transpose(v, (0, 2, 1, 3))[:, :, None]
    return q5, k5, v5


def from_attnlab(x5):
    """(B, K, G, T, ...) -> BTN..., i.e. (B, T, N, H) for outputs, (B, T, N) for lse."""
    B, K, G, T = x5.shape[:4]
    x = x5.reshape(B, K * G, T, *x5.shape[4:])
    return np.swapaxes(x, 1, 2)


def grouped(x, K):
    """A (B | 1, N | 1, T | 1, S | 1) mask or bias -> (B | 1, K | 1, G | 1, T | 1, S | 1)."""
    x = _ensure_4d(x)
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], K, x.shape[1] // K, *x.shape[2:])


def ref_grads(q, k, v, dout, keep, bias, dtype, reorder=False):
    """Gradients of jax_dpa_ref for rows that keep some key, in attnlab's grouped layout."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    qh = np.transpose(q, (0, 2, 1, 3))
    kh, vh = (np.repeat(np.transpose(a, (0, 2, 1, 3)), G, axis=1) for a in (k, v))
    gh = np.transpose(dout, (0, 2, 1, 3))
    scale = 1.0 / np.sqrt(H)
    if reorder:
        dq, dk, dv, ds = reference_backward(qh, kh * np.asarray(scale, dtype), vh, gh, keep, bias,
                                            scale=1.0, dtype=dtype)
        dk = dk * np.asarray(scale, dtype)
    else:
        dq, dk, dv, ds = reference_backward(qh, kh, vh, gh, keep, bias, dtype=dtype)
    dk = dk.reshape(B, K, G, -1, H).sum(2)[:, :, None]
    dv = dv.reshape(B, K, G, -1, H).sum(2)[:, :, None]
    return dq.reshape(B, K, G, T, H), dk, dv, ds


def make_inputs(seed, B, T, S, N, K, H, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, N, H)).astype(dtype)
    k = rng.standard_normal((B, S, K, H)).astype(dtype)
    v = rng.standard_normal((B, S, K, H)).astype(dtype)
    grad = rng.standard_normal((B, T, N, H)).astype(dtype)
    return q, k, v, grad


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttention
# group_num 1, 2, 4 (N = 4 query heads over N // G key/value heads), use_vmap (here:
# attnlab called once per batch item and stacked, against one call on the batch), with
# the log-sum-exp residual and dQ, dK, dV (dK, dV summed over each group, as JAX sums its
# repeated reference heads). B, S, T, N, H = 2, 16, 16, 4, 8 (JAX: 2, 128, 128, 4, 32).

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("use_vmap", [False, True])
@pytest.mark.parametrize("group_num", [1, 2, 4])
def test_dot_product_attention(group_num, use_vmap, dtype):
    B, S, T, N, H = 2, 16, 16, 4, 8
    K = N // group_num
    q, k, v, grad = make_inputs(group_num * 10 + use_vmap, B, T, S, N, K, H, dtype)

    def attnlab_run(q, k, v, grad):
        q5, k5, v5 = to_attnlab(q, k, v)
        g5 = to_attnlab(grad, k, v)[0]
        items = range(B) if use_vmap else [slice(None)]
        res = []
        for i in items:
            out, lse = attnlab.flash_attention(q5[i], k5[i], v5[i], return_lse=True,
                                               block_q=8, block_k=8)
            plain = attnlab.scaled_dot_product_attention(q5[i], k5[i], v5[i])
            dq, dk, dv, _ = attnlab.sdpa_backward(q5[i], k5[i], v5[i], g5[i])
            fdq, fdk, fdv = attnlab.flash_attention_backward(q5[i], k5[i], v5[i], out, lse,
                                                             g5[i], block_q=8, block_k=8)
            res.append((plain, out, lse, dq, dk, dv, fdq, fdk, fdv))
        if use_vmap:
            res = [np.stack(parts) for parts in zip(*res, strict=True)]
        else:
            res = list(res[0])
        return res

    got = attnlab_run(q, k, v, grad)
    q64, k64, v64, g64 = (a.astype(np.float64) for a in (q, k, v, grad))
    out_ref, lse_ref = jax_dpa_ref(q64, k64, v64)
    dq_ref, dk_ref, dv_ref, _ = ref_grads(q64, k64, v64, g64, None, None, np.float64)
    plain, flash, lse, dq, dk, dv, fdq, fdk, fdv = got
    if dtype == np.float64:
        assert_close(from_attnlab(plain), out_ref, atol=F64_TOL, what="plain out")
        assert_close(from_attnlab(flash), out_ref, atol=F64_TOL, what="flash out")
        assert_close(from_attnlab(lse), lse_ref, atol=F64_TOL, what="lse (residual)")
        for name, a, b, w in (("dQ", dq, fdq, dq_ref), ("dK", dk, fdk, dk_ref),
                              ("dV", dv, fdv, dv_ref)):
            assert_close(a, w, atol=F64_GRAD_TOL, what=f"plain {name}")
            assert_close(b, w, atol=F64_GRAD_TOL, what=f"flash {name}")
        return
    base_out, base_lse = jax_dpa_ref(q, k * np.float32(1 / np.sqrt(H)), v, scale=1.0,
                                     dtype=np.float32)
    assert_two_x_rule(from_attnlab(plain), base_out, out_ref, slack=1e-7, what="plain out")
    assert_two_x_rule(from_attnlab(flash), base_out, out_ref, slack=1e-7, what="flash out")
    assert_two_x_rule(from_attnlab(lse), base_lse, lse_ref, slack=1e-7, what="lse")
    base = ref_grads(q, k, v, grad, None, None, np.float32, reorder=True)
    for name, a, b, w, bl in (("dQ", dq, fdq, dq_ref, base[0]), ("dK", dk, fdk, dk_ref, base[1]),
                              ("dV", dv, fdv, dv_ref, base[2])):
        assert_two_x_rule(a, bl, w, factor=3.0, slack=1e-7, what=f"plain {name}")
        assert_two_x_rule(b, bl, w, factor=3.0, slack=1e-7, what=f"flash {name}")


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttentionMask
# mask_mode in bias, causal, padding, custom, (causal, padding), (custom, padding),
# (bias, causal), (causal, sliding_window); forward and dQ, dK, dV, dbias. padding:
# query_seq_lengths [T//2, T//4], key_value_seq_lengths [S//4, S//2]; custom: tril(T, S);
# sliding_window: (3, 2) under causal (keys i-3 .. i: attnlab's causal window of 4).
# attnlab gets one bool mask (built with attnlab's own helpers where they exist) and the
# bias; flash has no dbias (it treats bias as a constant).

MASK_MODES = ["bias", "causal", "padding", "custom", ("causal", "padding"),
              ("custom", "padding"), ("bias", "causal"), ("causal", "sliding_window")]


@pytest.mark.parametrize("impl", ["plain", "flash"])
@pytest.mark.parametrize("mask_mode", MASK_MODES,
                         ids=lambda m: m if isinstance(m, str) else "+".join(m))
def test_dot_product_attention_mask(mask_mode, impl):
    modes = (mask_mode,) if isinstance(mask_mode, str) else mask_mode
    B, S, T, N, H = 2, 16, 16, 4, 8
    q, k, v, grad = make_inputs(len(modes) * 7 + len(modes[0]), B, T, S, N, N, H)
    rng = np.random.default_rng(4)
    bias = mask = q_seqlen = kv_seqlen = window = None
    is_causal = "causal" in modes
    if "padding" in modes:
        q_seqlen = np.array([T // 2, T // 4], dtype=np.int32)
        kv_seqlen = np.array([S // 4, S // 2], dtype=np.int32)
    if "custom" in modes:
        mask = np.tril(np.ones((T, S), dtype=bool))[None, None]
    if "bias" in modes:
        bias = rng.standard_normal((1, N, T, S))
    if "sliding_window" in modes:
        window = (3, 2) if is_causal else (3, 0)
    out_ref, _ = jax_dpa_ref(q, k, v, bias, mask, is_causal=is_causal, query_seq_lengths=q_seqlen,
                             key_value_seq_lengths=kv_seqlen, local_window_size=window)

    # attnlab's side of the mapping, from attnlab's helpers
    allowed = np.ones((1, 1, T, S), dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if "padding" in modes:
        rows = np.arange(T)[None, :, None] < q_seqlen[:, None, None]  # (B, T, 1)
        allowed = allowed & (rows & attnlab.padding_mask(np.arange(S)[None, :]
                                                         < kv_seqlen[:, None])[:, 0])[:, None]
    if window is not None:
        allowed = allowed & attnlab.sliding_window_mask(T, 4, is_causal=True)
    q5, k5, v5 = to_attnlab(q, k, v)
    g5 = to_attnlab(grad, k, v)[0]
    m5 = grouped(allowed, N)
    b5 = None if bias is None else grouped(bias, N)
    if impl == "plain":
        out = attnlab.scaled_dot_product_attention(q5, k5, v5, m5, bias=b5, is_causal=is_causal)
        dq, dk, dv, dbias = attnlab.sdpa_backward(q5, k5, v5, g5, m5, bias=b5,
                                                  is_causal=is_causal)
    else:
        out, lse = attnlab.flash_attention(q5, k5, v5, m5, bias=b5, is_causal=is_causal,
                                           return_lse=True, block_q=4, block_k=4)
        dq, dk, dv = attnlab.flash_attention_backward(q5, k5, v5, out, lse, g5, m5, bias=b5,
                                                      is_causal=is_causal, block_q=4, block_k=4)
        dbias = None
    assert_close(from_attnlab(out), out_ref, atol=F64_TOL, what="out")

    keep = jax_combined_mask(T, S, B, mask, is_causal, q_seqlen, kv_seqlen, window)
    q_len = np.full(B, T) if q_seqlen is None else q_seqlen
    # JAX zeroes the padded rows' output: no cotangent reaches them
    g_eff = grad * (np.arange(T)[None, :] < q_len[:, None])[:, :, None, None]
    want = ref_grads(q, k, v, g_eff, keep, bias, np.float64)
    for name, got, w in (("dQ", dq, want[0]), ("dK", dk, want[1]), ("dV", dv, want[2])):
        assert_close(got, w, atol=F64_GRAD_TOL, what=name)
    if dbias is not None:
        assert_close(dbias[:, :, 0], want[3].sum(0, keepdims=True), atol=F64_GRAD_TOL,
                     what="dbias")  # bias (1, N, T, S): summed over the batch


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttentionFloat64MaskDebugInfs
# float64, T, S, K, N, H = 5, 7, 3, 6, 11, a rank-1 mask arange(S) <= S // 2, q = k = 0;
# JAX checks that no inf is produced (debug_infs). Here: no floating-point warning or
# error at all (np.errstate(all="raise") and warnings as errors), and, with v random
# instead of 0 so the value means something, every query averages the values of keys
# 0 .. 3 of its key head exactly (computed by hand). Unbatched TNH as in JAX, and batched.

@pytest.mark.parametrize("impl", ["plain", "flash", "torch"])
@pytest.mark.parametrize("batched", [False, True])
def test_float64_rank1_mask_no_infs(batched, impl):
    T, S, K, N, H = 5, 7, 3, 6, 11
    G = N // K
    rng = np.random.default_rng(37422)
    v = rng.standard_normal((S, K, H))
    mask = np.arange(S) <= S // 2
    q5 = np.zeros((K, G, T, H))
    k5 = np.zeros((K, 1, S, H))
    v5 = np.transpose(v, (1, 0, 2))[:, None]
    if batched:
        q5, k5, v5 = q5[None], k5[None], v5[None]
    expected = np.broadcast_to(v[: S // 2 + 1].mean(0)[:, None, None, :], (K, G, T, H))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        if impl == "plain":
            out = attnlab.scaled_dot_product_attention(q5, k5, v5, mask)
        elif impl == "flash":
            out = attnlab.flash_attention(q5, k5, v5, mask, block_q=2, block_k=2)
        else:
            import torch

            import attnlab.torch as at

            out = at.scaled_dot_product_attention(
                *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q5, k5, v5)),
                torch.from_numpy(mask)).numpy()
    assert out.dtype == np.float64
    out = out[0] if batched else out
    assert_close(out, expected, atol=F64_TOL, what=impl)
    ref, _ = jax_dpa_ref(np.zeros((T, N, H)), np.zeros((S, K, H)), v, mask=mask)
    assert_close(out, to_attnlab(ref[None], np.zeros((1, S, K, H)), np.zeros((1, S, K, H)))[0][0],
                 atol=F64_TOL, what="vs reference")


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttentionBiasGradient
# query = key = value = x (B, S, N, H), a bias (B, N, S, S), mask ones (1, 1, S), the
# cotangent x itself; batch_size 1 and 4 (JAX: 16), use_vmap (attnlab per batch item).
# dbias, and the gradient with respect to x (dq + dk + dv, x being all three).

@pytest.mark.parametrize("use_vmap", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_dot_product_attention_bias_gradient(batch_size, use_vmap):
    B, S, N, H = batch_size, 16, 4, 8
    rng = np.random.default_rng(batch_size * 2 + use_vmap)
    x = rng.standard_normal((B, S, N, H))
    bias = rng.standard_normal((B, N, S, S))
    mask = np.ones((1, 1, S), dtype=bool)
    out_ref, _ = jax_dpa_ref(x, x, x, bias, mask)
    dq_r, dk_r, dv_r, ds_r = ref_grads(x, x, x, x, None, bias, np.float64)
    xh = np.transpose(x, (0, 2, 1, 3))  # (B, N, S, H)
    items = [slice(i, i + 1) for i in range(B)] if use_vmap else [slice(None)]
    outs, grads = [], []
    for i in items:
        outs.append(attnlab.scaled_dot_product_attention(xh[i], xh[i], xh[i], mask[None],
                                                         bias=bias[i]))
        grads.append(attnlab.sdpa_backward(xh[i], xh[i], xh[i], xh[i], mask[None],
                                           bias=bias[i]))
    out = np.concatenate(outs)
    dq, dk, dv, dbias = (np.concatenate(parts) for parts in zip(*grads, strict=True))
    assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what="out")
    assert_close(dbias, ds_r, atol=F64_GRAD_TOL, what="dbias")
    dx_ref = dq_r[:, :, 0] + dk_r[:, :, 0] + dv_r[:, :, 0]
    assert_close(dq + dk + dv, dx_ref, atol=F64_GRAD_TOL, what="dx")


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttention (return_residual:
# the log-sum-exp, BTN) under the masks of testDotProductAttentionMask, including rows left
# with no key: JAX's residual there is the finite large_negative + log S (its logits are
# all -0.7·float32 max), attnlab's lse is -inf and its output 0; every other row agrees.

@pytest.mark.parametrize("mask_mode", ["none", "causal", "padding", "custom_empty_rows"])
def test_dot_product_attention_residual(mask_mode):
    B, S, T, N, H = 2, 12, 12, 4, 8
    q, k, v, _ = make_inputs(len(mask_mode), B, T, S, N, 2, H)
    mask = q_seqlen = kv_seqlen = None
    if mask_mode == "padding":
        q_seqlen, kv_seqlen = np.array([5, 12], np.int32), np.array([3, 9], np.int32)
    if mask_mode == "custom_empty_rows":
        mask = np.random.default_rng(1).random((B, 1, T, S)) < 0.5
        mask[:, :, [0, 7]] = False
    is_causal = mask_mode == "causal"
    out_ref, lse_ref = jax_dpa_ref(q, k, v, None, mask, is_causal=is_causal,
                                   query_seq_lengths=q_seqlen, key_value_seq_lengths=kv_seqlen)
    keep = jax_combined_mask(T, S, B, mask, is_causal, q_seqlen, kv_seqlen)  # (B | 1, 1, T, S)
    live = np.broadcast_to(keep.any(-1), (B, 1, T))[:, 0]  # (B, T)
    q5, k5, v5 = to_attnlab(q, k, v)
    out, lse = attnlab.flash_attention(q5, k5, v5, grouped(keep, N), is_causal=is_causal,
                                       return_lse=True, block_q=4, block_k=4)
    out, lse = from_attnlab(out), from_attnlab(lse)  # (B, T, N, H), (B, T, N)
    assert_close(lse[live], lse_ref[live], atol=F64_TOL, what="residual, live rows")
    assert np.all(np.isneginf(lse[~live]))
    assert_close(lse_ref[~live], np.full(lse_ref[~live].shape,
                                         _large_negative(np.float64) + np.log(S)),
                 atol=0, rtol=1e-15, what="JAX's residual of empty rows")
    expected = np.where(live[:, :, None, None], out_ref, 0.0)  # JAX: uniform average there,
    assert_close(out, expected, atol=F64_TOL, what="out")  # unless query padding zeroed it


# --------------------------------------------------------------------------------------
# jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttentionMask (its
# sliding_window mode) and dot_product_attention's local_window_size docstring example
# ((3, 2): token c attends to c-3 .. c+2). The windows attnlab can express: an int w
# (symmetric, W = 2w + 1 with causal=False), (left, 0) (W = left + 1, causal=True), and any
# (left, right) under is_causal (the right side is cut: W = left + 1).

WINDOW_CASES = [(0, False), (1, False), (3, False), ((2, 0), False), ((5, 0), False),
                ((3, 2), True), ((0, 4), True)]


@pytest.mark.parametrize("impl", ["sliding_window_attention", "mask"])
@pytest.mark.parametrize("window,is_causal", WINDOW_CASES, ids=str)
def test_local_window_size(window, is_causal, impl):
    B, T, N, H = 2, 12, 2, 8
    seed = 10 * (window if isinstance(window, int) else sum(window)) + is_causal
    q, k, v, _ = make_inputs(seed, B, T, T, N, N, H)
    out_ref, _ = jax_dpa_ref(q, k, v, is_causal=is_causal, local_window_size=window)
    left, right = (window, window) if isinstance(window, int) else window
    if is_causal or right == 0:
        W, causal = left + 1, True
    else:
        W, causal = 2 * left + 1, False
    qh, kh, vh = (np.transpose(a, (0, 2, 1, 3)) for a in (q, k, v))
    if impl == "sliding_window_attention":
        out = attnlab.sliding_window_attention(qh, kh, vh, W, is_causal=causal)
    else:
        out = attnlab.scaled_dot_product_attention(
            qh, kh, vh, attnlab.sliding_window_mask(T, W, is_causal=causal))
    assert_close(np.swapaxes(out, 1, 2), out_ref, atol=F64_TOL, what=impl)


def test_reference_masks_like_jax():
    """jax-ml/jax:tests/nn_test.py::NNFunctionsTest::testDotProductAttentionMask's building
    blocks, as JAX's functions.py writes them: the window of (3, 2) around token 6 of 10 is
    keys 3 .. 8 (the docstring's example), causal is top-left, and padding masks queries and
    keys by length. Pins the reference the other tests compare attnlab with."""
    keep = jax_combined_mask(10, 10, 1, local_window_size=(3, 2))[0, 0]
    assert np.flatnonzero(keep[6]).tolist() == [3, 4, 5, 6, 7, 8]
    causal = jax_combined_mask(3, 5, 1, is_causal=True)[0, 0]
    assert causal.astype(int).tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    pad = jax_combined_mask(3, 4, 2, q_seqlen=np.array([1, 3]), kv_seqlen=np.array([2, 4]))
    assert pad[0, 0].astype(int).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert pad[1, 0].all()
