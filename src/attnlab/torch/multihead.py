"""Multi-head (and grouped-query) attention as a ``torch.nn.Module``.

Behaves identically to :class:`attnlab.MultiHeadAttention` (the NumPy core) on
the same parameters, which move both ways with :meth:`MultiHeadAttention.from_numpy`
and :meth:`MultiHeadAttention.to_numpy`. Seed 001's name and positional form
(``MultiHeadAttention(h, d_model)``, ``forward(query, key, value, mask)``), the
library's names (``num_heads``, ``head_dim``, ``return_weights``), and torch's
conventions for the rest: the module starts in training mode, its parameters
are ``nn.Linear`` layers stored (out, in) (``W_numpy = linear.weight.T``), and
inputs must already have the parameters' dtype and device.

Checks: shapes, dtypes and devices at every call; NaN/Inf in the inputs,
NaN/+inf in ``bias`` and score overflow only under
:func:`attnlab.torch.debug_checks`.

Dimension legend: B batch, H heads (Hkv key/value heads), T query length,
S key length, D head dim, Dv value head dim, E model width (Ekv: width of the
keys' and values' input).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_alloc, check_flag, check_positive_int, check_scale
from ..errors import AttnlabError
from ..hooks import HookSite
from ..kernel import check_softcap
from ..nn import multihead as np_multihead
from ..shapes import check_score_elements
from . import debug
from .checks import (
    check_module_dtype,
    check_positive_float,
    check_probability,
)
from .gqa import repeat_kv
from .kernel import PLAIN_PATH_HINT, attend, causal_allowed, scaled_scores, stable_softmax
from .multihead_inputs import MultiHeadInputs, check_multihead_inputs
from .multihead_params import from_torch_layout, multihead_from_numpy, multihead_to_numpy
from .positional import alibi_values, rotate

__all__ = ["MultiHeadAttention", "MultiHeadInputs"]


class MultiHeadAttention(nn.Module):
    """Multi-head (and grouped-query) attention; behaves identically to
    :class:`attnlab.MultiHeadAttention` on the same parameters.

    Seed 001's ``MultiHeadAttention(h, d_model)`` (positionally; the parameter is
    named ``num_heads``), with torch's conventions for the rest: ``dropout`` is on
    the attention weights (active in training mode only).

    Args:
        num_heads: query heads H. d_model: model width E (E must be a multiple of H
            unless ``head_dim`` is given).
        dropout: on the attention weights, in training mode.
        num_kv_heads: Hkv for grouped-query attention (default H; must divide H).
            Query head h reads key/value head h // (H / Hkv).
        head_dim, value_head_dim: D (default E // H) and Dv (default D).
        d_context: Ekv, width of ``key`` (and ``value``; default E).
        d_value_context: Ev, width of ``value`` when it differs from the key's
            (default Ekv; torch's ``kdim`` is ``d_context``, its ``vdim`` this).
        d_out: output width (default E).
        use_bias: biases on all four projections (``bias`` is the additive score bias
            of a call, as everywhere in attnlab).
        v_gain: scales the Xavier init of the value projection (seed 001's "smaller V").
        rope: rotate queries and keys per head (RoPE) with ``rope_base`` and
            ``rope_interleaved``; keys sit at positions 0 .. S-1 and queries at
            S - T .. S - 1 (bottom-right, so a cached decoding step is right).
        alibi: add ``alibi_bias(H, T, S)`` to the scores (combine with ``is_causal``).
        scale: the factor of the scores q·kᵀ before the softmax: None = 1/√D, a number =
            that factor (1.0: no scaling).
        batch_first: inputs and output are (B, T, E) (default, attnlab's layout); False
            reads and returns (T, B, E), torch.nn.MultiheadAttention's default layout.
        add_bias_kv: learn one more key and value (``bias_k`` (Hkv*D,), ``bias_v``
            (Hkv*Dv,)), appended after the S keys and open to every query, as
            ``nn.MultiheadAttention(add_bias_kv=True)``.
        add_zero_attn: append a key and value of zeros per head (after ``bias_k``), as
            ``nn.MultiheadAttention(add_zero_attn=True)``: a query may put weight on
            "nothing". Each option adds a column to the weights (S + 1 keys).
        generator: the torch.Generator the Xavier init draws from (default: torch's global one).

    Parameters: ``q_proj`` (E -> H*D), ``k_proj`` (Ekv -> Hkv*D), ``v_proj``
    (Ev -> Hkv*Dv), ``out_proj`` (H*Dv -> E_out), all ``nn.Linear``; Xavier-uniform
    weights and zero biases, as the NumPy core's ``MultiHeadAttention.init``.

    Formula, for head h (g the key/value head it reads)::

        head_h = softmax((query Wq_h)(key Wk_g)ᵀ · scale  [masked]) (value Wv_g)   scale = 1/√D
                                                                              unless given
        out    = concat(head_1, ..., head_H) Wo + bo

    Calls return an ``(out, weights)`` pair like ``nn.MultiheadAttention``'s
    (``weights`` is None unless ``return_weights``), so torch's idiom
    ``out, _ = mha(x, x, x)`` means the same here; masks and flags are keyword-only.

    >>> mha = MultiHeadAttention(2, 8)
    >>> x = torch.ones(1, 3, 8)
    >>> out, weights = mha(x, x, x)
    >>> out.shape, weights
    (torch.Size([1, 3, 8]), None)
    >>> out, weights = mha(x, x, x, return_weights=True)
    >>> weights.shape
    torch.Size([1, 2, 3, 3])

    Hook points (:mod:`attnlab.hooks`), the NumPy twin's: hook_q, hook_k, hook_v,
    hook_rot_q, hook_rot_k (with RoPE), hook_attn_scores, hook_pattern (these two
    make the call take the plain path instead of the fused kernel), hook_z,
    hook_result (opt-in). hook_k and hook_v are taken before ``add_bias_kv`` and
    ``add_zero_attn`` append their keys.
    """

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The named points of :meth:`forward_checked`, in order (as the NumPy twin's)."""
        rotated = ["hook_rot_q", "hook_rot_k"] if self.rope else []
        return ["hook_q", "hook_k", "hook_v", *rotated, "hook_attn_scores", "hook_pattern",
                "hook_z", "hook_result"]

    def __init__(
        self,
        num_heads: int,
        d_model: int,
        *,
        dropout: float = 0.0,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        value_head_dim: int | None = None,
        d_context: int | None = None,
        d_value_context: int | None = None,
        d_out: int | None = None,
        use_bias: bool = True,
        v_gain: float = 1.0,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_interleaved: bool = False,
        alibi: bool = False,
        scale: float | None = None,
        batch_first: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
    ) -> None:
        super().__init__()
        self.batch_first = check_flag(batch_first, "batch_first")
        H = check_positive_int(num_heads, "num_heads")
        E = check_positive_int(d_model, "d_model")
        Hkv = H if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
        if H % Hkv:
            raise AttnlabError(
                f"num_kv_heads: expected a divisor of num_heads = {H}, got {Hkv}"
            )
        if head_dim is None:
            if E % H:
                raise AttnlabError(
                    f"d_model: expected a multiple of num_heads = {H} (or pass head_dim), "
                    f"got {E}"
                )
            head_dim = E // H
        D = check_positive_int(head_dim, "head_dim")
        Dv = D if value_head_dim is None else check_positive_int(value_head_dim, "value_head_dim")
        Ekv = E if d_context is None else check_positive_int(d_context, "d_context")
        Ev = Ekv if d_value_context is None else check_positive_int(
            d_value_context, "d_value_context"
        )
        E_out = E if d_out is None else check_positive_int(d_out, "d_out")
        use_bias = check_flag(use_bias, "use_bias")
        self.rope = check_flag(rope, "rope")
        self.rope_interleaved = check_flag(rope_interleaved, "rope_interleaved")
        self.rope_base = check_positive_float(rope_base, "rope_base")
        if rope and D % 2:
            raise AttnlabError(
                f"head_dim: RoPE rotates pairs of features, expected an even D, got {D}"
            )
        self.alibi = check_flag(alibi, "alibi")
        self.scale = None if scale is None else check_scale(scale, D)
        self.dropout = check_probability(dropout, "dropout")
        if isinstance(v_gain, bool) or not isinstance(v_gain, (int, float)) or not (
            math.isfinite(v_gain) and v_gain >= 0
        ):
            raise AttnlabError(f"v_gain: expected a finite number >= 0, got {v_gain!r}")

        for shape, what in (((H * D, E), "q_proj"), ((Hkv * D, Ekv), "k_proj"),
                            ((Hkv * Dv, Ev), "v_proj"), ((E_out, H * Dv), "out_proj")):
            check_alloc(shape, torch.float64, f"the weight of {what} (out, in)",
                        "num_heads, d_model")
        self.num_heads, self.num_kv_heads, self.head_dim, self.value_head_dim = H, Hkv, D, Dv
        self.d_model, self.d_context, self.d_out = E, Ekv, E_out
        self.d_value_context = Ev
        factory = {"device": device, "dtype": check_module_dtype(dtype)}
        self.q_proj = nn.Linear(E, H * D, bias=use_bias, **factory)
        self.k_proj = nn.Linear(Ekv, Hkv * D, bias=use_bias, **factory)
        self.v_proj = nn.Linear(Ev, Hkv * Dv, bias=use_bias, **factory)
        self.out_proj = nn.Linear(H * Dv, E_out, bias=use_bias, **factory)
        self.bias_k: nn.Parameter | None = None
        self.bias_v: nn.Parameter | None = None
        if check_flag(add_bias_kv, "add_bias_kv"):
            self.bias_k = nn.Parameter(torch.empty(Hkv * D, **factory))  # (Hkv*D,)
            self.bias_v = nn.Parameter(torch.empty(Hkv * Dv, **factory))  # (Hkv*Dv,)
        self.add_zero_attn = check_flag(add_zero_attn, "add_zero_attn")
        self.reset_parameters(v_gain=float(v_gain), generator=generator)
        # nn.MultiheadAttention's state_dict loads here too (in_proj_weight, bias_k, ...).
        self._register_load_state_dict_pre_hook(from_torch_layout, with_module=True)

    def reset_parameters(
        self, *, v_gain: float = 1.0, generator: torch.Generator | None = None
    ) -> None:
        """Xavier-uniform weights (the value projection's times ``v_gain``), zero biases."""
        for linear, gain in ((self.q_proj, 1.0), (self.k_proj, 1.0),
                             (self.v_proj, v_gain), (self.out_proj, 1.0)):
            nn.init.xavier_uniform_(linear.weight, gain=gain, generator=generator)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        for extra in (self.bias_k, self.bias_v):
            if extra is not None:  # torch's init for them: Xavier-normal of a (1, 1, n) tensor
                nn.init.xavier_normal_(extra.view(1, 1, -1), generator=generator)

    def extra_repr(self) -> str:
        parts = [f"num_heads={self.num_heads}", f"d_model={self.d_model}",
                 f"dropout={self.dropout}"]
        if self.num_kv_heads != self.num_heads:
            parts.append(f"num_kv_heads={self.num_kv_heads}")
        if self.rope:
            parts.append(f"rope=True, rope_base={self.rope_base}, "
                         f"rope_interleaved={self.rope_interleaved}")
        if self.alibi:
            parts.append("alibi=True")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        if not self.batch_first:
            parts.append("batch_first=False")
        if self.bias_k is not None:
            parts.append("add_bias_kv=True")
        if self.add_zero_attn:
            parts.append("add_zero_attn=True")
        return ", ".join(parts)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        key_padding: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
        average_attn_weights: bool = False,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (pass the same tensor three times for
        self-attention). Returns ``(out, weights)``; ``weights`` is None unless
        ``return_weights``, per head unless ``average_attn_weights`` (torch's default).

        Shapes:
            query       (B, T, E) or (T, E); (T, B, E) if ``batch_first=False``
            key, value  (B, S, Ekv) or (S, Ekv); (S, B, Ekv) if ``batch_first=False``
            mask        bool, broadcastable to (B, H, T, S); True = may attend
                        (torch.nn.MultiheadAttention's attn_mask is the opposite: True blocks)
            key_padding bool (B, S); True = a real token (the opposite of torch's
                        key_padding_mask)
            bias        float, broadcastable to (B, H, T, S), added to the scaled scores
            softcap     c: scores c·tanh(s / c) before bias and mask (Gemma 2), or None
            ->          out (B, T, E_out) (the query's layout), and per-head weights
                        (B, H, T, S) if ``return_weights`` ((B, T, S) averaged over heads
                        with ``average_attn_weights``, torch's default), else None;
                        S + 1 keys for each of ``add_bias_kv``, ``add_zero_attn``

        Masks and flags are keyword-only: torch's 4th positional argument is
        ``key_padding_mask`` (True = padding), attnlab's masks mean the opposite, so a
        torch-style positional call is refused rather than read the other way round.
        ``is_causal`` is bottom-right aligned (query i may see keys j ≤ S - T + i);
        torch's ``F.scaled_dot_product_attention`` is top-left (``attnlab.torch.compat``
        has torch's). Rows with nothing to attend to give 0.
        """
        inputs = self.check_inputs(query, key, value, mask, key_padding, bias, is_causal)
        average = check_flag(average_attn_weights, "average_attn_weights")
        if check_flag(return_weights, "return_weights"):  # weights: a (B, H, T, S) tensor
            lead, T, S = inputs.query.shape[:-2], inputs.query.shape[-2], inputs.key.shape[-2]
            check_score_elements((*lead, self.num_heads, T, S), PLAIN_PATH_HINT)
        out, weights = self.forward_checked(inputs, return_weights,
                                            softcap=check_softcap(softcap))
        if weights is not None and average:
            weights = weights.mean(dim=-3)  # (B, T, S)
        if not self.batch_first and out.ndim == 3:
            out = out.transpose(0, 1)  # (T, B, E_out), the caller's layout
        return out, weights

    def check_inputs(
        self,
        query: Any,
        key: Any,
        value: Any,
        mask: Any,
        key_padding: Any,
        bias: Any,
        is_causal: Any,
        names: tuple[str, str, str] = ("query", "key", "value"),
    ) -> MultiHeadInputs:
        """Every check of :meth:`forward`, before any math; ``names`` are the arguments'.

        Inputs come back batch-first whatever ``batch_first`` says.

        Shapes, dtypes and devices always; values only under
        :func:`attnlab.torch.debug_checks`. :meth:`forward_checked` computes on the result.
        (:func:`attnlab.torch.multihead_inputs.check_multihead_inputs` with this module's
        sizes.)
        """
        return check_multihead_inputs(
            query, key, value, mask, key_padding, bias, is_causal, like=self.q_proj.weight,
            num_heads=self.num_heads, d_model=self.d_model, d_context=self.d_context,
            d_value_context=self.d_value_context, batch_first=self.batch_first, rope=self.rope,
            names=names,
        )

    def forward_checked(
        self, c: MultiHeadInputs, return_weights: bool = False, *, softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The math of :meth:`forward` on inputs from :meth:`check_inputs` (no checks;
        under :func:`attnlab.torch.debug_checks`, the projected scores' overflow bound).

        Batch-first in and out: (B, T, E) -> (B, T, E_out), weights (B, H, T, S) or None."""
        H, Hkv = self.num_heads, self.num_kv_heads
        D, Dv = self.head_dim, self.value_head_dim
        lead = tuple(c.query.shape[:-2])
        T, S = c.query.shape[-2], c.key.shape[-2]
        q = self.q_proj(c.query).view(*lead, T, H, D).transpose(-3, -2)  # (B, H, T, D)
        k = self.k_proj(c.key).view(*lead, S, Hkv, D).transpose(-3, -2)  # (B, Hkv, S, D)
        v = self.v_proj(c.value).view(*lead, S, Hkv, Dv).transpose(-3, -2)  # (B, Hkv, S, Dv)
        site = self.hook_site  # None unless hooks are attached (attnlab.hooks)
        if site is not None:
            q, k, v = site("hook_q", q), site("hook_k", k), site("hook_v", v)
        if self.rope:
            key_pos = torch.arange(S, device=q.device)  # (S,)
            q = rotate(q, key_pos[S - T:], base=self.rope_base,
                       interleaved=self.rope_interleaved)  # (B, H, T, D)
            k = rotate(k, key_pos, base=self.rope_base,
                       interleaved=self.rope_interleaved)  # (B, Hkv, S, D)
            if site is not None:
                q, k = site("hook_rot_q", q), site("hook_rot_k", k)
        bias, allowed, is_causal = c.bias, c.allowed, c.is_causal
        if self.alibi:
            slopes_bias = alibi_values(H, T, S, dtype=q.dtype, device=q.device)  # (H, T, S)
            bias = slopes_bias if bias is None else bias + slopes_bias  # (B, H, T, S)
        extra = 0
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.view(Hkv, 1, D).expand(*lead, Hkv, 1, D)],
                          dim=-2)  # (B, Hkv, S + 1, D)
            v = torch.cat([v, self.bias_v.view(Hkv, 1, Dv).expand(*lead, Hkv, 1, Dv)],
                          dim=-2)  # (B, Hkv, S + 1, Dv)
            extra += 1
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(*lead, Hkv, 1, D)], dim=-2)  # (B, Hkv, S', D)
            v = torch.cat([v, v.new_zeros(*lead, Hkv, 1, Dv)], dim=-2)  # (B, Hkv, S', Dv)
            extra += 1
        if extra:  # the appended keys are open to every query; masks and bias cover S only
            if is_causal:
                causal = causal_allowed(T, S, q.device)  # (T, S)
                allowed = causal if allowed is None else allowed & causal  # (B, H, T, S)
                is_causal = False
            if allowed is not None:
                allowed = F.pad(allowed, (0, extra), value=True)  # (B, H, T, S')
            if bias is not None:
                bias = F.pad(bias, (0, extra), value=0.0)  # (B, H, T, S')
        k = repeat_kv(k, H // Hkv)  # (B, H, S', D)
        v = repeat_kv(v, H // Hkv)  # (B, H, S', Dv)
        scale = 1.0 / math.sqrt(D) if self.scale is None else self.scale
        if debug.debug_checks_enabled():
            debug.check_tensor_score_range(q, k, bias, scale)
        dropout_p = self.dropout if self.training else 0.0
        if site is not None and (site.wants("hook_attn_scores") or site.wants("hook_pattern")):
            # attend's plain steps one by one, so that the hooks see (and may replace) each.
            scores = site("hook_attn_scores", scaled_scores(
                q, k, allowed, bias, scale, is_causal=is_causal,
                softcap=softcap))  # (B, H, T, S)
            weights = site("hook_pattern", stable_softmax(scores, dim=-1))  # (B, H, T, S)
            dropped = F.dropout(weights, p=dropout_p, training=True) if dropout_p else weights
            heads = dropped @ v  # (B, H, T, Dv)
            weights = weights if return_weights else None
        else:
            result = attend(
                q, k, v, allowed, bias, scale,
                is_causal=is_causal,
                dropout_p=dropout_p,
                return_weights=return_weights,
                softcap=softcap,
            )  # (B, H, T, Dv) [, (B, H, T, S)]
            heads, weights = result if isinstance(result, tuple) else (result, None)
        if site is not None:
            heads = site("hook_z", heads)  # (B, H, T, Dv)
            if site.wants("hook_result"):
                per_head_wo = self.out_proj.weight.t().reshape(H, Dv, -1)  # (H, Dv, E_out)
                result_heads = site("hook_result", torch.einsum(
                    "...htd,hde->...hte", heads, per_head_wo))  # (B, H, T, E_out)
                out = result_heads.sum(dim=-3)  # (B, T, E_out)
                if self.out_proj.bias is not None:
                    out = out + self.out_proj.bias
                return out, weights
        merged = heads.transpose(-3, -2).reshape(*lead, T, H * Dv)  # (B, T, H*Dv)
        out = self.out_proj(merged)  # (B, T, E_out)
        return out, weights

    @classmethod
    def from_numpy(
        cls,
        mha: np_multihead.MultiHeadAttention,
        *,
        dropout: float = 0.0,
        device: Any = None,
        dtype: Any = None,
    ) -> MultiHeadAttention:
        """A module with the parameters of a NumPy :class:`attnlab.MultiHeadAttention`.

        Any shapes the core accepts (GQA, D != E/H, Dv != D, cross-attention widths,
        missing biases) carry over. dtype: the arrays' unless ``dtype`` is given.
        """
        return cast(MultiHeadAttention, multihead_from_numpy(
            cls, mha, dropout=dropout, device=device, dtype=dtype))

    def to_numpy(self) -> np_multihead.MultiHeadAttention:
        """The NumPy :class:`attnlab.MultiHeadAttention` with these parameters.

        RoPE and ALiBi carry over (a :class:`attnlab.positional_relative.RotaryEmbedding`
        with the same base and layout, and ``alibi=True``); the NumPy class is
        batch-first. ``add_bias_kv`` and ``add_zero_attn`` have no NumPy counterpart
        (nor a NumPy backward) and are refused.
        """
        return multihead_to_numpy(self)
