"""``attnlab.torch.scaled_dot_product_attention(..., backend="triton")``: the torch layer's
call handed to :func:`attnlab.triton.flash_attention`.

The Triton kernels take what flash attention needs and no more: q (B, H, T, D),
k and v (B, Hkv, S, D), ``is_causal``, ``scale`` and a key-padding mask. So
the call is accepted when its ``mask`` is one: bool, True = may attend,
broadcastable to (B, 1, 1, S) (e.g. ``key_padding[:, None, None, :]``, the
usual way to pass padding to an sdpa). A general (T, S) mask, a ``bias``,
dropout and ``return_weights`` are refused by name: they belong to the default
backend.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import describe, shape_str
from ..errors import AttnlabError
from ..torch.checks import as_bool_tensor
from .flash import flash_attention

__all__ = ["sdpa_with_backend"]


def sdpa_with_backend(
    q: Any, k: Any, v: Any, mask: Any, *, bias: Any, is_causal: Any, dropout_p: Any,
    scale: Any, return_weights: Any, backend: Any,
) -> torch.Tensor:  # (B, H, T, D), (B, Hkv, S, D) x 2 -> (B, H, T, D)
    """The sdpa call for backend="triton" (attnlab.torch handles "torch" itself)."""
    if backend != "triton":
        raise AttnlabError(f"backend: expected 'triton' here, got {backend!r}")
    for name, value, unused in (("bias", bias, bias is None),
                                ("dropout_p", dropout_p, isinstance(dropout_p, (int, float))
                                 and dropout_p == 0),
                                ("return_weights", return_weights, return_weights is False)):
        if not unused:
            raise AttnlabError(
                f"{name}: backend='triton' computes attention without it; got {describe(value)} "
                f"(use backend='torch' for {name})"
            )
    key_padding = None
    if mask is not None:
        allowed = as_bool_tensor(mask, "mask")
        q_shape = tuple(getattr(q, "shape", ()))
        B, S = (q_shape[0] if len(q_shape) == 4 else 1), int(getattr(k, "shape", (0, 0))[-2])
        padded = (1,) * max(0, 4 - allowed.ndim) + tuple(allowed.shape)
        if len(padded) != 4 or padded[1:3] != (1, 1) or padded[0] not in (1, B) \
                or padded[3] not in (1, S):
            raise AttnlabError(
                f"mask: backend='triton' takes a key-padding mask only, bool broadcastable to "
                f"(B, 1, 1, S) = {shape_str((B, 1, 1, S))} (True = may attend), got "
                f"{shape_str(allowed.shape)}; use backend='torch' for other masks"
            )
        key_padding = allowed.reshape(padded).expand(B, 1, 1, S)[:, 0, 0, :]  # (B, S)
    return flash_attention(q, k, v, is_causal=is_causal, key_padding=key_padding, scale=scale)
