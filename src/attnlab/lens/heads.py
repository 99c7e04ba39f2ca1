"""Head detectors: how much of a head's attention follows a known pattern.

The definitions of TransformerLens's ``detect_head`` (the default "mul" measure),
for any weights ``(L, H, T, S)`` with T == S (self-attention) and the tokens they
were computed on::

    score(head) = Σ_ij A_ij · P_ij / Σ_ij A_ij

where A is the head's (T, T) attention (with column 0 set to 0 when
``exclude_bos``, and the diagonal set to 0 when ``exclude_current_token``, in both
sums) and P the 0/1 detection pattern:

``previous_token``
    P_ij = 1 when j = i - 1.
``duplicate_token``
    P_ij = 1 when j < i and token_j = token_i (an earlier copy of the current token).
``induction``
    the duplicate-token pattern shifted one key to the right: P_ij = 1 when
    1 <= j <= i and token_{j-1} = token_i (the token *after* an earlier copy of the
    current one). On ``BOS x x`` with x of length n this is the stripe j = i - n + 1.

The score is the share of the head's attention that lands where the pattern says:
1 for a head that follows it exactly, 0 for one that never does. For a batch of
sequences (weights ``(B, L, H, T, T)``, tokens ``(B, T)``) it is the mean of the
per-sequence scores, as TransformerLens does for a list of prompts. A head whose
attention is all excluded (e.g. one that only looks at BOS, with ``exclude_bos``)
scores 0: none of its remaining attention follows the pattern.

Dimension legend: B batch, L layers, H heads, T query length, S key length.

>>> import numpy as np
>>> w = np.eye(4)[[0, 0, 1, 2]][None, None]     # every query looks at the previous key
>>> head_scores(w, [5, 6, 7, 8], "previous_token").tolist()
[[0.75]]
>>> head_scores(w, [5, 6, 7, 8], "previous_token", exclude_bos=True).tolist()
[[1.0]]
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ..checks import as_float_array, shape_str
from ..errors import AttnlabError, ShapeError

__all__ = [
    "DETECTORS",
    "Detector",
    "previous_token_pattern",
    "duplicate_token_pattern",
    "induction_pattern",
    "detection_pattern",
    "head_scores",
    "all_head_scores",
]

Detector = Literal["previous_token", "duplicate_token", "induction"]
DETECTORS: tuple[Detector, ...] = ("previous_token", "duplicate_token", "induction")


def previous_token_pattern(T: int) -> np.ndarray:  # -> (T, T)
    """Ones on the diagonal below the main one: query i looks at key i - 1."""
    return np.eye(T, k=-1)


def duplicate_token_pattern(tokens: Any) -> np.ndarray:  # (T,) -> (T, T)
    """P_ij = 1 when j < i and tokens[j] == tokens[i] (tokens: ids or strings)."""
    ids = _token_ids(tokens, False)[0]  # (T,)
    return np.tril(ids[:, None] == ids[None, :], k=-1).astype(np.float64)  # (T, T)


def induction_pattern(tokens: Any) -> np.ndarray:  # (T,) -> (T, T)
    """The duplicate-token pattern shifted right by one key (column 0 stays 0)."""
    duplicate = duplicate_token_pattern(tokens)  # (T, T)
    shifted = np.zeros_like(duplicate)
    shifted[:, 1:] = duplicate[:, :-1]  # (T, T); j <= i holds since duplicate has j < i
    return shifted


def detection_pattern(detector: str, tokens: Any) -> np.ndarray:  # (T,) -> (T, T)
    """The (T, T) pattern of ``detector`` (one of :data:`DETECTORS`) on ``tokens``."""
    _check_detector(detector)
    if detector == "previous_token":
        return previous_token_pattern(_token_ids(tokens, False).shape[1])
    if detector == "duplicate_token":
        return duplicate_token_pattern(tokens)
    return induction_pattern(tokens)


def head_scores(
    weights: Any,
    tokens: Any,
    detector: str,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
) -> np.ndarray:
    """The detector's score of every head; see the module doc for the definition.

    Shapes:
        weights  (L, H, T, T) with tokens (T,), or (B, L, H, T, T) with tokens (B, T)
        ->       (L, H) float64 scores in [0, 1] (the mean over B for a batch)
    """
    _check_detector(detector)
    return _scores(weights, tokens, (detector,), exclude_bos, exclude_current_token)[detector]


def all_head_scores(
    weights: Any, tokens: Any, *, exclude_bos: bool = False, exclude_current_token: bool = False
) -> dict[str, np.ndarray]:
    """:func:`head_scores` of every detector, checking and reading the weights once:
    {name: (L, H)}."""
    return _scores(weights, tokens, DETECTORS, exclude_bos, exclude_current_token)


def _scores(
    weights: Any, tokens: Any, detectors: tuple[str, ...], exclude_bos: bool,
    exclude_current_token: bool,
) -> dict[str, np.ndarray]:
    w = as_float_array(weights, "weights")
    if w.ndim not in (4, 5) or w.shape[-1] != w.shape[-2]:
        raise ShapeError(
            f"weights: expected (L, H, T, T) or (B, L, H, T, T) self-attention weights, "
            f"got {shape_str(w.shape)}"
        )
    batched = w.ndim == 5
    w = w if batched else w[None]  # (B, L, H, T, T)
    B, T = w.shape[0], w.shape[-1]
    if T < 2:
        raise ShapeError(f"weights: expected T >= 2 (no pattern fits one token), got T = {T}")
    if (w < 0).any():
        raise AttnlabError("weights: expected attention weights >= 0, got negative values")
    ids = _token_ids(tokens, batched)  # (B, T)
    if ids.shape != (B, T):
        rows = f" in each of B = {B} rows" if batched else ""
        raise ShapeError(f"tokens: expected T = {T} tokens{rows} for weights "
                         f"{shape_str(w.shape if batched else w.shape[1:])}, got shape "
                         f"{shape_str(ids.shape if batched else ids.shape[1:])}")
    kept = w.copy() if exclude_bos or exclude_current_token else w  # (B, L, H, T, T)
    if exclude_bos:
        kept[..., :, 0] = 0.0
    if exclude_current_token:
        diagonal = np.arange(T)
        kept[..., diagonal, diagonal] = 0.0
    total = kept.sum(axis=(-2, -1), dtype=np.float64)  # (B, L, H)
    safe_total = np.where(total > 0, total, 1.0)
    duplicate = np.tril(ids[:, :, None] == ids[:, None, :], k=-1)  # (B, T, T)
    out = {}
    for name in detectors:
        if name == "previous_token":
            matched = np.diagonal(kept, offset=-1, axis1=-2, axis2=-1).sum(-1, dtype=np.float64)
        else:
            pattern = duplicate
            if name == "induction":
                pattern = np.zeros_like(duplicate)
                pattern[:, :, 1:] = duplicate[:, :, :-1]  # one key to the right
            matched = np.einsum("blhij,bij->blh", kept, pattern.astype(kept.dtype),
                                dtype=np.float64)  # (B, L, H)
        scores = np.where(total > 0, matched / safe_total, 0.0)  # (B, L, H)
        out[name] = scores.mean(axis=0)  # (L, H)
    return out


def _check_detector(detector: Any) -> None:
    if detector not in DETECTORS:
        raise AttnlabError(f"detector: expected one of {', '.join(DETECTORS)}, got {detector!r}")


def _token_ids(tokens: Any, batched: bool) -> np.ndarray:  # -> (B, T)
    """Tokens as an array whose equality is the tokens' equality (ids or strings)."""
    if tokens is None or isinstance(tokens, (str, bytes)):
        raise AttnlabError(f"tokens: expected a sequence of token ids or strings, got "
                           f"{tokens!r}")
    try:
        ids = np.asarray(tokens)
    except ValueError:  # ragged rows
        raise ShapeError("tokens: expected rows of equal length T") from None
    if ids.ndim != (2 if batched else 1):
        raise ShapeError(f"tokens: expected shape {'(B, T)' if batched else '(T,)'}, got "
                         f"{shape_str(ids.shape)}")
    return ids if batched else ids[None]
