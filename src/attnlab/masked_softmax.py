"""The one NumPy softmax of attnlab: masked-safe, unchecked, optionally in place.

Every NumPy path that normalises scores into weights calls it: the plain
attention kernel (:func:`attnlab.kernel.attend`), the public
:func:`attnlab.softmax` (which validates, then calls it), multi-head attention,
Nyström's landmarks, the decoder's sampling and the fused BERT encoder's exact
fallback. Two fast paths compute the same quantity another way and are tested
against the plain path that calls this one: flash's online softmax (tile by
tile) and the fused encoder's :func:`attnlab.models.fused.softmax_by_blocks`
(one shift per head instead of one per row).

    m       = max_j s_j                      0 instead for a row that is all -inf
    w_j     = exp(s_j - m) / Σ_k exp(s_k - m)
    lse     = m + log Σ_k exp(s_k - m)       -inf for a row that is all -inf

The rules, decided once for the library:

- subtracting the row maximum keeps every exponent ≤ 0, so logits of ±1e4 (or
  ±1e308) neither overflow nor give NaN;
- a -inf score (a masked key) gets weight exactly 0;
- a row that is entirely -inf (a query with nothing to attend to) gets all
  zeros, never NaN (TransformerLens's silent NaN → 0 would hide a mask bug;
  here it is the decided output, and ``lse`` says -inf for it);
- an axis of length 0 (S = 0) gives an empty result and lse = -inf.

No validation: callers pass a float array whose entries are finite or -inf
(a NaN or +inf gives NaN rows). Validate at the public boundary first, as
:func:`attnlab.softmax` does.
"""

from __future__ import annotations

import numpy as np

__all__ = ["softmax_with_lse", "stable_softmax"]


def stable_softmax(scores: np.ndarray, axis: int = -1, *, in_place: bool = False) -> np.ndarray:
    """Softmax along ``axis``, masked-safe (see the module docstring), without validation.

    Shapes: (..., S) -> (..., S) for ``axis=-1``; any axis. With ``in_place``
    ``scores`` is overwritten and returned (no copy of an O(T·S) matrix); else a
    new array. The torch twin is :func:`attnlab.torch.kernel.stable_softmax`.
    """
    return softmax_with_lse(scores, axis, in_place=in_place, lse=False)[0]


def softmax_with_lse(
    scores: np.ndarray, axis: int = -1, *, in_place: bool = False, lse: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`stable_softmax`, and log Σ exp(scores) along ``axis`` (natural log, float64).

    Shapes: (..., S) -> weights (..., S), lse (...) (the axis removed; -inf for
    a row that is all -inf or empty; None unless ``lse``). The log-sum-exp is
    what flash attention stores for its backward and what ring attention merges.
    """
    lead = tuple(n for i, n in enumerate(scores.shape) if i != axis % max(scores.ndim, 1))
    if scores.shape[axis] == 0:  # S = 0: nothing to normalise
        weights = scores if in_place else np.zeros_like(scores)
        return weights, (np.full(lead, -np.inf) if lse else None)
    row_max = np.max(scores, axis=axis, keepdims=True)  # (..., 1)
    empty = np.isneginf(row_max)  # (..., 1): nothing to attend to
    row_max[empty] = 0.0  # avoid -inf - -inf = NaN
    with np.errstate(over="ignore"):  # -1e308 - 1e308 = -inf: exp gives its exact weight 0
        if in_place:
            scores -= row_max
            weights = scores
        else:
            weights = scores - row_max  # (..., S)
    np.exp(weights, out=weights)
    sums = np.sum(weights, axis=axis, keepdims=True)  # (..., 1)
    sums[sums == 0.0] = 1.0  # nothing to attend to: divide by 1, leaving the zeros
    weights /= sums
    if not lse:
        return weights, None
    row_lse = row_max.astype(np.float64) + np.log(sums.astype(np.float64))  # (..., 1)
    row_lse[empty] = -np.inf
    return weights, np.squeeze(row_lse, axis=axis)  # (...)
