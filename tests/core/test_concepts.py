"""The data behind the concept pictures equals what the fast paths compute (flash's walk,
attnlab.fast.flash_walk, is tested in test_flash_walk.py)."""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.lens.concepts import (
    example_qkv,
    kv_cache_walk,
    position_patterns,
    sparse_patterns,
)

# float64 throughout; the walks sum in a different order than the fast paths: a few
# ulps on values of order 1, so 1e-12 is tight enough to catch a wrong rescaling
# (which errs by order 1) with room for rounding.
ATOL = 1e-12


@pytest.mark.parametrize("window", [None, 1, 3, 8])
def test_kv_cache_walk_is_causal_attention_and_the_window_rolls(window):
    q, k, v = example_qkv(7, 4, seed=2)
    walk = kv_cache_walk(q, k, v, window=window)
    W = 7 if window is None else window
    mask = attnlab.sliding_window_mask(7, W, is_causal=True)
    expected = attnlab.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(np.stack([s.output for s in walk.steps]), expected, atol=ATOL)
    for step in walk.steps:
        t = step.position
        assert step.seen.tolist() == list(range(max(0, t - W + 1), t + 1))
        held = sorted(p for p in step.slots.tolist() if p >= 0)
        assert held == step.seen.tolist()
        if window is not None:  # position p lives in slot p mod W
            assert all(step.slots[p % W] == p for p in held)
        np.testing.assert_allclose(step.weights.sum(), 1.0, atol=ATOL)


def test_position_patterns():
    data = position_patterns(16, 8, 4)
    np.testing.assert_allclose(data.sinusoidal[1, 0], np.sin(1.0), atol=ATOL)
    for offset in range(-15, 16):  # RoPE: a score depends on m - n only
        diagonal = np.diagonal(data.rope_scores, offset)
        np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-12)
    np.testing.assert_allclose(data.rope_angles[3, 0], 3.0, atol=ATOL)  # θ_0 = 1


def test_sparse_patterns_keep_what_their_masks_say_and_low_rank_rows_sum_to_one():
    data = sparse_patterns(12, window=3, block_size=3, rank=3)
    causal = data.masks["window_causal"]
    assert causal.sum() == 3 * 12 - 3  # rows 0 and 1 hold fewer than W keys
    assert data.masks["window_global"][:, 0].all() and data.masks["window_global"][0].all()
    np.testing.assert_allclose(data.exact.sum(axis=1), 1.0, atol=ATOL)
    q, k, _ = example_qkv(12, 8, seed=0)
    np.testing.assert_allclose(data.exact, attnlab.softmax(q @ k.T / np.sqrt(8)), atol=ATOL)
    # Linformer's effective weights are a softmax over pooled keys: rows sum to 1.
    np.testing.assert_allclose(data.approximations["linformer"].sum(axis=1), 1.0, atol=1e-12)
    assert np.linalg.matrix_rank(data.approximations["nystrom"], tol=1e-8) <= 3


def test_a_negative_seed_is_refused_by_name():
    # example_qkv and position_patterns passed seed=-1 to NumPy, whose refusal
    # ("expected non-negative integer") names no argument.
    for make in (example_qkv, position_patterns, sparse_patterns):
        with pytest.raises(attnlab.AttnlabError, match=r"^seed: expected an integer >= 0, "
                                                       r"got -1$"):
            make(seed=-1)
