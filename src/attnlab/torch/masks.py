"""Boolean masks in PyTorch: causal and sliding-window, True = may attend.

Each behaves identically to its NumPy twin (:func:`attnlab.masks.causal_mask`,
:func:`attnlab.fast.sparse.sliding_window_mask`) and takes the same parameters,
plus ``device``. Queries are aligned bottom-right: query i sits at absolute
position ``S - T + i`` (``i`` when T == S), key j at position j.

Mask convention (the only one in attnlab): bool, **True = may attend**, as
``torch.nn.functional.scaled_dot_product_attention``'s bool ``attn_mask``
and the opposite of ``torch.nn.MultiheadAttention``'s (where True blocks).

Dimension legend: T query length, S key length, W window.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..checks import check_alloc, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError
from ..masks import window_band
from ..shapes import (
    Band,
    check_causal_alignment,
    check_positions,
    check_window,
    check_window_pair,
)
from .kernel import band_allowed, causal_allowed, window_allowed

__all__ = ["causal_mask", "sliding_window_mask", "window_mask"]


def causal_mask(
    T: int, S: int | None = None, *, causal_alignment: str = "bottom_right", device: Any = None
) -> torch.Tensor:  # -> (T, S)
    """Causal mask, True = may attend; behaves identically to :func:`attnlab.causal_mask`.

    ``causal_alignment="bottom_right"`` (the default): query i sits at absolute
    position S - T + i and may attend to keys j ≤ S - T + i. ``"top_left"``
    (torch's own ``is_causal``): keys j ≤ i. S defaults to T.

    >>> causal_mask(2, 4).int()
    tensor([[1, 1, 1, 0],
            [1, 1, 1, 1]], dtype=torch.int32)
    >>> causal_mask(2, 4, causal_alignment="top_left").int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0]], dtype=torch.int32)
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    alignment = check_causal_alignment(causal_alignment)
    check_alloc((T, S), torch.bool, "the causal mask (T, S)", sizes)
    if alignment == "top_left":
        return band_allowed(Band(None, 0, 0), T, S, device)  # (T, S)
    return causal_allowed(T, S, device)  # (T, S)


def window_mask(
    T: int, S: int | None = None, *, window: Any, is_causal: bool = False,
    causal_alignment: str = "bottom_right", device: Any = None,
) -> torch.Tensor:  # -> (T, S)
    """The mask of ``window`` (and ``is_causal``), True = may attend; behaves identically
    to :func:`attnlab.masks.window_mask`.

    ``window=(left, right)``: keys i' - left ≤ j ≤ i' + right (-1 = unbounded),
    query i at i' = S - T + i (bottom-right) or i (top-left); an int W keeps
    attnlab's meaning (causal: the W most recent keys; else W odd, centred).

    >>> window_mask(4, window=(1, 0)).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    T, S, band = window_band(T, S, window=window, is_causal=is_causal,
                             causal_alignment=causal_alignment, dtype=torch.bool)
    if band is None:
        return torch.ones((T, S), dtype=torch.bool, device=device)
    return band_allowed(band, T, S, device)  # (T, S)


def sliding_window_mask(
    T: int,
    window: Any,
    *,
    is_causal: bool,
    S: int | None = None,
    global_tokens: Any = None,
    causal_alignment: str = "bottom_right",
    device: Any = None,
) -> torch.Tensor:  # -> (T, S)
    """The sliding-window mask, True = may attend; behaves identically to
    :func:`attnlab.fast.sparse.sliding_window_mask`.

    Query i sits at position p = S - T + i (p = i when T == S, or with
    ``causal_alignment="top_left"``); key j at position j.

    - ``is_causal=True``: the W most recent keys, itself included: p - W < j ≤ p
      (what :class:`attnlab.torch.SlidingWindowKVCache` attends to).
    - ``is_causal=False``: W must be odd; the query and (W - 1) / 2 keys on each
      side: |j - p| ≤ (W - 1) / 2.
    - ``global_tokens``: key positions (a list of ints or a 1-D integer tensor)
      that every query attends to, and whose own query rows (if among the T
      queries) attend to every key; with ``is_causal`` both are still cut at j ≤ p.

    >>> sliding_window_mask(3, 2, is_causal=True).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [0, 1, 1]], dtype=torch.int32)
    >>> sliding_window_mask(4, 3, is_causal=False, global_tokens=[0]).int()
    tensor([[1, 1, 1, 1],
            [1, 1, 1, 0],
            [1, 1, 1, 1],
            [1, 0, 1, 1]], dtype=torch.int32)
    """
    T = check_positive_int(T, "T", allow_zero=True)
    sizes = "T" if S is None else "T, S"  # the arguments to blame for a huge mask
    S = T if S is None else check_positive_int(S, "S", allow_zero=True)
    is_causal = check_flag(is_causal, "is_causal")
    W: int | tuple[int, int]
    if isinstance(window, tuple | list):  # FlashAttention's (left, right), -1 = unbounded
        pair = check_window_pair(window, is_causal)
        assert pair is not None
        W = (T + S if pair[0] is None else pair[0], T + S if pair[1] is None else pair[1])
    else:
        W = check_window(window, is_causal)
    global_pos = check_positions(_position_list(global_tokens), "global_tokens", S)
    check_alloc((T, S), torch.bool, "the sliding-window mask (T, S)", sizes)
    offset = S - T if check_causal_alignment(causal_alignment) == "bottom_right" else 0
    query_pos = torch.arange(T, device=device) + offset  # (T,)
    key_pos = torch.arange(S, device=device)  # (S,)
    return window_allowed(query_pos, key_pos, W, is_causal, global_pos)  # (T, S)


def _position_list(positions: Any) -> list[int]:
    """``global_tokens`` as a list of ints: None, a sequence of ints or a 1-D int tensor."""
    if positions is None:
        return []
    if isinstance(positions, torch.Tensor):
        if positions.ndim != 1 or (positions.numel() and (
                positions.is_floating_point() or positions.is_complex()
                or positions.dtype == torch.bool)):
            raise AttnlabError(
                "global_tokens: expected a 1-D list of integer key positions, got "
                f"{positions.dtype} {shape_str(positions.shape)}"
            )
        return [int(p) for p in positions.tolist()]
    try:
        values = list(positions)
    except TypeError:
        raise AttnlabError(
            "global_tokens: expected a 1-D list of integer key positions, got "
            f"{type(positions).__name__}"
        ) from None
    for p in values:
        if isinstance(p, bool) or not isinstance(p, numbers.Integral):
            raise AttnlabError(
                "global_tokens: expected a 1-D list of integer key positions, got an element "
                f"of type {type(p).__name__}"
            )
    return [int(p) for p in values]
