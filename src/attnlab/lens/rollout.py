"""Attention rollout and attention flow (Abnar & Zuidema 2020): how much of each input
token reaches each output token through all the layers.

Both read the weights of every layer and head, ``(L, H, T, T)`` (self-attention, so
the keys of layer l are the queries of layer l - 1), and first turn each layer into
one token-to-token matrix::

    Ā_l = fuse over heads of weights[l]             mean | max | min      (T, T)
    Ā_l = Ā_l with the discard_ratio smallest entries of the layer set to 0
    Ã_l = rownorm(½·Ā_l + ½·I)      (residual=True: the skip connection keeps half)
    Ã_l = rownorm(Ā_l)              (residual=False)

rollout
    ``Ã_L ⋯ Ã_2 Ã_1``: entry [i, j] is the share of input token j in output token i
    when attention is read as mixing proportions (each row sums to 1).
flow
    the graph has a node for every token at every level 0..L and an edge from token j
    at level l - 1 to token i at level l with capacity Ã_l[i, j]; entry [i, j] is the
    maximum flow from input token j (level 0) to output token i (level L). Flow reads
    the weights as capacities, so a path counts only as much as its narrowest edge.
    The maximum flow is computed here with Dinic's algorithm on a dense capacity
    matrix, in NumPy; no graph library is needed.

Dimension legend: L layers, H heads, T tokens.

>>> import numpy as np
>>> weights = np.full((2, 1, 2, 2), 0.5)   # two layers of one uniform head
>>> attention_rollout(weights).tolist()   # each layer: ½·uniform + ½·I = [[.75, .25], [.25, .75]]
[[0.625, 0.375], [0.375, 0.625]]
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

import numpy as np

from ..checks import shape_str
from ..errors import AttnlabError, ShapeError
from .weight_checks import check_weights

__all__ = ["HEAD_FUSIONS", "attention_flow", "attention_rollout", "fused_layers", "max_flow"]

HeadFusion = Literal["mean", "max", "min"]
HEAD_FUSIONS = ("mean", "max", "min")


def fused_layers(
    weights: Any, *, residual: bool = True, head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """The per-layer token-to-token matrices Ã_l that rollout and flow combine.

    Shapes: weights (L, H, T, T) (or (H, T, T), one layer) -> (L, T, T), float64,
    every row summing to 1 (a row left with no weight at all, possible only with
    ``residual=False``, stays 0 rather than becoming NaN).

    ``discard_ratio`` in [0, 1): in each layer, after fusing the heads, the
    ``floor(discard_ratio · T²)`` smallest entries (ties: the earlier position
    first) are set to 0 before the identity is added, as in vit-explain's rollout.
    """
    w = check_weights(weights).astype(np.float64)  # (L, H, T, S)
    L, H, T, S = w.shape
    if T != S:
        raise ShapeError(f"weights: expected self-attention (L, H, T, T), got {shape_str(w.shape)}")
    if head_fusion not in HEAD_FUSIONS:
        raise AttnlabError(f"head_fusion: expected one of {list(HEAD_FUSIONS)}, "
                           f"got {head_fusion!r}")
    if not isinstance(residual, (bool, np.bool_)):
        raise AttnlabError(f"residual: expected True or False, got {residual!r}")
    if isinstance(discard_ratio, bool) or not isinstance(discard_ratio, (int, float)) or not (
            0.0 <= discard_ratio < 1.0):
        raise AttnlabError(f"discard_ratio: expected a number in [0, 1), got {discard_ratio!r}")
    fused = getattr(np, head_fusion)(w, axis=1)  # (L, T, T)
    fused = np.clip(fused, 0.0, None)  # float16 rounding may leave -1e-4; weights are >= 0
    drop = int(np.floor(discard_ratio * T * T))
    if drop:
        flat = fused.reshape(L, T * T)  # (L, T²), a view
        smallest = np.argsort(flat, axis=-1, kind="stable")[:, :drop]  # (L, drop)
        np.put_along_axis(flat, smallest, 0.0, axis=-1)
    if residual:
        fused = 0.5 * fused + 0.5 * np.eye(T)  # (L, T, T)
    sums = fused.sum(axis=-1, keepdims=True)  # (L, T, 1)
    return np.divide(fused, sums, out=np.zeros_like(fused), where=sums > 0)  # (L, T, T)


def attention_rollout(
    weights: Any, *, residual: bool = True, head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """Attention rollout Ã_L ⋯ Ã_1 (Abnar & Zuidema 2020). (L, H, T, T) -> (T, T).

    Entry [i, j]: the share of input token j in output token i. With
    ``residual=True`` (the paper's choice: a residual connection carries half of
    each token forward) every row sums to 1. See :func:`fused_layers` for the
    options.
    """
    layers = fused_layers(weights, residual=residual, head_fusion=head_fusion,
                          discard_ratio=discard_ratio)  # (L, T, T)
    rolled = np.eye(layers.shape[-1])  # (T, T)
    for layer in layers:
        rolled = layer @ rolled  # (T, T): Ã_l (Ã_{l-1} ⋯ Ã_1)
    return rolled


def attention_flow(
    weights: Any, *, residual: bool = True, head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """Attention flow (Abnar & Zuidema 2020). (L, H, T, T) -> (T, T).

    Entry [i, j]: the maximum flow from input token j (level 0) to output token i
    (level L) in the layered graph whose edge (l - 1, j) -> (l, i) has capacity
    Ã_l[i, j] (:func:`fused_layers`). One max-flow per (i, j): T² of them on
    (L + 1)·T nodes, in Python loops: for L = 6, about 0.2 s at T = 8, 3 s at T = 20
    and 18 s at T = 32 (measured on a busy two-core machine); for longer inputs
    rollout is the cheap alternative.
    """
    layers = fused_layers(weights, residual=residual, head_fusion=head_fusion,
                          discard_ratio=discard_ratio)  # (L, T, T)
    L, T, _ = layers.shape
    n = (L + 1) * T  # node (level l, token i) is l·T + i
    capacity = np.zeros((n, n))  # (n, n)
    for level, layer in enumerate(layers, start=1):
        # edge (level - 1, j) -> (level, i) with capacity Ã_level[i, j]
        capacity[(level - 1) * T: level * T, level * T: (level + 1) * T] = layer.T
    flows = np.zeros((T, T))  # (T out, T in)
    for j in range(T):
        for i in range(T):
            flows[i, j] = max_flow(capacity, j, L * T + i)
    return flows


def max_flow(capacity: np.ndarray, source: int, sink: int) -> float:
    """The value of a maximum flow from ``source`` to ``sink`` (Dinic's algorithm).

    Shapes: capacity (n, n), capacity[u, v] >= 0 the capacity of edge u -> v.
    Residual capacities below 1e-12 (relative to the largest) count as 0, so
    rounding cannot send the search round an endless loop of tiny augmentations.
    """
    cap = np.asarray(capacity, dtype=np.float64)
    if cap.ndim != 2 or cap.shape[0] != cap.shape[1]:
        raise ShapeError(f"capacity: expected a square (n, n) matrix, got {shape_str(cap.shape)}")
    n = cap.shape[0]
    if not (0 <= source < n and 0 <= sink < n) or source == sink:
        raise AttnlabError(f"source, sink: expected two different nodes in 0..{n - 1}, "
                           f"got {source} and {sink}")
    if (cap < 0).any() or not np.isfinite(cap).all():
        raise AttnlabError("capacity: expected finite capacities >= 0")
    # residual[u][v] = cap[u, v] - flow[u, v] + flow[v, u]; Python lists, whose items
    # are read several times faster than a NumPy array's in these scalar loops.
    residual = cap.tolist()
    tol = 1e-12 * max(float(cap.max(initial=0.0)), 1e-300)
    linked = (cap > 0) | (cap.T > 0)  # (n, n): residual capacity can only appear here
    neighbours = [np.flatnonzero(row).tolist() for row in linked]
    total = 0.0
    while True:
        level = _levels(residual, neighbours, source, tol)
        if level[sink] < 0:
            return total
        next_edge = [0] * n  # Dinic's "current arc": the next neighbour to try, per node
        while True:
            pushed = _push(residual, neighbours, level, next_edge, source, sink, np.inf, tol)
            if pushed <= tol:
                break
            total += pushed


def _levels(residual: list[list[float]], neighbours: list[list[int]], source: int,
            tol: float) -> list[int]:
    """Breadth-first distance from ``source`` over edges with residual capacity; -1 = unreached."""
    level = [-1] * len(residual)
    level[source] = 0
    queue = deque([source])
    while queue:
        u = queue.popleft()
        row = residual[u]
        for v in neighbours[u]:
            if level[v] < 0 and row[v] > tol:
                level[v] = level[u] + 1
                queue.append(v)
    return level


def _push(residual: list[list[float]], neighbours: list[list[int]], level: list[int],
          next_edge: list[int], u: int, sink: int, limit: float, tol: float) -> float:
    """One augmenting path of the level graph from ``u`` (depth-first), its flow pushed."""
    if u == sink:
        return limit
    candidates = neighbours[u]
    while next_edge[u] < len(candidates):
        v = candidates[next_edge[u]]
        capacity = residual[u][v]
        if level[v] == level[u] + 1 and capacity > tol:
            pushed = _push(residual, neighbours, level, next_edge, v, sink,
                           min(limit, capacity), tol)
            if pushed > tol:
                residual[u][v] -= pushed
                residual[v][u] += pushed
                return pushed
        next_edge[u] += 1
    return 0.0
