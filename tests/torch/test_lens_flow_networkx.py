"""Attention flow's max-flow against networkx's (a dependency of torch, so present wherever
this tier runs; skipped, saying so, where it is not)."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.lens.rollout import attention_flow, fused_layers

nx = pytest.importorskip("networkx", reason="networkx (installed with torch) is the reference")


@pytest.mark.parametrize("seed, fusion", [(0, "mean"), (1, "max"), (2, "min")])
def test_flow_equals_networkx_maximum_flow(seed, fusion) -> None:
    rng = np.random.default_rng(seed)
    L, T = 4, 6
    weights = rng.dirichlet(np.full(T, 0.3), size=(L, 3, T))  # (L, H, T, T), peaked rows
    layers = fused_layers(weights, head_fusion=fusion, discard_ratio=0.2)
    graph = nx.DiGraph()
    for level in range(1, L + 1):
        for i in range(T):
            for j in range(T):
                graph.add_edge((level - 1, j), (level, i), capacity=layers[level - 1][i, j])
    flows = attention_flow(weights, head_fusion=fusion, discard_ratio=0.2)
    for i in range(T):
        for j in range(T):
            # Two float64 max-flow algorithms (Dinic here, preflow-push there): ~1e-16.
            expected = nx.maximum_flow_value(graph, (0, j), (L, i))
            assert flows[i, j] == pytest.approx(expected, abs=1e-12)
