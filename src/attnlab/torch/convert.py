"""Moving parameters between the NumPy core, attnlab.torch and ``torch.nn.MultiheadAttention``.

The NumPy core stores projections (in, out) and applies ``X @ W``; ``nn.Linear``
and ``nn.MultiheadAttention`` store (out, in): ``W_numpy = weight.T``.

================================  =====================================================
``from_numpy(obj)``               NumPy object -> its attnlab.torch module
``to_numpy(module)``              attnlab.torch module -> its NumPy object
``to_torch_multihead(mha)``       attnlab.torch.MultiHeadAttention -> nn.MultiheadAttention
``from_torch_multihead(module)``  nn.MultiheadAttention -> attnlab.torch.MultiHeadAttention
================================  =====================================================

Dimension legend: H heads, D head dim, E model width, Ekv width of keys/values.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..errors import AttnlabError
from ..nn import layers as np_layers
from ..nn import multihead as np_multihead
from ..positional import SinusoidalPositionalEncoding
from .layers import LayerNorm, SelfAttentionLayer
from .multihead import MultiHeadAttention
from .positional import PositionalEncoding

__all__ = ["from_numpy", "to_numpy", "to_torch_multihead", "from_torch_multihead"]

_TWINS: tuple[tuple[type, Any], ...] = (
    (np_multihead.MultiHeadAttention, MultiHeadAttention),
    (np_layers.LayerNorm, LayerNorm),
    (SinusoidalPositionalEncoding, PositionalEncoding),
)


def from_numpy(obj: Any, *, device: Any = None) -> nn.Module:
    """The attnlab.torch module with the parameters of a NumPy core object.

    Accepts ``attnlab.MultiHeadAttention``, ``attnlab.SelfAttentionLayer``,
    ``attnlab.LayerNorm`` and ``attnlab.positional.SinusoidalPositionalEncoding``.
    Parameters keep their NumPy dtype (float64 stays float64).

    >>> import attnlab
    >>> from_numpy(attnlab.MultiHeadAttention.init(2, 8)).q_proj.weight.dtype
    torch.float64
    """
    if type(obj) is np_layers.SelfAttentionLayer:
        return SelfAttentionLayer.from_numpy(obj, device=device)
    for numpy_type, torch_type in _TWINS:
        if isinstance(obj, numpy_type):
            return torch_type.from_numpy(obj, device=device)
    raise AttnlabError(
        "obj: expected an attnlab MultiHeadAttention, SelfAttentionLayer, LayerNorm or "
        f"SinusoidalPositionalEncoding, got {type(obj).__name__}"
    )


def to_numpy(module: nn.Module) -> Any:
    """The NumPy core object with the parameters of an attnlab.torch module."""
    if not isinstance(
        module, (MultiHeadAttention, SelfAttentionLayer, LayerNorm, PositionalEncoding)
    ):
        raise AttnlabError(
            "module: expected an attnlab.torch MultiHeadAttention, SelfAttentionLayer, "
            f"LayerNorm or PositionalEncoding, got {type(module).__name__}"
        )
    return module.to_numpy()


def to_torch_multihead(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` computing the same thing as ``mha``, in its layout
    (``batch_first``).

    Possible only for what that class can express: Hkv = H, Dv = D, H * D = E,
    output width E, all four biases or none, no RoPE or ALiBi. ``add_bias_kv``,
    ``add_zero_attn``, ``batch_first`` and the key/value widths carry over. Remember its masks
    are the other way round: ``attn_mask=~mask``, ``key_padding_mask=~key_padding``.
    """
    if not isinstance(mha, MultiHeadAttention):
        raise AttnlabError(
            f"mha: expected an attnlab.torch.MultiHeadAttention, got {type(mha).__name__}"
        )
    E, H = mha.d_model, mha.num_heads
    problems = []
    if mha.num_kv_heads != H:
        problems.append(f"num_kv_heads = {mha.num_kv_heads} (GQA)")
    D, Dv = mha.head_dim, mha.value_head_dim
    if Dv != D or H * D != E:
        problems.append(f"head dims D = {D}, Dv = {Dv} with H = {H}, E = {E}")
    if mha.d_out != E:
        problems.append(f"d_out = {mha.d_out}")
    if mha.rope or mha.alibi:
        problems.append("rope/alibi")
    if mha.scale is not None:
        problems.append(f"scale = {mha.scale:g} (nn.MultiheadAttention scales by 1/√D)")
    linears = (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj)
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        problems.append("biases on some projections only")
    if problems:
        raise AttnlabError(
            "mha: expected Hkv = H, Dv = D, H*D = E = d_out, all biases or none, no "
            "RoPE/ALiBi and the default scale (what nn.MultiheadAttention can express), "
            f"got {'; '.join(problems)}"
        )
    weight = mha.q_proj.weight
    target = nn.MultiheadAttention(
        E, H, dropout=mha.dropout, bias=all(has_bias), kdim=mha.d_context,
        vdim=mha.d_value_context, batch_first=mha.batch_first,
        add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn,
        device=weight.device, dtype=weight.dtype,
    )
    with torch.no_grad():
        if target._qkv_same_embed_dim:
            target.in_proj_weight.copy_(
                torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight])
            )  # (3E, E)
        else:
            target.q_proj_weight.copy_(mha.q_proj.weight)  # (E, E)
            target.k_proj_weight.copy_(mha.k_proj.weight)  # (E, Ekv)
            target.v_proj_weight.copy_(mha.v_proj.weight)  # (E, Ekv)
        target.out_proj.weight.copy_(mha.out_proj.weight)
        if all(has_bias):
            target.in_proj_bias.copy_(
                torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias])
            )  # (3E,)
            target.out_proj.bias.copy_(mha.out_proj.bias)
        if mha.bias_k is not None and mha.bias_v is not None:
            # (1, 1, E), torch's layout
            cast(torch.Tensor, target.bias_k).copy_(mha.bias_k.view(1, 1, E))
            cast(torch.Tensor, target.bias_v).copy_(mha.bias_v.view(1, 1, E))
    return target.train(mha.training)


def from_torch_multihead(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """An attnlab.torch.MultiHeadAttention with the parameters of ``module``.

    Everything carries over: the layout (``batch_first``, torch's default False
    reads (T, B, E)), ``kdim`` / ``vdim`` (``d_context`` / ``d_value_context``),
    ``add_bias_kv``, ``add_zero_attn``, dropout and the train/eval mode. The masks keep
    attnlab's meaning (True = may attend) and the call attnlab's form (keyword-only
    masks, per-head weights unless ``average_attn_weights=True``); for torch's own
    forward use :class:`attnlab.torch.compat.MultiheadAttention`.
    """
    if not isinstance(module, nn.MultiheadAttention):
        raise AttnlabError(
            f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}"
        )
    weight = module.out_proj.weight
    mha = MultiHeadAttention(
        module.num_heads, module.embed_dim, dropout=module.dropout, d_context=module.kdim,
        d_value_context=module.vdim, use_bias=module.in_proj_bias is not None,
        batch_first=module.batch_first, add_bias_kv=module.bias_k is not None,
        add_zero_attn=module.add_zero_attn, device=weight.device, dtype=weight.dtype,
    )
    mha.load_state_dict(module.state_dict())  # torch's layout is read by a load hook
    return mha.train(module.training)
