"""The blocks around attention as ``torch.nn`` modules: LayerNorm and seed 001's layer.

Each behaves identically to its NumPy twin in :mod:`attnlab.nn.layers` on the same
parameters, which move both ways with ``from_numpy`` / ``to_numpy``. Unlike the
NumPy layers, the modules start in training mode (torch's convention): call
``.eval()`` to turn dropout off.

Dimension legend: B batch, H heads, T sequence length, E model width.

Norm placement, as in the core: ``norm="post"`` (seed 001's code,
``LN(x + Dropout(MHA(x)))``) or ``norm="pre"`` (``x + Dropout(MHA(LN(x)))``).

Checks: shapes, dtypes and devices at every call; NaN/Inf in the inputs only
under :func:`attnlab.torch.debug_checks`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checks import check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..hooks import HookSite
from ..nn import layers as np_layers
from . import debug
from .checks import check_module_dtype, check_positive_float, check_probability, module_input
from .multihead import MultiHeadAttention, MultiHeadInputs
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

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_normalized`` (..., E): the output, after weight and bias."""
        return ["hook_normalized"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., E)
        out = self.normalize(x)
        return out if self.hook_site is None else self.hook_site("hook_normalized", out)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., E)
        """The checked normalisation, without the hook point."""
        x = module_input(x, "x", self.weight)
        E = self.normalized_shape[0]
        if x.ndim < 1 or x.shape[-1] != E:
            raise ShapeError(f"x: expected (..., {E}), got {shape_str(x.shape)}")
        if debug.debug_checks_enabled():
            debug.check_finite([("x", x)])
        out = super().forward(x)
        if torch.compiler.is_compiling():
            # No read-back inside a graph: pick the rescaled rows element-wise instead.
            return torch.where(torch.isfinite(out), out, self._rescaled(x))
        # Eager: one reduction and one read-back. A normalised row is at most
        # sqrt(E)·|weight| + |bias|, so the sum is finite unless a row overflowed (or the
        # input held NaN/Inf, which the rescaled rows keep). Meta tensors hold no values.
        if x.numel() and x.device.type != "meta" and not bool(
                torch.isfinite(out.detach().sum())):
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
    (B, H, T, S), True = may attend; ``key_padding`` bool (B, T), True = a real token.

    ``norm="post"`` (seed 001's code): ``norm1(x + dropout(self_attn(x)))``;
    ``norm="pre"``: ``x + dropout(self_attn(norm1(x)))``. Other keyword arguments
    go to :class:`MultiHeadAttention` (whose own dropout stays 0, as in the seed).

    >>> layer = SelfAttentionLayer(8, 2).eval()
    >>> layer(torch.ones(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.1,
        *,
        norm: np_layers.NormPlacement = "post",
        num_kv_heads: int | None = None,
        eps: float = 1e-5,
        use_bias: bool = True,
        v_gain: float = 1.0,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_interleaved: bool = False,
        alibi: bool = False,
    ) -> None:
        super().__init__()
        p = check_probability(dropout, "dropout")
        if norm not in ("post", "pre"):
            raise AttnlabError(f"norm: expected 'post' or 'pre', got {norm!r}")
        self.norm: np_layers.NormPlacement = norm
        self.self_attn = MultiHeadAttention(
            num_heads, d_model, dropout=0.0, num_kv_heads=num_kv_heads, use_bias=use_bias,
            v_gain=v_gain, generator=generator, device=device, dtype=dtype, rope=rope,
            rope_base=rope_base, rope_interleaved=rope_interleaved, alibi=alibi,
        )
        self.norm1 = LayerNorm(d_model, eps, device=device, dtype=dtype)
        self.dropout = nn.Dropout(p)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The NumPy twin's names, in the same order (see :mod:`attnlab.hooks`)."""
        if self.norm == "pre":
            return ["hook_resid_pre", ("ln1", self.norm1), ("attn", self.self_attn),
                    "hook_attn_out", "hook_resid_post"]
        return ["hook_resid_pre", ("attn", self.self_attn), "hook_attn_out",
                ("ln1", self.norm1), "hook_resid_post"]

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        key_padding: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:  # (B, T, E) -> (B, T, E)
        c = self.self_attn.check_inputs(x, x, x, mask, key_padding, bias, is_causal,
                                        names=("x",) * 3)

        site = self.hook_site

        def attend_to(h: torch.Tensor) -> torch.Tensor:
            out = self.self_attn.forward_checked(
                MultiHeadInputs(h, h, h, c.allowed, c.bias, c.is_causal)
            )[0]
            return out if site is None else site("hook_attn_out", out)  # (B, T, E)

        if site is not None:
            x = site("hook_resid_pre", x)
        if self.norm == "pre":
            out = x + self.dropout(attend_to(self.norm1(x)))  # (B, T, E)
        else:
            out = self.norm1(x + self.dropout(attend_to(x)))  # (B, T, E)
        return out if site is None else site("hook_resid_post", out)

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
            attn.d_model, attn.num_heads, layer.dropout.p, norm=layer.norm,
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
            self.self_attn.d_model, self.self_attn.num_heads, dropout=self.dropout.p,
            norm=self.norm,
            num_kv_heads=self.self_attn.num_kv_heads, eps=self.norm1.eps,
        )
        layer.attn = attn
        layer.norm1 = self.norm1.to_numpy()
        return layer.train(self.training)
