"""Grouped-query attention's head bookkeeping, once for the whole library.

With GQA (and multi-query attention, Hkv = 1) H query heads share Hkv key/value
heads: query head h reads key/value head h // G, with G = H / Hkv the group size.
Every path that runs GQA by expanding the key/value heads does it with
:func:`repeat_kv`, and every backward sums the expanded heads' gradients back with
:func:`gqa_reduce`, its adjoint::

    repeat_kv(kv, G)[..., h, :, :]   == kv[..., h // G, :, :]      (torch's repeat_interleave)
    gqa_reduce(grad, G)[..., j, :, :] == grad[..., j*G:(j+1)*G, :, :].sum(-3)

:func:`check_gqa_heads` holds the shape rule and its messages; it reads shapes
only, so the torch twin (:mod:`attnlab.torch.gqa`, which behaves identically to
this module) raises the same errors.

Dimension legend: B batch, H query heads, Hkv key/value heads, G = H / Hkv, T query
length, S key length, D head dim, Dv value dim. ``...`` is any number of leading dims.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .checks import shape_str
from .errors import ShapeError

__all__ = ["check_gqa_heads", "gqa_reduce", "repeat_kv"]


def check_gqa_heads(q_shape: Sequence[int], k_shape: Sequence[int],
                    v_shape: Sequence[int]) -> int:
    """The group size G = H / Hkv of q (..., H, T, D), k (..., Hkv, S, D), v (..., Hkv, S, Dv)
    (``enable_gqa=True``); raises :class:`attnlab.ShapeError` naming the argument."""
    for name, shape, layout in (("q", q_shape, "(..., H, T, D)"),
                                ("k", k_shape, "(..., Hkv, S, D)"),
                                ("v", v_shape, "(..., Hkv, S, Dv)")):
        if len(shape) < 3:
            raise ShapeError(f"{name}: expected {layout} with enable_gqa=True, "
                             f"got {shape_str(shape)}")
    H, Hkv = q_shape[-3], k_shape[-3]
    if v_shape[-3] != Hkv:
        raise ShapeError(
            f"v: expected (..., {Hkv}, S, Dv) with k's {Hkv} key/value heads (enable_gqa=True), "
            f"got {shape_str(v_shape)}"
        )
    if Hkv == 0 or H % Hkv:
        raise ShapeError(
            f"k: expected a number of key/value heads Hkv that divides q's H = {H} heads "
            f"(enable_gqa=True), got Hkv = {Hkv} in k {shape_str(k_shape)}"
        )
    return int(H // Hkv)


def repeat_kv(kv: np.ndarray, groups: int) -> np.ndarray:  # (..., Hkv, S, ·) -> (..., H, S, ·)
    """Each key/value head repeated ``groups`` = H / Hkv times along the head axis (-3), so
    that query head h reads key/value head h // groups; ``kv`` itself when groups is 1."""
    if groups == 1:
        return kv
    return np.repeat(kv, groups, axis=-3)  # (..., Hkv*G, S, ·)


def gqa_reduce(grad: np.ndarray, groups: int) -> np.ndarray:  # (..., H, S, ·) -> (..., Hkv, S, ·)
    """The adjoint of :func:`repeat_kv`: a gradient of repeated key/value heads summed over
    each group of ``groups`` query heads; ``grad`` itself when groups is 1."""
    if groups == 1:
        return grad
    *lead, H, S, width = grad.shape
    return grad.reshape(*lead, H // groups, groups, S, width).sum(axis=-3)  # (..., Hkv, S, ·)
