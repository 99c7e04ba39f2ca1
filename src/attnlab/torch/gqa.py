"""Grouped-query attention's head expansion in torch: behaves identically to :mod:`attnlab.gqa`.

:func:`repeat_kv` gives query head h the key/value head h // G (G = H / Hkv), as
``repeat_interleave`` along the head axis; :func:`gqa_reduce` sums a gradient of the
repeated heads back (autograd does it for :func:`repeat_kv`'s output; explicit
backwards call it). The shape rule and its messages are the NumPy module's
:func:`attnlab.gqa.check_gqa_heads`, re-exported here.

Dimension legend: H query heads, Hkv key/value heads, G = H / Hkv, S key length.
"""

from __future__ import annotations

import torch

from ..gqa import check_gqa_heads

__all__ = ["check_gqa_heads", "gqa_reduce", "repeat_kv"]


def repeat_kv(kv: torch.Tensor, groups: int) -> torch.Tensor:  # (..., Hkv, S, ·) -> (..., H, S, ·)
    """Each key/value head repeated ``groups`` = H / Hkv times along the head axis (-3), so
    that query head h reads key/value head h // groups; ``kv`` itself when groups is 1."""
    if groups == 1:
        return kv
    return kv.repeat_interleave(groups, dim=-3)  # (..., Hkv*G, S, ·)


def gqa_reduce(grad: torch.Tensor, groups: int) -> torch.Tensor:  # (.., H, S, ·) -> (.., Hkv, S, ·)
    """The adjoint of :func:`repeat_kv`: a gradient of repeated key/value heads summed over
    each group of ``groups`` query heads; ``grad`` itself when groups is 1."""
    if groups == 1:
        return grad
    *lead, H, S, width = grad.shape
    return grad.reshape(*lead, H // groups, groups, S, width).sum(dim=-3)  # (..., Hkv, S, ·)
