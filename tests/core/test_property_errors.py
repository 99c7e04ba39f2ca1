"""Every public attention function, on any input: a clear AttnlabError or the right numbers.

The inputs (hypothesis strategies), the plain float64 reference they are checked
against and the tolerance, with its derivation, are in ``support/properties.py``,
shared with the torch twin's tests (tests/torch/test_property_errors_torch.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.properties import (
    EXAMPLES,
    allowed_keys,
    attention_inputs,
    broadcastable_shape,
    cache_inputs,
    check,
    check_cache_calls,
    effective_scale,
    reference,
)

import attnlab
from attnlab.errors import AttnlabError

# ---------------------------------------------------------------- the properties


@EXAMPLES
@given(attention_inputs())
def test_scaled_dot_product_attention(inputs):
    q, k, v, mask, bias, scale, is_causal, dtype = inputs
    try:
        out = attnlab.scaled_dot_product_attention(q, k, v, mask, bias=bias, scale=scale,
                                                   is_causal=is_causal)
    except AttnlabError:
        return
    allowed = allowed_keys(mask, is_causal, q.shape[-2], k.shape[-2])
    check(out, q, k, v, allowed, bias, effective_scale(scale, q.shape[-1]), dtype)


@EXAMPLES
@given(attention_inputs(), st.sampled_from([1, 2, 64]), st.sampled_from([1, 3, 64]))
def test_flash_attention(inputs, block_q, block_k):
    q, k, v, mask, bias, scale, is_causal, dtype = inputs
    try:
        out = attnlab.flash_attention(q, k, v, mask, bias=bias, scale=scale,
                                      is_causal=is_causal, block_q=block_q, block_k=block_k)
    except AttnlabError:
        return
    allowed = allowed_keys(mask, is_causal, q.shape[-2], k.shape[-2])
    check(out, q, k, v, allowed, bias, effective_scale(scale, q.shape[-1]), dtype)


@st.composite
def window_inputs(draw):
    q, k, v, _, _, scale, causal, dtype = draw(attention_inputs())
    window = draw(st.integers(1, 7))
    if not causal and window % 2 == 0:
        window += draw(st.sampled_from([-1, 1]))  # a centred window needs odd W
    key_padding = None
    if draw(st.booleans()):
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        key_padding = rng.random((*broadcastable_shape(draw, batch), k.shape[-2])) < 0.7
    return q, k, v, window, causal, key_padding, scale, dtype


@EXAMPLES
@given(window_inputs())
def test_sliding_window_attention(inputs):
    q, k, v, window, causal, key_padding, scale, dtype = inputs
    try:
        out = attnlab.sliding_window_attention(q, k, v, window, is_causal=causal,
                                               key_padding=key_padding, scale=scale)
    except AttnlabError:
        return
    T, S = q.shape[-2], k.shape[-2]
    query_pos = np.arange(T)[:, None] + (S - T)  # (T, 1)
    key_pos = np.arange(S)[None, :]  # (1, S)
    if causal:  # the W most recent keys, itself included
        allowed = (key_pos <= query_pos) & (key_pos > query_pos - window)
    else:  # W keys centred on the query
        allowed = np.abs(key_pos - query_pos) <= (window - 1) // 2
    if key_padding is not None:
        allowed = allowed & key_padding[..., None, :]  # (..., T, S)
    check(out, q, k, v, allowed, None, effective_scale(scale, q.shape[-1]), dtype)


@EXAMPLES
@given(cache_inputs(), st.sampled_from([None, 1, 2, 5]))
def test_kv_cache_append_and_attend(inputs, window):
    """KVCache (window None) or SlidingWindowKVCache: each call equals plain attention
    over every key appended so far, causal (and within the last W positions)."""
    chunks, (B, Hkv, D, Dv), scale, dtype = inputs
    if window is None:
        cache = attnlab.KVCache(B, Hkv, D, Dv, capacity=1, dtype=dtype)
    else:
        cache = attnlab.SlidingWindowKVCache(B, Hkv, D, Dv, window=window, dtype=dtype)
    check_cache_calls(cache, chunks, Hkv, D, Dv, scale, dtype, window,
                      convert=lambda a: a, back=np.asarray)


def test_the_reference_is_plain_attention():
    """The reference itself, on numbers worked out by hand."""
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[1.0], [3.0]])
    w = np.exp(1.0) / (np.exp(1.0) + 1.0)  # softmax([1, 0])[0]
    assert reference(q, k, v, None, None, 1.0)[0, 0] == pytest.approx(w + 3 * (1 - w))
    assert reference(q, k, v, np.array([False, False]), None, 1.0)[0, 0] == 0.0
    assert reference(q, k, v, None, np.array([-np.inf, 0.0]), 1.0)[0, 0] == 3.0
    assert reference(q, k[:0], v[:0], None, None, 1.0).shape == (1, 1)
