"""MultiHeadAttention's parameters in other layouts: the NumPy core's and torch's own.

- :func:`multihead_from_numpy` / :func:`multihead_to_numpy`: the bodies of
  :meth:`attnlab.torch.MultiHeadAttention.from_numpy` and ``to_numpy``; the NumPy
  core stores projections (in, out) and applies ``X @ W``, ``nn.Linear`` stores
  (out, in): ``W_numpy = linear.weight.T``.
- :func:`from_torch_layout`: the load-state-dict hook by which an
  ``nn.MultiheadAttention`` state_dict (``in_proj_weight``, ``bias_k``, ...) loads
  into the module.

The module is passed in (typed ``Any``: this file sits below the class it serves).

Dimension legend: H heads, Hkv key/value heads, D head dim, Dv value head dim,
E model width, Ekv width of keys/values.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import AttnlabError
from ..nn import multihead as np_multihead
from .params import to_array, to_optional_array, to_param, torch_dtype

__all__ = ["from_torch_layout", "multihead_from_numpy", "multihead_to_numpy"]


def multihead_from_numpy(
    cls: Any, mha: np_multihead.MultiHeadAttention, *, dropout: float = 0.0,
    device: Any = None, dtype: Any = None,
) -> Any:
    """A ``cls`` (attnlab.torch.MultiHeadAttention) with the parameters of a NumPy
    :class:`attnlab.MultiHeadAttention`; see ``MultiHeadAttention.from_numpy``."""
    if not isinstance(mha, np_multihead.MultiHeadAttention):
        raise AttnlabError(
            f"mha: expected an attnlab.MultiHeadAttention, got {type(mha).__name__}"
        )
    params = mha.parameters()
    dtype = dtype or torch_dtype(*params.values())
    module = cls(
        mha.num_heads, mha.Wq.shape[0], dropout=dropout,
        num_kv_heads=mha.num_kv_heads, head_dim=mha.head_dim,
        value_head_dim=mha.value_head_dim, d_context=mha.Wk.shape[0],
        d_value_context=mha.Wv.shape[0],
        d_out=mha.Wo.shape[1], device=device, dtype=dtype,
        rope=mha.rope is not None, alibi=mha.alibi, scale=mha.scale,
        rope_base=mha.rope.base if mha.rope is not None else 10000.0,
        rope_interleaved=mha.rope.interleaved if mha.rope is not None else False,
    )
    with torch.no_grad():
        for linear, w_name, b_name in (
            (module.q_proj, "Wq", "bq"), (module.k_proj, "Wk", "bk"),
            (module.v_proj, "Wv", "bv"), (module.out_proj, "Wo", "bo"),
        ):
            linear.weight.copy_(to_param(params[w_name], transpose=True, like=linear.weight))
            if b_name in params:
                linear.bias.copy_(to_param(params[b_name], transpose=False, like=linear.bias))
            else:
                linear.register_parameter("bias", None)
    return module


def multihead_to_numpy(module: Any) -> np_multihead.MultiHeadAttention:
    """The NumPy :class:`attnlab.MultiHeadAttention` with the parameters of ``module`` (an
    attnlab.torch.MultiHeadAttention); see ``MultiHeadAttention.to_numpy``."""
    from ..positional_relative import RotaryEmbedding

    if module.bias_k is not None or module.add_zero_attn:
        raise AttnlabError(
            "module: expected add_bias_kv=False and add_zero_attn=False (the NumPy "
            "MultiHeadAttention has neither), got "
            f"add_bias_kv={module.bias_k is not None}, add_zero_attn={module.add_zero_attn}"
        )

    rope = (RotaryEmbedding(module.head_dim, base=module.rope_base,
                            interleaved=module.rope_interleaved) if module.rope else None)
    return np_multihead.MultiHeadAttention(
        Wq=to_array(module.q_proj.weight, transpose=True),
        Wk=to_array(module.k_proj.weight, transpose=True),
        Wv=to_array(module.v_proj.weight, transpose=True),
        Wo=to_array(module.out_proj.weight, transpose=True),
        num_heads=module.num_heads,
        num_kv_heads=module.num_kv_heads,
        bq=to_optional_array(module.q_proj.bias),
        bk=to_optional_array(module.k_proj.bias),
        bv=to_optional_array(module.v_proj.bias),
        bo=to_optional_array(module.out_proj.bias),
        rope=rope,
        alibi=module.alibi,
        scale=module.scale,
    )


def from_torch_layout(
    module: Any, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """Rename an ``nn.MultiheadAttention`` state_dict's entries to this module's, in place.

    torch packs the three input projections into ``in_proj_weight`` (3E, E) and
    ``in_proj_bias`` (3E,) (or keeps ``q_proj_weight``, ``k_proj_weight``,
    ``v_proj_weight`` apart when kdim/vdim differ from E) and stores ``bias_k`` /
    ``bias_v`` as (1, 1, E). Entries already in this module's layout are left alone.
    """
    linears = (module.q_proj, module.k_proj, module.v_proj)
    sizes = [lin.out_features for lin in linears]
    for packed, field in ((prefix + "in_proj_weight", "weight"), (prefix + "in_proj_bias", "bias")):
        tensor = state_dict.get(packed)
        if isinstance(tensor, torch.Tensor) and tensor.ndim >= 1 and tensor.shape[0] == sum(sizes):
            del state_dict[packed]
            for name, part in zip(("q_proj", "k_proj", "v_proj"), tensor.split(sizes),
                                  strict=True):
                state_dict[f"{prefix}{name}.{field}"] = part
    for name in ("q_proj", "k_proj", "v_proj"):
        separate = state_dict.pop(f"{prefix}{name}_weight", None)
        if separate is not None:
            state_dict[f"{prefix}{name}.weight"] = separate
    for name in ("bias_k", "bias_v"):
        extra = state_dict.get(prefix + name)
        if isinstance(extra, torch.Tensor) and extra.ndim == 3:  # torch's (1, 1, E)
            state_dict[prefix + name] = extra.reshape(-1)
