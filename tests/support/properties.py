"""The inputs and the float64 reference of the property tests (NumPy only).

Used by tests/core/test_property_errors.py and its torch twin,
tests/torch/test_property_errors_torch.py.

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
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from attnlab.errors import AttnlabError

__all__ = [
    "EXAMPLES",
    "MAGNITUDES",
    "allowed_keys",
    "arrays",
    "attention_inputs",
    "broadcastable_shape",
    "cache_inputs",
    "check",
    "check_cache_calls",
    "effective_scale",
    "reference",
    "tolerance",
]

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


def broadcastable_shape(draw, target):
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
    q_batch, k_batch = broadcastable_shape(draw, batch), broadcastable_shape(draw, batch)
    v_batch = broadcastable_shape(draw, batch)
    q = draw(arrays((*q_batch, T, D), dtype, rng))
    k = draw(arrays((*k_batch, S, D), dtype, rng))
    v = draw(arrays((*v_batch, S, Dv), dtype, rng, magnitudes=[0.0, 1.0, 1e4, 1e30]))
    full = (*np.broadcast_shapes(q_batch, k_batch, v_batch), T, S)

    mask = None
    kind = draw(st.sampled_from(["none", "full", "keys", "scalar"]))
    if kind == "full":
        mask = rng.random(broadcastable_shape(draw, full)) < draw(st.floats(0.0, 1.0))
    elif kind == "keys":  # (S,): the same keys for every query
        mask = rng.random(S) < draw(st.floats(0.0, 1.0))
    elif kind == "scalar":
        mask = np.bool_(draw(st.booleans()))

    bias = None
    if draw(st.booleans()):
        shape = (S,) if draw(st.booleans()) else broadcastable_shape(draw, full)
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


def check_cache_calls(cache, chunks, Hkv, D, Dv, scale, dtype, window, *, convert, back):
    """Feed ``chunks`` to ``cache`` (either twin): each call equals plain attention over
    every key appended so far, causal (and within the last W positions); a refused call
    appends nothing. ``convert`` turns a NumPy array into the twin's array, ``back`` the
    twin's result into NumPy."""
    B = chunks[0][0].shape[0]
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
