"""A float64 reference for the distributed tiers: plain attention over the whole sequence.

Written from the formula, not from attnlab: scores, a -inf fill where a key is not
allowed, log-sum-exp with the row max taken out, weights exp(s - lse).
"""

from __future__ import annotations

import numpy as np


def reference_attention(q, k, v, *, is_causal=False, key_padding=None, scale=None):
    """(B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, Dv) -> out (B, H, T, Dv), lse (B, H, T).

    Computed in float64 (longdouble for the sums would change nothing at these sizes).
    A query with no key gets out 0 and lse -inf.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    T, D = q.shape[-2:]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    scores = np.einsum("bhtd,bhsd->bhts", q, k) * scale  # (B, H, T, S)
    allowed = np.ones(scores.shape, dtype=bool)
    if is_causal:
        allowed &= np.tril(np.ones((T, T), dtype=bool))
    if key_padding is not None:
        allowed &= np.asarray(key_padding, dtype=bool)[:, None, None, :]
    scores = np.where(allowed, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)  # (B, H, T, 1)
    top = np.where(np.isfinite(top), top, 0.0)
    sums = np.exp(scores - top).sum(axis=-1, keepdims=True)  # (B, H, T, 1)
    with np.errstate(divide="ignore"):
        lse = (np.log(sums) + top)[..., 0]  # (B, H, T), -inf where no key
    weights = np.exp(scores - np.where(np.isfinite(lse), lse, np.inf)[..., None])
    return weights @ v, lse


def random_inputs(rng, B, H, Hkv, T, D, Dv, dtype=np.float64):
    """q, k, v with O(1) scores: neither a flat nor a one-hot softmax."""
    q = rng.standard_normal((B, H, T, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, T, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, T, Dv)).astype(dtype)
    return q, k, v
