"""Every public attention function, on any input: a clear AttnlabError or the right numbers.

Hypothesis draws shapes with 0 and 1 sizes and broadcast batch dims, masks
(None, full, (S,), 0-d), biases holding -1e9, finfo.min and -inf, scales,
float32/float64 and huge values. For each input the function under test must
either raise :class:`AttnlabError` or return a finite array of the right shape
and dtype equal to :func:`reference`: plain float64 attention written out here,
sharing no code with attnlab.

Tolerance (:func:`tolerance`, per output row). Computing in a dtype with
machine epsilon ``eps`` moves each scaled score ``s_j = scale·q·k_j + b_j`` by
at most ``δ = (D + 4)·eps·(|scale|·Σ_d |q_d·k_jd| + |b_j|)`` (the dot product's
rounding bound, plus a few roundings for the scale, bias and shift). Softmax
then changes each weight by a factor within ``e^{±2δ}``, so the output moves by
at most ``max|v|·expm1(2δ)``; summing S weighted values adds ``(S + 4)·eps·max|v|``.
The test allows 4 times that sum (tiling and the fused kernels round in other
orders), plus 1e-300 so that exact zeros compare. A row whose scores are
all shifted by a huge finite bias (-1e9 in float32, whose spacing there is 64)
can lose every digit of its scores: the bound then allows anything between the
values, and the test still checks finiteness and shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError

torch.set_num_threads(1)

# The same 150 examples every run (derandomize): a failure is reproducible, never a
# flake. Raise max_examples locally to search further.
EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

# Magnitudes of q, k, v: zero, tiny, ordinary, large, and far past what a
# score can hold in float32 (1e30²) or float64 (1e200²) without overflowing.
MAGNITUDES = [0.0, 1e-3, 1.0, 30.0, 1e4, 1e30, 1e200]


# ---------------------------------------------------------------- the reference


def reference(q, k, v, allowed, bias, scale):
    """Plain attention in float64: -> (..., T, Dv). A row with no allowed key, or whose
    every score is -inf, gives 0 (attnlab's rule)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    with np.errstate(over="ignore", invalid="ignore"):
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale  # (..., T, S)
        if bias is not None:
            scores = scores + np.asarray(bias, dtype=np.float64)
        if allowed is not None:
            scores = np.where(allowed, scores, -np.inf)
        if scores.shape[-1] == 0:
            weights = scores
        else:
            top = np.max(scores, axis=-1, keepdims=True)
            top = np.where(np.isneginf(top), 0.0, top)
            exps = np.exp(scores - top)
            total = np.sum(exps, axis=-1, keepdims=True)
            weights = exps / np.where(total == 0.0, 1.0, total)
        return np.matmul(weights, v)


def tolerance(q, k, v, allowed, bias, scale, dtype):
    """The per-row bound of the module docstring, broadcast to the output's shape."""
    eps = float(np.finfo(dtype).eps)
    q, k, v = (np.abs(np.asarray(a, dtype=np.float64)) for a in (q, k, v))
    D, S = q.shape[-1], k.shape[-2]
    with np.errstate(over="ignore", invalid="ignore"):
        spread = np.matmul(q, np.swapaxes(k, -1, -2)) * abs(scale)  # (..., T, S)
        if bias is not None:
            b = np.abs(np.asarray(bias, dtype=np.float64))
            spread = spread + np.where(np.isinf(b), 0.0, b)
        if allowed is not None:
            spread = np.where(allowed, spread, 0.0)
        delta = (D + 4) * eps * (np.max(spread, axis=-1, keepdims=True) if S else 0.0)
        moved = np.minimum(np.expm1(2 * np.minimum(delta, 10.0)), 2.0)  # (..., T, 1)
    v_max = float(np.max(v)) if v.size else 0.0
    return 4 * v_max * (moved + (S + 4) * eps) + 1e-300


def check(result, q, k, v, allowed, bias, scale, dtype):
    """``result`` is finite, of the right dtype and shape, and within tolerance."""
    expected = reference(q, k, v, allowed, bias, scale)
    result = np.asarray(result)
    assert result.dtype == dtype, (result.dtype, dtype)
    assert result.shape == expected.shape, (result.shape, expected.shape)
    assert np.isfinite(result).all(), result
    assert np.isfinite(expected).all(), expected  # attnlab accepted: so must the math
    error = np.abs(result.astype(np.float64) - expected)
    bound = np.broadcast_to(tolerance(q, k, v, allowed, bias, scale, dtype), error.shape)
    worst = np.unravel_index(np.argmax(error - bound), error.shape) if error.size else None
    assert (error <= bound).all(), (worst, error[worst], bound[worst])


# ---------------------------------------------------------------- the inputs


@st.composite
def arrays(draw, shape, dtype, rng, *, magnitudes=MAGNITUDES):
    magnitude = draw(st.sampled_from(magnitudes))
    if dtype == np.float32:
        magnitude = min(magnitude, 1e30)
    return (rng.standard_normal(shape) * magnitude).astype(dtype)


def _broadcast_to(draw, target):
    """A shape that broadcasts to ``target``: some leading dims dropped, others set to 1."""
    kept = target[draw(st.integers(0, len(target))):]
    return tuple(n if draw(st.booleans()) else 1 for n in kept)


@st.composite
def attention_inputs(draw):
    """q, k, v, mask, bias, scale, is_causal and the computation dtype."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    T, S = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    D, Dv = draw(st.integers(0, 4)), draw(st.integers(0, 3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q_batch, k_batch = _broadcast_to(draw, batch), _broadcast_to(draw, batch)
    v_batch = _broadcast_to(draw, batch)
    q = draw(arrays((*q_batch, T, D), dtype, rng))
    k = draw(arrays((*k_batch, S, D), dtype, rng))
    v = draw(arrays((*v_batch, S, Dv), dtype, rng, magnitudes=[0.0, 1.0, 1e4, 1e30]))
    full = (*np.broadcast_shapes(q_batch, k_batch, v_batch), T, S)

    mask = None
    kind = draw(st.sampled_from(["none", "full", "keys", "scalar"]))
    if kind == "full":
        mask = rng.random(_broadcast_to(draw, full)) < draw(st.floats(0.0, 1.0))
    elif kind == "keys":  # (S,): the same keys for every query
        mask = rng.random(S) < draw(st.floats(0.0, 1.0))
    elif kind == "scalar":
        mask = np.bool_(draw(st.booleans()))

    bias = None
    if draw(st.booleans()):
        shape = (S,) if draw(st.booleans()) else _broadcast_to(draw, full)
        fills = [0.0, -1e9, float(np.finfo(dtype).min), -np.inf]
        bias = rng.standard_normal(shape) * draw(st.sampled_from([0.0, 1.0, 100.0]))
        for fill in draw(st.lists(st.sampled_from(fills), max_size=2)):
            bias = np.where(rng.random(shape) < 0.5, fill, bias)
        bias = np.asarray(bias, dtype=dtype)

    scale = draw(st.sampled_from([None, 0.0, 1e-3, 0.5, 1.0, 7.0, -1.0]))
    is_causal = draw(st.booleans())
    return q, k, v, mask, bias, scale, is_causal, dtype


def allowed_keys(mask, is_causal, T, S):
    """The mask and the bottom-right causal rule, written out: (..., T, S) or None."""
    allowed = None if mask is None else np.asarray(mask)
    if is_causal:
        causal = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)  # (T, S)
        allowed = causal if allowed is None else (allowed & causal)
    return allowed


def effective_scale(scale, D):
    return 1.0 / np.sqrt(D) if scale is None and D > 0 else (1.0 if scale is None else scale)


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


def as_tensor(a):
    return None if a is None else torch.from_numpy(np.array(a))


@EXAMPLES
@given(attention_inputs(), st.booleans())
def test_torch_scaled_dot_product_attention(inputs, return_weights):
    q, k, v, mask, bias, scale, is_causal, dtype = inputs
    try:
        got = at.scaled_dot_product_attention(
            as_tensor(q), as_tensor(k), as_tensor(v), as_tensor(mask), bias=as_tensor(bias),
            scale=scale, is_causal=is_causal, return_weights=return_weights)
    except AttnlabError:
        return
    out = (got[0] if return_weights else got).numpy()
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
        key_padding = rng.random((*_broadcast_to(draw, batch), k.shape[-2])) < 0.7
    return q, k, v, window, causal, key_padding, scale, dtype


@EXAMPLES
@given(window_inputs())
def test_sliding_window_attention(inputs):
    q, k, v, window, causal, key_padding, scale, dtype = inputs
    try:
        out = attnlab.sliding_window_attention(q, k, v, window, causal=causal,
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


@st.composite
def cache_inputs(draw):
    """Chunks of new tokens for one KV cache: [(q, k, v)], and the cache's settings."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    B, Hkv, G = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    D, Dv = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    chunks = []
    for T in draw(st.lists(st.integers(0, 3), min_size=1, max_size=4)):
        q = draw(arrays((B, Hkv * G, T, D), dtype, rng))
        k = draw(arrays((B, Hkv, T, D), dtype, rng))
        v = draw(arrays((B, Hkv, T, Dv), dtype, rng, magnitudes=[0.0, 1.0, 1e4]))
        chunks.append((q, k, v))
    scale = draw(st.sampled_from([None, 0.5, -2.0, np.float32(0.25)]))
    return chunks, (B, Hkv, D, Dv), scale, dtype


@EXAMPLES
@given(cache_inputs(), st.sampled_from(["numpy", "torch"]), st.sampled_from([None, 1, 2, 5]))
def test_kv_cache_append_and_attend(inputs, twin, window):
    """KVCache (window None) or SlidingWindowKVCache: each call equals plain attention
    over every key appended so far, causal (and within the last W positions)."""
    chunks, (B, Hkv, D, Dv), scale, dtype = inputs
    lib = attnlab if twin == "numpy" else at
    cache_dtype = dtype if twin == "numpy" else (
        torch.float32 if dtype == np.float32 else torch.float64)
    if window is None:
        cache = lib.KVCache(B, Hkv, D, Dv, capacity=1, dtype=cache_dtype)
    else:
        cache = lib.SlidingWindowKVCache(B, Hkv, D, Dv, window=window, dtype=cache_dtype)
    if twin == "numpy":
        convert, back = (lambda a: a), np.asarray
    else:
        convert, back = torch.from_numpy, (lambda t: t.numpy())
    keys, values = np.zeros((B, Hkv, 0, D), dtype), np.zeros((B, Hkv, 0, Dv), dtype)
    for q, k, v in chunks:
        length = cache.length
        try:
            out = back(cache.attend(convert(q), convert(k), convert(v), scale=scale))
        except AttnlabError:
            assert cache.length == length  # a refused call appends nothing
            continue
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        G = q.shape[1] // Hkv
        # Query head h reads key/value head h // G.
        all_k, all_v = np.repeat(keys, G, axis=1), np.repeat(values, G, axis=1)
        T, S = q.shape[2], keys.shape[2]
        allowed = allowed_keys(None, True, T, S)  # (T, S)
        if window is not None:  # the W most recent keys, itself included
            allowed = allowed & (np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T) - window)
        check(out, q, all_k, all_v, allowed, None, effective_scale(scale, D), dtype)


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
