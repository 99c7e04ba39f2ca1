"""Flash attention's plain twin (attnlab.fast.flash_walk) equals flash attention and plain
attention: after every key tile, and at the end."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import AttnlabError, scaled_dot_product_attention
from attnlab.fast.flash import flash_attention
from attnlab.fast.flash_walk import flash_walk
from attnlab.lens import concepts

# float64 throughout. The walk sums tile by tile in its own order, flash in its tiles and
# the plain path over whole rows: they differ by a few ulps on outputs of order 1 (about
# 1e-16 each). 1e-12 leaves room for that rounding and still catches a wrong rescaling
# (a missing exp(m - m_new) errs by order 1).
ATOL = 1e-12


def _qkv(T: int, S: int, D: int, Dv: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, D)), rng.standard_normal((S, D)), rng.standard_normal((S, Dv))


@pytest.mark.parametrize("block_k", [1, 2, 3, 8])
def test_every_step_is_flash_attention_over_the_keys_read_so_far(block_k):
    q, k, v = _qkv(5, 8, 4, 3, seed=1)
    walk = flash_walk(q, k, v, block_k=block_k)
    assert len(walk.steps) == -(-8 // block_k)
    for step in walk.steps:
        seen = slice(0, step.k1)
        out, lse = flash_attention(q, k[seen], v[seen], block_k=block_k, return_lse=True)
        np.testing.assert_allclose(step.output, out, atol=ATOL)
        np.testing.assert_allclose(step.running_max, (q @ k[seen].T / 2.0).max(axis=1),
                                   atol=ATOL)  # scale 1/√4
        # lse = m + log l: the running sum is what flash's log-sum-exp holds.
        np.testing.assert_allclose(step.running_max + np.log(step.running_sum), lse, atol=ATOL)


@pytest.mark.parametrize(("T", "S", "block_k", "scale"),
                         [(1, 1, 1, None), (4, 7, 3, None), (6, 5, 16, 0.3), (3, 9, 2, 2.0)])
def test_the_output_is_plain_attention(T, S, block_k, scale):
    q, k, v = _qkv(T, S, 4, 2, seed=T + S)
    walk = flash_walk(q, k, v, block_k=block_k, scale=scale)
    np.testing.assert_allclose(walk.output, scaled_dot_product_attention(q, k, v, scale=scale),
                               atol=ATOL)
    np.testing.assert_allclose(walk.output, flash_attention(q, k, v, scale=scale), atol=ATOL)
    assert walk.scores.shape == (T, S)


def test_huge_scores_are_rescaled_not_overflowed():
    # Scores of ±600 overflow exp in float64 unless the running max is subtracted.
    q = np.array([[30.0, 0.0]])
    k = np.array([[-20.0, 0.0], [20.0, 0.0], [19.9, 0.0]])
    v = np.eye(3)
    walk = flash_walk(q, k, v, block_k=1, scale=1.0)
    assert np.isfinite(walk.output).all()
    np.testing.assert_allclose(walk.output, scaled_dot_product_attention(q, k, v, scale=1.0),
                               atol=ATOL)


@pytest.mark.parametrize(("shapes", "block_k"), [
    (((2, 4), (3, 5), (3, 2)), 2),   # D of k differs from q's
    (((2, 4), (3, 4), (2, 2)), 2),   # v's S differs from k's
    (((2, 4), (0, 4), (0, 2)), 2),   # no keys
    (((2, 4), (3, 4), (3, 2)), 0),   # block_k < 1
])
def test_bad_inputs_are_refused(shapes, block_k):
    q, k, v = (np.zeros(shape) for shape in shapes)
    with pytest.raises(AttnlabError):
        flash_walk(q, k, v, block_k=block_k)


def test_the_lens_keeps_its_name_for_it():
    assert concepts.flash_walk is flash_walk
