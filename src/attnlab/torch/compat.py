"""torch's own faces, computed by attnlab: drop-in replacements for
``torch.nn.MultiheadAttention`` and ``torch.nn.functional.scaled_dot_product_attention``.

attnlab's API keeps attnlab's conventions (bool masks True = may attend, bottom-right
``is_causal``, keyword-only masks, per-head weights). This module speaks torch's
instead, exactly, so that existing code and checkpoints work unchanged:

=============================  ==========================================================
torch                          here
=============================  ==========================================================
``nn.MultiheadAttention``      :class:`MultiheadAttention`: the same constructor,
                               ``forward``, tuple return, mask meanings and state_dict
                               keys (it *is* an ``nn.MultiheadAttention`` subclass), so
                               it drops into ``nn.TransformerEncoderLayer`` /
                               ``nn.TransformerDecoderLayer``
``F.scaled_dot_product_attention``  :func:`scaled_dot_product_attention`: the same
                               signature; top-left ``is_causal``, ``enable_gqa``
=============================  ==========================================================

:func:`use_attnlab` swaps every ``nn.MultiheadAttention`` of a model for
:class:`MultiheadAttention` with the same parameters.

What attnlab adds stays reachable: ``average_attn_weights=False`` gives per-head
weights, :meth:`MultiheadAttention.to_attnlab` the same parameters as an
:class:`attnlab.torch.MultiHeadAttention` (and from there the NumPy twin with its
recorder), and :func:`attnlab.torch.debug_checks` checks values here too.

One deliberate difference: a query row with no key it may attend to gives 0 (attnlab's
rule, and ``F.scaled_dot_product_attention``'s for bool masks), where
``nn.MultiheadAttention`` gives NaN.

Dimension legend: B batch, H heads (Hkv key/value heads), T query length, S key
length, D head dim, E model width (kdim / vdim: widths of key / value inputs).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_flag, describe, shape_str
from ..errors import AttnlabError, ShapeError
from . import debug
from .checks import check_probability, check_same_device
from .kernel import attend, check_inputs

__all__ = ["MultiheadAttention", "scaled_dot_product_attention", "use_attnlab"]


def _as_torch_mask(mask: Any, name: str, like: torch.Tensor) -> torch.Tensor:
    """A torch-style mask: a bool or float tensor on ``like``'s device."""
    if not isinstance(mask, torch.Tensor):
        raise AttnlabError(f"{name}: expected a bool or float torch.Tensor, got "
                           f"{type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise AttnlabError(
            f"{name}: expected a bool or float tensor (torch's meaning), got dtype {mask.dtype}"
        )
    check_same_device(like, "query", mask, name)
    return mask


