"""The blocks around attention as ``torch.nn`` modules: LayerNorm and seed 001's layer.

Each behaves identically to its NumPy twin in :mod:`attnlab.nn.layers` on the same
parameters, which move both ways with ``from_numpy`` / ``to_numpy``. Unlike the
NumPy layers, the modules start in training mode (torch's convention): call
``.eval()`` to turn dropout off.

Dimension legend: B batch, H heads, T sequence length, E model width.

Norm placement: ``norm_first=False`` is the core's ``norm="post"`` (seed 001's
code, ``LN(x + Dropout(MHA(x)))``), ``norm_first=True`` its ``norm="pre"``
(``x + Dropout(MHA(LN(x)))``).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..errors import AttnlabError, ShapeError, check_positive_int, shape_str
from ..nn import layers as np_layers
from .checks import (
    check_finite,
    check_flag,
    check_module_dtype,
    check_positive_float,
    check_probability,
    module_input,
)
from .multihead import MultiHeadAttention, _Checked
from .params import to_array, to_param, torch_dtype

__all__ = ["LayerNorm", "SelfAttentionLayer"]


class LayerNorm(nn.LayerNorm):
    """Layer normalisation over the last dim; behaves identically to :class:`attnlab.LayerNorm`.

    Shapes: x (..., E) -> (..., E). ``y = (x - mean) / sqrt(var + eps) * weight + bias``
    with the biased variance. ``weight`` is the core's ``gamma``, ``bias`` its ``beta``.

    >>> LayerNorm(8)(torch.ones(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    def __init__(
        self, d_model: int, eps: float = 1e-5, *, device: Any = None, dtype: Any = None
    ) -> None:
        d_model = check_positive_int(d_model, "d_model")
        eps = check_positive_float(eps, "eps")
        super().__init__(d_model, eps=eps, device=device, dtype=check_module_dtype(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., E)
        x = module_input(x, "x", self.weight)
        E = self.normalized_shape[0]
        if x.ndim < 1 or x.shape[-1] != E:
            raise ShapeError(f"x: expected (..., {E}), got {shape_str(x.shape)}")
        check_finite([("x", x)])
        out = super().forward(x)
        if x.numel() and not bool(torch.isfinite(out).all()):
            out = self._rescaled(x)
        return out

    def _rescaled(self, x: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., E)
        """The forward for rows whose squares overflow (|x| near the dtype's largest value).

        torch's kernel gives NaN there (the NumPy core's LayerNorm used to give 0):
        LayerNorm is scale-invariant but for eps, so each row is divided by
        m = its largest |x| and normalised with eps / m², as attnlab.LayerNorm does.
        """
        m = x.detach().abs().amax(dim=-1, keepdim=True)  # (..., 1) > 0: x is finite, not all 0
        m = torch.where(m > 0, m, torch.ones_like(m))
        xs = x / m  # (..., E)
        centred = xs - xs.mean(dim=-1, keepdim=True)  # (..., E)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
        # m² = inf makes the scaled eps 0; a constant row (var 0, centred 0) keeps eps itself.
        spread = torch.where(var > 0, var + self.eps / (m * m), torch.full_like(var, self.eps))
        normed = centred / torch.sqrt(spread)  # (..., E)
        return normed * self.weight + self.bias

    @classmethod
    def from_numpy(
        cls, norm: np_layers.LayerNorm, *, device: Any = None, dtype: Any = None
    ) -> LayerNorm:
        """A module with the parameters of a NumPy :class:`attnlab.LayerNorm` (dtype kept
        unless ``dtype`` is given)."""
        if not isinstance(norm, np_layers.LayerNorm):
            raise AttnlabError(f"norm: expected an attnlab.LayerNorm, got {type(norm).__name__}")
        dtype = dtype or torch_dtype(norm.gamma, norm.beta)
        module = cls(norm.d_model, norm.eps, device=device, dtype=dtype)
        with torch.no_grad():
            module.weight.copy_(to_param(norm.gamma, transpose=False, like=module.weight))
            module.bias.copy_(to_param(norm.beta, transpose=False, like=module.bias))
        return module

    def to_numpy(self) -> np_layers.LayerNorm:
        """The NumPy :class:`attnlab.LayerNorm` with these parameters."""
        E = self.normalized_shape[0]
        return np_layers.LayerNorm(
            E, self.eps, gamma=to_array(self.weight), beta=to_array(self.bias)
        )


class SelfAttentionLayer(nn.Module):
    """Multi-head self-attention + dropout + residual + LayerNorm (seed 001's layer);
    behaves identically to :class:`attnlab.SelfAttentionLayer`.

    Shapes: x (B, T, E) or (T, E) -> same shape; ``mask`` bool, broadcastable to
    (B, H, T, S), True = may attend.

    ``norm_first=False`` (post, seed 001's code): ``norm1(x + dropout(self_attn(x)))``;
    ``norm_first=True`` (pre): ``x + dropout(self_attn(norm1(x)))`` -- the core's
    ``norm="post"`` / ``norm="pre"``. Other keyword arguments go to
    :class:`MultiHeadAttention` (whose own dropout stays 0, as in the seed).

    >>> layer = SelfAttentionLayer(8, 2).eval()
    >>> layer(torch.ones(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    def __init__(
        self,
        d_model: int,
        h: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        *,
        num_kv_heads: int | None = None,
        eps: float = 1e-5,
        bias: bool = True,
        v_gain: float = 1.0,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_interleaved: bool = False,
        alibi: bool = False,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        p = check_probability(dropout, "dropout")
        self.norm_first = check_flag(norm_first, "norm_first")
        self.self_attn = MultiHeadAttention(
            h, d_model, 0.0, num_kv_heads=num_kv_heads, bias=bias, v_gain=v_gain,
            rope=rope, rope_base=rope_base, rope_interleaved=rope_interleaved, alibi=alibi,
            generator=generator, device=device, dtype=dtype,
        )
        self.norm1 = LayerNorm(d_model, eps, device=device, dtype=dtype)
        self.dropout = nn.Dropout(p)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        key_padding: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:  # (B, T, E) -> (B, T, E)
        c = self.self_attn._check(x, x, x, mask, key_padding, bias, is_causal, names=("x",) * 3)

        def attend_to(h: torch.Tensor) -> torch.Tensor:
            out = self.self_attn._attend(
                _Checked(h, h, h, c.allowed, c.bias, c.is_causal), need_weights=False
            )
            return cast(torch.Tensor, out)  # weights were not requested

        if self.norm_first:
            return x + self.dropout(attend_to(self.norm1(x)))  # (B, T, E)
        return self.norm1(x + self.dropout(attend_to(x)))  # (B, T, E)

    @classmethod
    def from_numpy(
        cls, layer: np_layers.SelfAttentionLayer, *, device: Any = None, dtype: Any = None
    ) -> SelfAttentionLayer:
        """A module with the parameters, dropout, norm placement and train/eval mode of a
        NumPy :class:`attnlab.SelfAttentionLayer` (not an ``EncoderBlock``: it has no twin)."""
        if type(layer) is not np_layers.SelfAttentionLayer:
            raise AttnlabError(
                f"layer: expected an attnlab.SelfAttentionLayer, got {type(layer).__name__}"
            )
        attn = MultiHeadAttention.from_numpy(layer.attn, device=device, dtype=dtype)
        module = cls(
            attn.d_model, attn.h, layer.dropout.p, layer.norm == "pre",
            num_kv_heads=attn.num_kv_heads, eps=layer.norm1.eps,
            device=device, dtype=attn.q_proj.weight.dtype,
        )
        module.self_attn = attn
        module.norm1 = LayerNorm.from_numpy(
            layer.norm1, device=device, dtype=attn.q_proj.weight.dtype
        )
        return module.train(layer.training)

    def to_numpy(self) -> np_layers.SelfAttentionLayer:
        """The NumPy :class:`attnlab.SelfAttentionLayer` with these parameters, dropout,
        norm placement and train/eval mode (refused for RoPE / ALiBi, see
        :meth:`MultiHeadAttention.to_numpy`)."""
        attn = self.self_attn.to_numpy()
        layer = np_layers.SelfAttentionLayer(
            self.self_attn.d_model, self.self_attn.h, dropout=self.dropout.p,
            norm="pre" if self.norm_first else "post",
            num_kv_heads=self.self_attn.num_kv_heads, eps=self.norm1.eps,
        )
        layer.attn = attn
        layer.norm1 = self.norm1.to_numpy()
        return layer.train(self.training)
