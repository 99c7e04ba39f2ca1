"""Attention sinks (``sinks=``, one logit per head) on the NumPy paths: the plain sdpa, its
backward and flash (forward and backward), against references written out here:

- the concatenation rule of Hugging Face's GPT-OSS eager attention: softmax over
  [scores, sink_h], the sink's column dropped;
- FlashAttention's ``learnable_sink`` rule: the output without sinks rescaled by
  exp(lse - logaddexp(lse, sink_h));
- central finite differences for every gradient, the sinks' included.

Tolerances: float64 throughout; 1e-12 for two exact computations of the same formula in
a different order, 1e-6 for central differences with step 1e-6 (truncation ~1e-12 ·
third derivative, rounding ~1e-16 / 1e-6 = 1e-10 per entry, summed over the loss).
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.backward import SinkAttentionGrads, sdpa_backward
from attnlab.errors import AttnlabError
from attnlab.fast.flash import flash_attention, flash_attention_backward

B, H, T, S, D, DV = 2, 3, 5, 7, 4, 3


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, T, D))
    k = rng.standard_normal((B, H, S, D))
    v = rng.standard_normal((B, H, S, DV))
    sinks = rng.standard_normal(H) * 2.0
    mask = rng.random((B, 1, T, S)) > 0.3
    mask[0, 0, 1, :] = False  # a row with no key: it attends to its sink alone
    return q, k, v, sinks, mask


def _eager_with_sinks(q, k, v, sinks, allowed):  # GPT-OSS eager, written out
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (B, H, T, S)
    scores = np.where(allowed, scores, -np.inf)
    column = np.broadcast_to(sinks[:, None, None], (*scores.shape[:-1], 1))
    joined = np.concatenate([scores, column], axis=-1)  # (B, H, T, S + 1)
    joined = joined - joined.max(axis=-1, keepdims=True)
    probs = np.exp(joined) / np.exp(joined).sum(axis=-1, keepdims=True)
    weights = probs[..., :-1]
    lse = np.log(np.exp(np.concatenate([np.where(allowed, q @ np.swapaxes(k, -1, -2)
                                                 / np.sqrt(q.shape[-1]), -np.inf),
                                        column], axis=-1)).sum(axis=-1))
    return weights @ v, weights, lse


def test_plain_sdpa_with_sinks_is_gpt_oss_eager():
    q, k, v, sinks, mask = _inputs()
    out, weights, lse = attnlab.scaled_dot_product_attention(
        q, k, v, mask, sinks=sinks, return_weights=True, return_lse=True)
    ref_out, ref_weights, ref_lse = _eager_with_sinks(q, k, v, sinks, mask)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    assert np.all(out[0, :, 1] == 0.0)  # no key: all weight on the sink, which has no value
    assert np.all(weights.sum(-1) < 1.0)


def test_flash_with_sinks_is_the_learnable_sink_formula():
    q, k, v, sinks, mask = _inputs(1)
    out_plain, lse_plain = attnlab.scaled_dot_product_attention(q, k, v, mask, is_causal=True,
                                                                return_lse=True)
    joined = np.logaddexp(lse_plain, sinks[:, None])  # FlashAttention's learnable_sink rule
    expected = out_plain * np.exp(lse_plain - joined)[..., None]
    out, lse = flash_attention(q, k, v, mask, is_causal=True, sinks=sinks, return_lse=True,
                               block_q=2, block_k=3)
    np.testing.assert_allclose(out, expected, atol=1e-12)
    np.testing.assert_allclose(lse, joined, atol=1e-12)


def _loss(q, k, v, sinks, mask, dout):
    return float((attnlab.scaled_dot_product_attention(q, k, v, mask, sinks=sinks,
                                                       is_causal=True) * dout).sum())


def test_gradients_with_sinks_match_finite_differences_plain_and_flash():
    q, k, v, sinks, mask = _inputs(2)
    dout = np.random.default_rng(3).standard_normal((B, H, T, DV))
    grads = sdpa_backward(q, k, v, dout, mask, is_causal=True, sinks=sinks)
    assert isinstance(grads, SinkAttentionGrads)
    step = 1e-6
    for name, arr, grad in (("q", q, grads.dq), ("k", k, grads.dk), ("v", v, grads.dv),
                            ("sinks", sinks, grads.dsinks)):
        numeric = np.zeros_like(arr)
        for index in np.ndindex(*arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[index] += step
            minus[index] -= step
            args = {"q": q, "k": k, "v": v, "sinks": sinks}
            hi = _loss(**{**args, name: plus}, mask=mask, dout=dout)
            lo = _loss(**{**args, name: minus}, mask=mask, dout=dout)
            numeric[index] = (hi - lo) / (2 * step)
        np.testing.assert_allclose(grad, numeric, atol=1e-6, err_msg=name)
    out, lse = flash_attention(q, k, v, mask, is_causal=True, sinks=sinks, return_lse=True,
                               block_q=2, block_k=3)
    flash_grads = flash_attention_backward(q, k, v, out, lse, dout, mask, is_causal=True,
                                           sinks=sinks, block_q=2, block_k=3)
    for got, want in zip(flash_grads, (grads.dq, grads.dk, grads.dv, grads.dsinks), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_sinks_of_the_wrong_shape_are_refused_by_name():
    q, k, v, sinks, _ = _inputs()
    with pytest.raises(AttnlabError, match=r"sinks: expected one logit per head"):
        attnlab.scaled_dot_product_attention(q, k, v, sinks=np.zeros(H + 1))
    with pytest.raises(AttnlabError, match=r"sinks"):
        flash_attention(q, k, v, sinks=np.zeros((H, 1)))
    with pytest.raises(AttnlabError, match=r"sinks"):
        attnlab.scaled_dot_product_attention(q, k, v, sinks=np.array([0.0, np.nan, 0.0]))