def _add_mask(
    mask: torch.Tensor, allowed: torch.Tensor | None, bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Fold an nn.MultiheadAttention mask into attnlab's (allowed, bias): a bool mask
    (True = *not* allowed) restricts ``allowed``, a float mask adds to ``bias``."""
    if mask.dtype == torch.bool:
        return (~mask if allowed is None else allowed & ~mask), bias
    added = mask.to(dtype)
    return allowed, (added if bias is None else bias + added)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with torch's signature and meanings, computed by
    attnlab's kernel. Shapes: query (..., H, T, D), key (..., Hkv, S, D), value
    (..., Hkv, S, Dv) -> (..., H, T, Dv).

    - ``attn_mask``: bool, True = may attend (attnlab's convention too), or float,
      added to the scaled scores; broadcastable to (..., H, T, S).
    - ``is_causal``: top-left, query i sees keys j <= i (attnlab's own is bottom-right);
      not together with ``attn_mask``, as in torch.
    - ``enable_gqa``: H query heads share Hkv key/value heads (H % Hkv == 0); query
      head h reads key/value head h // (H / Hkv).
    - ``dropout_p`` is applied whenever > 0, ``scale`` defaults to 1/√D.

    Equivalent to::

        if enable_gqa: key, value = (t.repeat_interleave(H // Hkv, -3) for t in (key, value))
        scores = query @ key.transpose(-2, -1) * scale + float_mask   # (..., H, T, S)
        weights = softmax(scores where allowed and (j <= i if is_causal))  # empty row -> 0
        return dropout(weights, dropout_p) @ value
    """
    mask: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    tensors = [t for t in (query, key, value) if isinstance(t, torch.Tensor)]
    if len(tensors) == 3 and len({t.dtype for t in tensors}) > 1:  # torch refuses too
        raise AttnlabError(
            f"query, key, value: expected the same dtype (as F.scaled_dot_product_attention), "
            f"got {query.dtype}, {key.dtype} and {value.dtype}"
        )
    if attn_mask is not None:
        if check_flag(is_causal, "is_causal"):
            raise AttnlabError(
                "attn_mask: expected None with is_causal=True (torch's rule: the causal mask "
                "is built from the flag), got a tensor"
            )
        if isinstance(query, torch.Tensor):  # else check_inputs names what query is
            torch_mask = _as_torch_mask(attn_mask, "attn_mask", query)
            if torch_mask.dtype == torch.bool:  # True = may attend, as attnlab's
                mask = torch_mask
            else:
                bias = torch_mask
    # Top-left causal and the GQA head expansion are the kernel's own options.
    inputs = check_inputs(query, key, value, mask, bias=bias, is_causal=is_causal, scale=scale,
                          causal_alignment="top_left", enable_gqa=enable_gqa)
    p = check_probability(dropout_p, "dropout_p")
    if debug.debug_checks_enabled():
        if inputs.bias is not None:
            debug.check_bias_values(inputs.bias)
        debug.check_finite([("query", inputs.q), ("key", inputs.k), ("value", inputs.v)])
    out = attend(inputs.q, inputs.k, inputs.v, inputs.allowed, inputs.bias, inputs.scale,
                 is_causal=inputs.is_causal, dropout_p=p)  # (..., H, T, Dv)
    return cast(torch.Tensor, out)  # no weights were asked for


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention``, computed by attnlab's kernel: the same constructor,
    parameters, state_dict keys, ``forward`` and return.

    Being a subclass, it goes wherever ``nn.MultiheadAttention`` goes
    (``nn.TransformerEncoderLayer(...).self_attn = MultiheadAttention(...)``, or
    :func:`use_attnlab` on a whole model) and loads its checkpoints both ways. Where
    ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` take their fused
    inference fast path, torch computes from these same parameters without calling
    ``forward`` (as with the stock module); everywhere else ``forward`` runs here.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False) -> (out, weights)``:

    - query (B, T, E), key (B, S, kdim), value (B, S, vdim); (T, B, E) etc. unless
      ``batch_first``; unbatched (T, E) too.
    - ``key_padding_mask`` (B, S): bool True = padding (ignored), or float, added.
    - ``attn_mask`` (T, S) or (B*H, T, S): bool True = NOT allowed, or float, added.
    - ``is_causal``: a hint that ``attn_mask`` is the causal mask (torch's meaning);
      ``attn_mask`` is still required and is what is applied.
    - weights (B, T, S) averaged over heads, (B, H, T, S) with
      ``average_attn_weights=False``, None unless ``need_weights``; after dropout.
    - ``add_bias_kv`` appends ``bias_k`` / ``bias_v`` as one more key/value,
      ``add_zero_attn`` a zero key/value per head (S grows by one each), as torch does.

    >>> import torch
    >>> mha = MultiheadAttention(8, 2, batch_first=True)
    >>> x = torch.ones(2, 3, 8)
    >>> out, weights = mha(x, x, x)
    >>> out.shape, weights.shape
    (torch.Size([2, 3, 8]), torch.Size([2, 3, 3]))
    >>> sorted(mha.state_dict())
    ['in_proj_bias', 'in_proj_weight', 'out_proj.bias', 'out_proj.weight']
    """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        need_weights = check_flag(need_weights, "need_weights")
        average_attn_weights = check_flag(average_attn_weights, "average_attn_weights")
        if check_flag(is_causal, "is_causal") and attn_mask is None:
            raise AttnlabError(
                "attn_mask: expected the causal mask with is_causal=True (in "
                "nn.MultiheadAttention the flag is only a hint about attn_mask), got None"
            )
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise AttnlabError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if query.is_nested or key.is_nested or value.is_nested:
            return self._forward_nested(query, key, value, key_padding_mask, need_weights,
                                        attn_mask, average_attn_weights)
        batched = query.ndim == 3
        if batched and not self.batch_first:  # (T, B, E) -> (B, T, E)
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        elif not batched:  # (T, E) -> (1, T, E)
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        out, weights = self.forward_batch_first(
            query, key, value, key_padding_mask, need_weights, attn_mask, batched,
        )
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=-3)  # (B, T, S)
        if not batched:
            out = out.squeeze(0)  # (T, E)
            weights = None if weights is None else weights.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)  # (T, B, E)
        return out, weights

    def _forward_nested(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        need_weights: bool,
        attn_mask: torch.Tensor | None,
        average_attn_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """NestedTensor inputs (B sequences of their own lengths T_i, batch first), as
        ``nn.TransformerEncoder(enable_nested_tensor=True)`` hands them over when its
        fused path is off (a hook on ``self_attn``): each sequence is computed on its
        own, nothing is padded. Out: nested (B, T_i, E); weights zero-padded to
        (B, [H,] max T_i, max S_i), as torch gives them."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not t.is_nested:
                raise AttnlabError(f"{name}: expected a NestedTensor like the others, got a "
                                   f"dense tensor of shape {shape_str(t.shape)}")
        for name, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if mask is not None:
                raise AttnlabError(f"{name}: expected None with NestedTensor inputs (they "
                                   f"have no padding to mask), got {describe(mask)}")
        if not self.batch_first:
            raise AttnlabError("query: a NestedTensor needs batch_first=True (as in torch), "
                               "got a module with batch_first=False")
        queries, keys, values = query.unbind(), key.unbind(), value.unbind()
        if not len(queries) == len(keys) == len(values):
            raise ShapeError(f"query, key, value: expected the same number of sequences, got "
                             f"{len(queries)}, {len(keys)} and {len(values)}")
        outs, all_weights = [], []
        for q_i, k_i, v_i in zip(queries, keys, values, strict=True):  # (T_i, E), (S_i, kdim)
            out_i, weights_i = self.forward_batch_first(q_i[None], k_i[None], v_i[None], None,
                                                        need_weights, None, True)
            outs.append(out_i[0])  # (T_i, E)
            all_weights.append(weights_i)
        out = torch.nested.as_nested_tensor(outs)  # (B, T_i, E)
        if not need_weights:
            return out, None
        T = max(q.shape[0] for q in queries)
        S = max(w.shape[-1] for w in all_weights if w is not None)
        padded = outs[0].new_zeros((len(queries), self.num_heads, T, S))  # (B, H, T, S)
        for i, w in enumerate(all_weights):
            assert w is not None  # asked for
            padded[i, :, : w.shape[-2], : w.shape[-1]] = w[0]
        return out, padded.mean(dim=1) if average_attn_weights else padded

    def forward_batch_first(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        need_weights: bool,
        attn_mask: torch.Tensor | None,
        batched: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The computation on batch-first inputs: query (B, T, E), key (B, S, kdim), value
        (B, S, vdim) -> out (B, T, E), per-head weights (B, H, T, S') or None
        (S' = S + 1 for each of ``add_bias_kv``, ``add_zero_attn``)."""
        E, H = self.embed_dim, self.num_heads
        D = self.head_dim
        B, T, S = query.shape[0], query.shape[1], key.shape[1]
        lead = f"{B}, " if batched else ""
        for name, t, width in (("query", query, E), ("key", key, self.kdim),
                               ("value", value, self.vdim)):
            if t.ndim != 3 or t.shape[0] != B or t.shape[-1] != width or (
                name != "query" and t.shape[1] != S
            ):
                length = "T" if name == "query" else str(S)
                raise ShapeError(
                    f"{name}: expected ({lead}{length}, {width}) (batch_first="
                    f"{self.batch_first}; layout as query), got {shape_str(t.shape)}"
                )
        like = self.out_proj.weight
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_same_device(like, "the module", t, name)

        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)  # (E, E) each
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self.in_proj_bias is not None:
            # in the weights' dtype, as nn.MultiheadAttention computes a bias of another
            b_q, b_k, b_v = self.in_proj_bias.to(w_q.dtype).chunk(3)  # (E,) each
        else:
            b_q = b_k = b_v = None
        q = F.linear(query, w_q, b_q)  # (B, T, E)
        k = F.linear(key, w_k, b_k)  # (B, S, E)
        v = F.linear(value, w_v, b_v)  # (B, S, E)

        allowed: torch.Tensor | None = None
        bias: torch.Tensor | None = None
        if key_padding_mask is not None:
            padding = _as_torch_mask(key_padding_mask, "key_padding_mask", query)
            expected = (B, S) if batched else (S,)
            if tuple(padding.shape) != expected:
                raise ShapeError(
                    f"key_padding_mask: expected {shape_str(expected)} (True = padding), "
                    f"got {shape_str(padding.shape)}"
                )
            padding = padding.reshape(B, 1, 1, S)  # (B, 1, 1, S)
            allowed, bias = _add_mask(padding, allowed, bias, q.dtype)
        if attn_mask is not None:
            mask = _as_torch_mask(attn_mask, "attn_mask", query)
            shapes = [(T, S), (B * H, T, S)] if batched else [(T, S), (H, T, S)]
            if tuple(mask.shape) not in shapes:
                raise ShapeError(
                    f"attn_mask: expected {' or '.join(shape_str(s) for s in shapes)} "
                    f"(bool: True = not allowed), got {shape_str(mask.shape)}"
                )
            if mask.ndim == 3:
                mask = mask.reshape(B, H, T, S)  # (B, H, T, S)
            allowed, bias = _add_mask(mask, allowed, bias, q.dtype)

        extra = 0
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.expand(B, 1, E)], dim=1)  # (B, S + 1, E)
            v = torch.cat([v, self.bias_v.expand(B, 1, E)], dim=1)  # (B, S + 1, E)
            extra += 1
        k = k.view(B, S + extra, H, D).transpose(1, 2)  # (B, H, S', D)
        v = v.view(B, S + extra, H, D).transpose(1, 2)  # (B, H, S', D)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, H, 1, D)], dim=2)  # (B, H, S' + 1, D)
            v = torch.cat([v, v.new_zeros(B, H, 1, D)], dim=2)  # (B, H, S' + 1, D)
            extra += 1
        if extra:  # the appended keys are open to every query, as in torch
            if allowed is not None:
                allowed = F.pad(allowed, (0, extra), value=True)  # (..., T, S')
            if bias is not None:
                bias = F.pad(bias, (0, extra), value=0.0)  # (..., T, S')

        if debug.debug_checks_enabled():
            if bias is not None:
                debug.check_bias_values(bias)
            debug.check_finite([("query", query), ("key", key), ("value", value)])
        result = attend(
            q, k, v, allowed, bias, 1.0 / math.sqrt(D),
            dropout_p=self.dropout if self.training else 0.0, return_weights=need_weights,
        )  # (B, H, T, D) [, (B, H, T, S')]
        heads, weights = result if isinstance(result, tuple) else (result, None)
        # Laid out in memory as torch's (T, B, E), returned as a (B, T, E) view of it:
        # a dropout after this module (the layers' dropout1) draws its mask in memory
        # order, so the same seed gives the same numbers as nn.MultiheadAttention.
        merged = heads.permute(2, 0, 1, 3).reshape(T, B, E)  # (T, B, E)
        out_bias = self.out_proj.bias
        out = F.linear(merged, self.out_proj.weight,
                       None if out_bias is None else out_bias.to(self.out_proj.weight.dtype))
        return out.transpose(0, 1), weights  # (B, T, E), a view of (T, B, E)

    def to_attnlab(self) -> Any:
        """The same parameters as an :class:`attnlab.torch.MultiHeadAttention` (attnlab's
        conventions: masks True = may attend, keyword-only; per-head weights; its
        ``to_numpy()`` twin records every intermediate)."""
        from .convert import from_torch_multihead

        return from_torch_multihead(self)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiheadAttention:
        """A copy of ``module`` (same options, parameters, mode, device and dtype)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise AttnlabError(
                f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}"
            )
        weight = module.out_proj.weight
        twin = cls(
            module.embed_dim, module.num_heads, dropout=module.dropout,
            bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
            add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim,
            batch_first=module.batch_first, device=weight.device, dtype=weight.dtype,
        )
        twin.load_state_dict(module.state_dict())
        return twin.train(module.training)


def use_attnlab(model: nn.Module) -> nn.Module:
    """Replace every ``nn.MultiheadAttention`` inside ``model`` (in place) by a
    :class:`MultiheadAttention` with the same parameters; returns ``model``.

    >>> layer = nn.TransformerEncoderLayer(8, 2, batch_first=True)
    >>> type(use_attnlab(layer).self_attn).__name__
    'MultiheadAttention'
    >>> type(layer.self_attn).__module__
    'attnlab.torch.compat'
    """
    if not isinstance(model, nn.Module):
        raise AttnlabError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if type(model) is nn.MultiheadAttention:
        raise AttnlabError(
            "model: expected a model containing nn.MultiheadAttention, got one itself; "
            "use MultiheadAttention.from_torch(module)"
        )
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.MultiheadAttention:
                setattr(parent, name, MultiheadAttention.from_torch(child))
    return model
