"""Flash attention's plain twin: the online softmax over key tiles, in a few readable lines.

Dimension legend: T query length, S key length, D head dim, Dv value dim.

:func:`attnlab.fast.flash.flash_attention` never holds the (T, S) score matrix:
it reads the keys a tile of ``block_k`` at a time and keeps, per query, a
running max m, a running sum l = Σ exp(s - m) and an unnormalised output acc,
rescaling the three whenever a tile raises the max. :func:`flash_walk` is that
loop and nothing else (one head, no query tiles, no masks, every step kept), the
computation flash is an efficient implementation of::

    m, l, acc = -inf, 0, 0                            # (T,), (T,), (T, Dv)
    for each key tile [k0, k1):
        s     = q @ k[k0:k1].T * scale                # (T, k1 - k0) this tile's scores
        m_new = max(m, rowmax(s))
        l     = l · exp(m - m_new) + rowsum(exp(s - m_new))
        acc   = acc · exp(m - m_new) + exp(s - m_new) @ v[k0:k1]
        m     = m_new
    out = acc / l                                     # = softmax(q kᵀ · scale) v
    lse = m + log l                                   # what flash keeps for its backward

After each tile, acc / l is the softmax over the keys read so far applied to
their values, and m + log l their log-sum-exp: the tests hold both equal to
:func:`attnlab.fast.flash.flash_attention` on every prefix of the keys, and the
last output to :func:`attnlab.scaled_dot_product_attention`. ``attnlab draw
flash`` draws the steps (:func:`attnlab.report.concepts.draw_flash`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import check_positive_int, check_scale
from ..errors import AttnlabError

__all__ = ["FlashStep", "FlashWalk", "flash_walk"]


@dataclass
class FlashStep:
    """After key tile ``[k0, k1)``: the running max m (T,), the running sum
    l = Σ exp(s - m) (T,), and the output so far acc / l (T, Dv)."""

    k0: int
    k1: int
    tile_scores: np.ndarray  # (T, k1 - k0) scaled scores of this tile
    running_max: np.ndarray  # (T,)
    running_sum: np.ndarray  # (T,)
    output: np.ndarray  # (T, Dv), the softmax over keys 0..k1 applied to their values


@dataclass
class FlashWalk:
    """Every step of :func:`flash_walk`, and the whole score matrix for pictures."""

    scores: np.ndarray  # (T, S) all scaled scores (what flash never holds at once)
    block_k: int
    steps: list[FlashStep]
    output: np.ndarray  # (T, Dv), the last step's


def flash_walk(q: Any, k: Any, v: Any, *, block_k: int = 2,
               scale: float | None = None) -> FlashWalk:
    """Flash attention's online softmax over key tiles of ``block_k``, every step kept.

    Shapes: q (T, D), k (S, D), v (S, Dv) -> a walk of ceil(S / block_k) steps,
    computed in float64. At each tile, with s its scaled scores::

        m_new = max(m, rowmax(s))
        l     = l · exp(m - m_new) + Σ exp(s - m_new)
        acc   = acc · exp(m - m_new) + exp(s - m_new) · v_tile
        output so far = acc / l       (= softmax over the keys seen so far, times their v)

    ``scale`` defaults to 1/√D. The final output equals
    :func:`attnlab.fast.flash.flash_attention` and plain attention.

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 5, 4))
    >>> walk = flash_walk(q, k, v, block_k=2)
    >>> [(step.k0, step.k1) for step in walk.steps], walk.output.shape
    ([(0, 2), (2, 4), (4, 5)], (5, 4))
    """
    block_k = check_positive_int(block_k, "block_k")
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or k.shape[0] != v.shape[0] \
            or q.shape[1] != k.shape[1] or k.shape[0] == 0:
        raise AttnlabError(f"q, k, v: expected (T, D), (S, D), (S, Dv) with S >= 1, got "
                           f"{q.shape}, {k.shape}, {v.shape}")
    T, S = q.shape[0], k.shape[0]
    scale_value = check_scale(scale, q.shape[1])
    scores = q @ k.T * scale_value  # (T, S)
    m = np.full(T, -np.inf)  # (T,) running max
    l_sum = np.zeros(T)  # (T,) running Σ exp(s - m)
    acc = np.zeros((T, v.shape[1]))  # (T, Dv) running Σ exp(s - m) v
    steps = []
    for k0 in range(0, S, block_k):
        k1 = min(S, k0 + block_k)
        s = scores[:, k0:k1]  # (T, bk)
        m_new = np.maximum(m, s.max(axis=1))  # (T,)
        correction = np.exp(m - m_new)  # (T,), 0 on the first tile (m = -inf)
        p = np.exp(s - m_new[:, None])  # (T, bk)
        l_sum = l_sum * correction + p.sum(axis=1)
        acc = acc * correction[:, None] + p @ v[k0:k1]  # (T, Dv)
        m = m_new
        steps.append(FlashStep(k0, k1, s.copy(), m.copy(), l_sum.copy(), acc / l_sum[:, None]))
    return FlashWalk(scores=scores, block_k=block_k, steps=steps, output=steps[-1].output)
