"""Attention rollout and flow against a two-layer example worked out by hand, and the
max-flow against a brute-force minimum cut (max-flow = min-cut)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnlab.errors import AttnlabError, ShapeError
from attnlab.lens.rollout import attention_flow, attention_rollout, fused_layers, max_flow

# Two layers, two heads, two tokens. The fused, residual-added matrices by hand:
#   layer 1: mean of heads = [[.75, .25], [.25, .75]]  -> ½·Ā + ½·I = [[.875, .125], [.125, .875]]
#   layer 2: mean of heads = [[0, 1], [.5, .5]]        -> ½·Ā + ½·I = [[.5, .5], [.25, .75]]
WEIGHTS = np.array([
    [[[1.0, 0.0], [0.5, 0.5]], [[0.5, 0.5], [0.0, 1.0]]],
    [[[0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]],
])  # (L, H, T, T) = (2, 2, 2, 2)

# All values below are dyadic fractions or thirds: exact to a few ulps in float64.
TOL = 1e-15


def test_rollout_mean_by_hand() -> None:
    # Ã2 Ã1 = [[.5·.875 + .5·.125, .5·.125 + .5·.875], [.25·.875 + .75·.125, .25·.125 + .75·.875]]
    expected = np.array([[0.5, 0.5], [0.3125, 0.6875]])
    np.testing.assert_allclose(attention_rollout(WEIGHTS), expected, rtol=0, atol=TOL)


def test_rollout_max_and_min_fusion_by_hand() -> None:
    # max: layer 1 [[1, .5], [.5, 1]] -> ½Ā+½I = [[1, .25], [.25, 1]]
    #      -> rows / 1.25 = [[.8, .2], [.2, .8]]
    #      layer 2 [[0, 1], [1, 1]]   -> [[.5, .5], [.5, 1]] -> [[.5, .5], [1/3, 2/3]]
    expected_max = np.array([[0.5, 0.5], [0.8 / 3 + 0.4 / 3, 0.2 / 3 + 1.6 / 3]])
    np.testing.assert_allclose(attention_rollout(WEIGHTS, head_fusion="max"), expected_max,
                               rtol=0, atol=TOL)
    # min: layer 1 [[.5, 0], [0, .5]] -> [[.75, 0], [0, .75]] -> I
    #      layer 2 [[0, 1], [0, 0]]   -> [[.5, .5], [0, .5]]  -> [[.5, .5], [0, 1]]
    expected_min = np.array([[0.5, 0.5], [0.0, 1.0]])
    np.testing.assert_allclose(attention_rollout(WEIGHTS, head_fusion="min"), expected_min,
                               rtol=0, atol=TOL)


def test_rollout_without_residual_and_with_discard_by_hand() -> None:
    # No identity: Ã2 Ã1 = [[0, 1], [.5, .5]] · [[.75, .25], [.25, .75]]
    np.testing.assert_allclose(attention_rollout(WEIGHTS, residual=False),
                               [[0.25, 0.75], [0.5, 0.5]], rtol=0, atol=TOL)
    # discard_ratio .25 of T² = 4 entries: one per layer, the smallest (earliest on ties).
    # layer 1: [[.75, .25], [.25, .75]] loses [0, 1] -> ½Ā+½I = [[.875, 0], [.125, .875]]
    #          -> rows normalised [[1, 0], [.125, .875]]
    # layer 2: [[0, 1], [.5, .5]] loses [0, 0] (already 0) -> [[.5, .5], [.25, .75]]
    expected = np.array([[0.5 + 0.5 * 0.125, 0.5 * 0.875], [0.25 + 0.75 * 0.125, 0.75 * 0.875]])
    np.testing.assert_allclose(attention_rollout(WEIGHTS, discard_ratio=0.25), expected,
                               rtol=0, atol=TOL)


def test_flow_by_hand() -> None:
    # With two layers each path j -> k -> i is two edges and the paths share no edge, so
    # flow[i, j] = Σ_k min(Ã1[k, j], Ã2[i, k]):
    #   [0, 0] = min(.875, .5) + min(.125, .5) = .625
    #   [0, 1] = min(.125, .5) + min(.875, .5) = .625
    #   [1, 0] = min(.875, .25) + min(.125, .75) = .375
    #   [1, 1] = min(.125, .25) + min(.875, .75) = .875
    expected = np.array([[0.625, 0.625], [0.375, 0.875]])
    np.testing.assert_allclose(attention_flow(WEIGHTS), expected, rtol=0, atol=TOL)


def _min_cut(capacity: np.ndarray, source: int, sink: int) -> float:
    """The smallest cut over every set of nodes holding the source and not the sink."""
    n = capacity.shape[0]
    others = [v for v in range(n) if v not in (source, sink)]
    best = np.inf
    for picks in itertools.product([False, True], repeat=len(others)):
        side = np.zeros(n, dtype=bool)
        side[source] = True
        side[[v for v, p in zip(others, picks, strict=True) if p]] = True
        best = min(best, float(capacity[side][:, ~side].sum()))
    return best


def test_flow_three_layers_equals_brute_force_min_cut() -> None:
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(3), size=(3, 2, 3))  # (L, H, T, T) = (3, 2, 3, 3)
    layers = fused_layers(weights)  # (3, 3, 3)
    L, T = 3, 3
    capacity = np.zeros(((L + 1) * T, (L + 1) * T))
    for level in range(1, L + 1):
        capacity[(level - 1) * T: level * T, level * T: (level + 1) * T] = layers[level - 1].T
    flows = attention_flow(weights)
    for i in range(T):
        for j in range(T):
            # 2^10 cuts per pair; float64 sums of a dozen terms: 1e-12.
            assert flows[i, j] == pytest.approx(_min_cut(capacity, j, L * T + i), abs=1e-12)


def test_max_flow_textbook_network() -> None:
    # CLRS figure 26.1: maximum flow 23.
    cap = np.zeros((6, 6))
    for u, v, c in [(0, 1, 16), (0, 2, 13), (1, 3, 12), (2, 1, 4), (2, 4, 14), (3, 2, 9),
                    (3, 5, 20), (4, 3, 7), (4, 5, 4)]:
        cap[u, v] = c
    assert max_flow(cap, 0, 5) == 23.0


def test_rollout_rows_sum_to_one_and_shapes() -> None:
    rng = np.random.default_rng(1)
    weights = rng.dirichlet(np.ones(5), size=(4, 3, 5)).astype(np.float32)  # (L, H, T, T)
    for fusion in ("mean", "max", "min"):
        rolled = attention_rollout(weights, head_fusion=fusion, discard_ratio=0.5)
        assert rolled.shape == (5, 5)
        np.testing.assert_allclose(rolled.sum(axis=-1), 1.0, atol=1e-12)


def test_one_layer_of_three_dims_and_zero_rows() -> None:
    # (H, T, T) is one layer; a row with no weight at all stays 0 without residual.
    weights = np.array([[[0.0, 0.0], [0.5, 0.5]]])  # (H, T, T) = (1, 2, 2)
    np.testing.assert_array_equal(attention_rollout(weights, residual=False),
                                  [[0.0, 0.0], [0.5, 0.5]])


def test_bad_arguments() -> None:
    with pytest.raises(ShapeError, match="weights: expected self-attention"):
        attention_rollout(np.full((1, 1, 2, 3), 1 / 3))
    with pytest.raises(AttnlabError, match="head_fusion: expected one of"):
        attention_rollout(WEIGHTS, head_fusion="sum")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match="discard_ratio: expected a number in"):
        attention_rollout(WEIGHTS, discard_ratio=1.0)
    with pytest.raises(AttnlabError, match="residual: expected True or False"):
        attention_flow(WEIGHTS, residual="yes")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match="weights: expected attention weights in"):
        attention_rollout(WEIGHTS * 3)
    with pytest.raises(AttnlabError, match="source, sink"):
        max_flow(np.ones((2, 2)), 0, 0)
