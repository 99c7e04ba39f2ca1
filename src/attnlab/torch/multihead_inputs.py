"""Checking the inputs of multi-head attention (torch), before any math.

:meth:`attnlab.torch.MultiHeadAttention.check_inputs` is :func:`check_multihead_inputs`
with the module's sizes; :class:`MultiHeadInputs` carries the checked tensors to
:meth:`~attnlab.torch.MultiHeadAttention.forward_checked` (and to
``SelfAttentionLayer``, which checks once for its whole block). The shape rules and
their messages are the NumPy core's (:func:`attnlab.shapes.check_module_inputs`).

Dimension legend: B batch, H heads, T query length, S key length, E model width
(Ekv: width of the keys' input, Ev: of the values'). Mask convention: ``mask`` is
bool, **True = may attend**; ``key_padding`` True = a real token; additive values
go through ``bias``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..checks import check_broadcastable, check_flag
from ..errors import AttnlabError
from ..shapes import check_key_padding_shape, check_module_inputs
from . import debug
from .checks import as_bool_tensor, check_same_device, module_input

__all__ = ["MultiHeadInputs", "check_multihead_inputs"]


class MultiHeadInputs(NamedTuple):
    """Inputs of multi-head attention after :meth:`MultiHeadAttention.check_inputs`
    (no math done yet)."""

    query: torch.Tensor  # (B, T, E) or (T, E)
    key: torch.Tensor  # (B, S, Ekv) or (S, Ekv)
    value: torch.Tensor  # (B, S, Ekv) or (S, Ekv)
    allowed: torch.Tensor | None  # bool, broadcastable to (B, H, T, S), without causal
    bias: torch.Tensor | None  # float, broadcastable to (B, H, T, S)
    is_causal: bool



def check_multihead_inputs(
    query: Any,
    key: Any,
    value: Any,
    mask: Any,
    key_padding: Any,
    bias: Any,
    is_causal: Any,
    *,
    like: torch.Tensor,
    num_heads: int,
    d_model: int,
    d_context: int,
    d_value_context: int,
    batch_first: bool,
    rope: bool,
    names: tuple[str, str, str] = ("query", "key", "value"),
) -> MultiHeadInputs:
    """Every check of multi-head attention's call, before any math; ``names`` are the
    arguments', ``like`` a parameter of the module (its dtype and device), the sizes the
    module's (E = ``d_model``, Ekv = ``d_context``, Ev = ``d_value_context``).

    Shapes: query (B, T, E) or (T, E), key (B, S, Ekv), value (B, S, Ev) ((T, B, ·)
    when not ``batch_first``); mask and bias broadcastable to (B, H, T, S);
    key_padding (B, S). Inputs come back batch-first whatever ``batch_first`` says.
    Shapes, dtypes and devices always; values only under
    :func:`attnlab.torch.debug_checks`.
    """
    q_name, k_name, v_name = names
    q_in = module_input(query, q_name, like)
    k_in = module_input(key, k_name, like)
    v_in = module_input(value, v_name, like)
    if not batch_first:  # (T, B, E) -> (B, T, E); unbatched (T, E) is the same
        q_in, k_in, v_in = (t.transpose(0, 1) if t.ndim == 3 else t
                            for t in (q_in, k_in, v_in))
    lead, T, S = check_module_inputs(q_in.shape, k_in.shape, v_in.shape, d_model,
                                     d_context, names, Ev=d_value_context)
    score_shape = (*lead, num_heads, T, S)
    score_layout = "(B, H, T, S)" if lead else "(H, T, S)"
    is_causal = check_flag(is_causal, "is_causal")
    allowed: torch.Tensor | None = None
    if mask is not None:
        allowed = as_bool_tensor(mask, "mask")
        check_broadcastable(allowed.shape, score_shape, "mask", score_layout)
        check_same_device(like, "the module", allowed, "mask")
    if key_padding is not None:
        is_tensor = isinstance(key_padding, torch.Tensor)
        check_key_padding_shape(
            key_padding.shape if is_tensor else None,
            str(key_padding.dtype) if is_tensor else type(key_padding).__name__,
            is_tensor and key_padding.dtype == torch.bool, (*lead, S),
        )
        check_same_device(like, "the module", key_padding, "key_padding")
        padding = key_padding[..., None, None, :]  # (B, 1, 1, S)
        allowed = padding if allowed is None else (allowed & padding)  # (B, H, T, S)
    bias_t: torch.Tensor | None = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise AttnlabError(
                f"bias: expected a float tensor, got "
                f"{bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__}"
            )
        check_broadcastable(bias.shape, score_shape, "bias", score_layout)
        check_same_device(like, "the module", bias, "bias")
        bias_t = bias.to(like.dtype)
    if rope and T > S:
        raise AttnlabError(
            f"{q_name}: RoPE places queries at positions S - T .. S - 1, expected T <= S, "
            f"got T = {T}, S = {S}"
        )
    if debug.debug_checks_enabled():
        if bias is not None:
            debug.check_bias_values(bias)
        named = [(q_name, q_in)]
        named += [(n, t) for n, t in ((k_name, k_in), (v_name, v_in)) if t is not q_in]
        debug.check_finite(named)
    return MultiHeadInputs(q_in, k_in, v_in, allowed, bias_t, is_causal)
