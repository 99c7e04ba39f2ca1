"""Seed 000's own code, run verbatim, gives attnlab's numbers.

Seed 000's functions (tests/support/seeds.py) are copied from the article
unchanged (NumPy, global RNG, softmax without max-subtraction). Seed 001 is
PyTorch code: its tests, and the torch golden for seed 000's overflow, are in
tests/torch/test_seeds_torch.py.

Tolerance 1e-12 (float64): the same products and sums, in a different order.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.seeds import seed000_multi_head_attention, seed000_self_attention

import attnlab
from attnlab.lens.explain import SEED_000_X


def test_seed000_self_attention_gives_our_numbers():
    X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])  # the seed's integer X
    np.random.seed(0)
    Wq = np.random.randn(4, 3)
    Wk = np.random.randn(4, 3)
    Wv = np.random.randn(4, 3)
    expected = seed000_self_attention(X, Wq, Wk, Wv)
    np.testing.assert_allclose(attnlab.self_attention(X, Wq, Wk, Wv), expected, atol=1e-12)
    trace = attnlab.explain(X, Wq=Wq, Wk=Wk, Wv=Wv)
    np.testing.assert_allclose(trace.output, expected, atol=1e-12)
    # The weights step equals the seed's attention_weights (rows sum to 1).
    Q, K = X @ Wq, X @ Wk
    scores = Q @ K.T / np.sqrt(3)
    seed_weights = np.exp(scores) / np.sum(np.exp(scores), axis=1, keepdims=True)
    np.testing.assert_allclose(trace.get("weights").values, seed_weights, atol=1e-12)


def test_seed000_multi_head_is_explain_with_stacked_heads():
    np.random.seed(1)
    expected = seed000_multi_head_attention(SEED_000_X, head=4)
    np.random.seed(1)  # replay the seed's draws: per head Wq, Wk, Wv of (4, 3)
    per_head = [[np.random.randn(4, 3) for _ in range(3)] for _ in range(4)]
    Wq, Wk, Wv = (np.concatenate([h[i] for h in per_head], axis=1) for i in range(3))
    trace = attnlab.explain(SEED_000_X, Wq=Wq, Wk=Wk, Wv=Wv, num_heads=4)
    np.testing.assert_allclose(trace.get("concat").values, expected, atol=1e-12)
    mha = attnlab.MultiHeadAttention(Wq, Wk, Wv, np.eye(12), num_heads=4)
    np.testing.assert_allclose(mha(SEED_000_X)[0], expected, atol=1e-12)


def test_seed000_mask_convention_converts():
    blocked = np.array([[0, 1, 1], [0, 0, 1], [0, 0, 0]])  # seed 000: 1 = blocked
    np.testing.assert_array_equal(attnlab.from_blocked(blocked), attnlab.causal_mask(3))
    with pytest.raises(attnlab.AttnlabError, match="mask: expected only 0 and 1, got values 2"):
        attnlab.from_blocked([[0, 2]])
