"""Checks of attention weights and their labels, before any diagnosis or drawing.

Shared by :mod:`attnlab.lens.diagnostics` and the viewer (:mod:`attnlab.report.viewer`):
weights ``(L, H, T, S)`` in [0, 1], their query and key labels, padding, masks and
special keys. Each raises naming the argument, what was expected and what was received.
Masks follow attnlab's one convention: bool, **True = may attend / is a real token**.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..checks import as_bool_mask, as_float_array, check_broadcastable, shape_str
from ..errors import AttnlabError, ShapeError

__all__ = ["WEIGHT_TOL", "check_labels", "check_mask", "check_padding", "check_rows",
           "check_specials", "check_weights"]

WEIGHT_TOL = 1e-3
"""Tolerance on row sums and on weight outside the mask: float16 weights (relative
error 2**-11 per entry) sum to 1 within 5e-4, whatever S is."""


def check_weights(weights: Any) -> np.ndarray:
    """Attention weights as a float (L, H, T, S) array ((H, T, S) gets L = 1), values in
    [0, 1] within :data:`WEIGHT_TOL`; raises naming ``weights`` otherwise."""
    w = as_float_array(weights, "weights")
    if w.ndim == 3:
        w = w[None]  # (1, H, T, S)
    if w.ndim != 4:
        raise ShapeError(
            f"weights: expected (L, H, T, S) or (H, T, S), got {shape_str(w.shape)}"
        )
    if 0 in w.shape:
        raise ShapeError(
            f"weights: expected L, H, T and S all >= 1, got (L, H, T, S) = {shape_str(w.shape)}"
        )
    low, high = float(w.min()), float(w.max())
    if low < -WEIGHT_TOL or high > 1 + WEIGHT_TOL:
        raise AttnlabError(
            f"weights: expected attention weights in [0, 1], got min {low:.4g} and max "
            f"{high:.4g} (raw scores? apply softmax first)"
        )
    return w


def check_labels(tokens: Any, name: str, size: int, dim: str) -> list[str] | None:
    """``size`` labels as strings (None stays None); a bare string is refused, not split."""
    if tokens is None:
        return None
    if isinstance(tokens, (str, bytes)):
        raise AttnlabError(f"{name}: expected a list of {size} strings ({dim}), got one string")
    items = [str(t) for t in tokens]
    if len(items) != size:
        raise AttnlabError(f"{name}: expected {size} labels ({dim} = {size}), got {len(items)}")
    return items


def _bool_vector(value: Any, name: str, size: int, dim: str) -> np.ndarray:
    arr = as_bool_mask(value, name)
    if arr.shape != (size,):
        raise ShapeError(
            f"{name}: expected bool ({dim},) = ({size},) (True = real token), "
            f"got {shape_str(arr.shape)}"
        )
    return arr


def check_padding(
    key_padding: Any, query_padding: Any, valid_length: Any, T: int, S: int
) -> tuple[np.ndarray, np.ndarray]:
    """(real keys (S,), real queries (T,)) from bool paddings or a right-padding length."""
    if valid_length is not None:
        if key_padding is not None or query_padding is not None:
            raise AttnlabError(
                "valid_length: expected either valid_length or key_padding/query_padding, "
                "got both"
            )
        if isinstance(valid_length, bool) or not isinstance(valid_length, (int, np.integer)) \
                or not 1 <= valid_length <= S:
            raise AttnlabError(f"valid_length: expected an int in [1, S = {S}], got "
                               f"{valid_length!r}")
        key_valid = np.arange(S) < valid_length  # (S,)
        query_valid = np.arange(T) < valid_length if T == S else np.ones(T, dtype=bool)
        return key_valid, query_valid
    key_valid = np.ones(S, dtype=bool) if key_padding is None else _bool_vector(
        key_padding, "key_padding", S, "S")
    if query_padding is not None:
        query_valid = _bool_vector(query_padding, "query_padding", T, "T")
    elif key_padding is not None and T == S:
        query_valid = key_valid
    else:
        query_valid = np.ones(T, dtype=bool)
    return key_valid, query_valid


def check_mask(mask: Any, T: int, S: int) -> np.ndarray:
    """A bool mask broadcastable to (T, S), True = may attend, as a (T, S) view."""
    arr = as_bool_mask(mask, "mask")
    check_broadcastable(arr.shape, (T, S), "mask", "(T, S)")
    return np.broadcast_to(arr, (T, S))


def check_specials(indices: Any, keys: list[str] | None, S: int,
                   special_tokens: Sequence[str]) -> list[int]:
    """Sorted key indices of the special keys: ``indices`` checked, or by default the keys
    whose label is one of ``special_tokens`` (none without labels)."""
    if indices is None:
        if keys is None:
            return []
        return [j for j, token in enumerate(keys) if token in special_tokens]
    if isinstance(indices, (str, bytes)):
        raise AttnlabError(f"special_indices: expected a list of key indices, got {indices!r}")
    found = []
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) \
                or not 0 <= index < S:
            raise AttnlabError(
                f"special_indices: expected key indices in [0, S = {S}), got {index!r}"
            )
        found.append(int(index))
    return sorted(set(found))


def check_rows(
    w: np.ndarray, row_sums: np.ndarray, candidate: np.ndarray, allowed: np.ndarray
) -> None:
    """Real rows must sum to 1 (or 0) and put ~0 weight where they may not attend."""
    outside = np.where(candidate[:, None] & ~allowed, w, 0.0).sum(axis=-1)  # (L, H, T)
    if outside.max() > WEIGHT_TOL:
        where = tuple(int(i) for i in np.unravel_index(outside.argmax(), outside.shape))
        raise AttnlabError(
            f"weights: expected ~0 weight on keys that mask/key_padding exclude, got "
            f"{outside.max():.4g} in total at (layer, head, query) = {where}; the mask "
            "given here is not the one the weights were computed with"
        )
    bad = candidate & (np.abs(row_sums - 1.0) > WEIGHT_TOL) & (row_sums > WEIGHT_TOL)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AttnlabError(
            f"weights: expected rows that sum to 1 (or 0 for a fully masked row), got "
            f"{int(bad.sum())} that do not (first: (layer, head, query) = {where}, sum "
            f"{float(row_sums[where]):.6g})"
        )
