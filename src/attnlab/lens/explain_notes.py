"""What a learner should know about one ``explain`` run, found from its numbers.

Each note is data, ``{"kind": ..., "head": ..., ...}``; :mod:`attnlab.report.words`
holds the sentences. Dimension legend: T query length, S key length (T = S here).

    untrained       the weights were drawn at random: which token attends to which
                    means nothing until they are trained
    same_rows       tokens whose input rows are identical: without positions,
                    attention gives them identical rows of weights
    scaling_off     the scores go to softmax unscaled
    saturated       rows whose largest weight is above SATURATED_WEIGHT (one-hot)
    naive_overflow  seed 000's softmax, exp(s) / sum(exp(s)) without subtracting the
                    row max, gives NaN or inf on these scores (checked by running it)
    near_uniform    every row's normalised entropy is above NEAR_UNIFORM_ROW_ENTROPY
    fully_masked    rows with no key to attend to (their weights are all 0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NEAR_UNIFORM_ROW_ENTROPY", "SATURATED_WEIGHT", "head_notes", "layer_notes",
           "naive_softmax_fails"]

#: A row whose largest weight is above this is one-hot in practice: its gradient
#: (w_i (δ_ij - w_j)) is below 0.01 everywhere.
SATURATED_WEIGHT = 0.99
#: entropy / log(allowed keys) above this in every row: the weights are all nearly equal
#: (over 3 keys, [0.40, 0.33, 0.27] is at 0.988). Seed 000's checklist item "注意力权重全相同".
NEAR_UNIFORM_ROW_ENTROPY = 0.99


def naive_softmax_fails(scaled: np.ndarray, allowed: np.ndarray | None) -> bool:
    """Whether seed 000's ``np.exp(s) / np.sum(np.exp(s), axis=1, keepdims=True)`` gives
    NaN or inf on ``scaled`` (T, S), its mask added the seed's way (``+ blocked * -1e9``).

    Rows with no allowed key are left out: they fail for another reason (0 / 0), which
    the ``fully_masked`` note covers.
    """
    scores = scaled if allowed is None else scaled + (~allowed) * -1e9  # (T, S)
    with np.errstate(all="ignore"):
        exps = np.exp(scores)  # (T, S)
        weights = exps / np.sum(exps, axis=1, keepdims=True)  # (T, S)
    rows = slice(None) if allowed is None else allowed.any(axis=-1)  # (T,)
    return not bool(np.isfinite(weights[rows]).all())


def head_notes(scaled: np.ndarray, weights: np.ndarray, allowed: np.ndarray | None,
               head: int | None) -> list[dict[str, Any]]:
    """Notes on one head: its scaled scores and weights (T, S), the allowed mask or None."""
    notes: list[dict[str, Any]] = []
    counts = np.full(weights.shape[0], weights.shape[1]) if allowed is None else \
        allowed.sum(axis=-1)  # (T,) keys each query may attend to
    choice = counts > 1  # a row with one key is one-hot by force, not by saturation
    top = weights.max(axis=-1)  # (T,)
    saturated = np.flatnonzero(choice & (top > SATURATED_WEIGHT))
    if saturated.size:
        finite = np.where(np.isfinite(scaled), scaled, np.nan)
        spread = float(np.nanmax(finite) - np.nanmin(finite))
        notes.append({"kind": "saturated", "head": head, "rows": saturated.tolist(),
                      "spread": spread})
    if naive_softmax_fails(scaled, allowed):
        notes.append({"kind": "naive_overflow", "head": head,
                      "max_score": float(np.max(np.abs(scaled)))})
    if choice.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(weights > 0, np.log(np.where(weights > 0, weights, 1.0)), 0.0)
        entropy = -(weights * logs).sum(axis=-1)  # (T,)
        normalised = entropy[choice] / np.log(counts[choice])
        if float(normalised.min()) > NEAR_UNIFORM_ROW_ENTROPY:
            notes.append({"kind": "near_uniform", "head": head,
                          "entropy": float(normalised.min())})
    return notes


def layer_notes(x: np.ndarray, allowed: np.ndarray | None, pos: str, tokens: list[str],
                scale: Any, drawn: list[str], toy_embeddings: bool) -> list[dict[str, Any]]:
    """Notes on the whole run: x (T, E) the attention's input, before any RoPE."""
    notes: list[dict[str, Any]] = []
    if drawn or toy_embeddings:
        # Under a causal mask no token sees a later one: the notes must not tell a
        # story (去了 → 学校) that the mask forbids.
        causal = allowed is not None and allowed.shape[-1] > 1 and not np.triu(
            allowed.reshape(-1, *allowed.shape[-2:]), 1).any()
        notes.append({"kind": "untrained", "head": None, "weights": drawn,
                      "toy_embeddings": toy_embeddings, "causal": bool(causal)})
    if pos == "none":
        groups: dict[bytes, list[int]] = {}
        for i, row in enumerate(x):
            groups.setdefault(row.tobytes(), []).append(i)
        for rows in groups.values():
            if len(rows) > 1:
                notes.append({"kind": "same_rows", "head": None, "rows": rows,
                              "tokens": [tokens[i] for i in rows]})
    if scale is not None and float(scale) == 1.0:
        notes.append({"kind": "scaling_off", "head": None})
    if allowed is not None:
        empty = np.flatnonzero(~allowed.any(axis=-1))
        if empty.size:
            notes.append({"kind": "fully_masked", "head": None, "rows": empty.tolist(),
                          "tokens": [tokens[i] for i in empty]})
    return notes
