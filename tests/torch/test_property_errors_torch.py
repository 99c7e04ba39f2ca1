"""attnlab.torch on any input: a clear AttnlabError or the right numbers.

The torch twin's half of tests/core/test_property_errors.py: the same inputs, the
same plain float64 reference and the same tolerance (``support/properties.py``).
The NumPy core reads every value; attnlab.torch does under ``debug_checks()``, so
the property (an error or the right numbers) is checked there, and the default
path, which reads no values, must give the same numbers wherever debug accepts.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.support.properties import (
    EXAMPLES,
    allowed_keys,
    attention_inputs,
    cache_inputs,
    check,
    check_cache_calls,
    effective_scale,
)

import attnlab.torch as at
from attnlab.errors import AttnlabError


def as_tensor(a):
    return None if a is None else torch.from_numpy(np.array(a))


@EXAMPLES
@given(attention_inputs(), st.booleans())
def test_torch_scaled_dot_product_attention(inputs, return_weights):
    q, k, v, mask, bias, scale, is_causal, dtype = inputs

    def call():
        got = at.scaled_dot_product_attention(
            as_tensor(q), as_tensor(k), as_tensor(v), as_tensor(mask), bias=as_tensor(bias),
            scale=scale, is_causal=is_causal, return_weights=return_weights)
        return (got[0] if return_weights else got).numpy()

    try:
        with at.debug_checks():
            out = call()
    except AttnlabError:
        return
    allowed = allowed_keys(mask, is_causal, q.shape[-2], k.shape[-2])
    check(out, q, k, v, allowed, bias, effective_scale(scale, q.shape[-1]), dtype)
    np.testing.assert_array_equal(call(), out)  # the same computation, unchecked


@EXAMPLES
@given(cache_inputs(), st.sampled_from([None, 1, 2, 5]))
def test_kv_cache_append_and_attend(inputs, window):
    """KVCache (window None) or SlidingWindowKVCache: each call equals plain attention
    over every key appended so far, causal (and within the last W positions)."""
    chunks, (B, Hkv, D, Dv), scale, dtype = inputs
    cache_dtype = torch.float32 if dtype == np.float32 else torch.float64
    if window is None:
        cache = at.KVCache(B, Hkv, D, Dv, capacity=1, dtype=cache_dtype)
    else:
        cache = at.SlidingWindowKVCache(B, Hkv, D, Dv, window=window, dtype=cache_dtype)
    with at.debug_checks():
        check_cache_calls(cache, chunks, Hkv, D, Dv, scale, dtype, window,
                          convert=torch.from_numpy, back=lambda t: t.numpy())
