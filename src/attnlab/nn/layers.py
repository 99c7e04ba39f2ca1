"""The blocks around attention: LayerNorm, dropout, feed-forward, and the layers.

Dimension legend: B batch, T sequence length, E model width, F feed-forward width.

Norm placement is always explicit (``norm="post"`` or ``norm="pre"``)::

    post (original Transformer, BERT):  x = LN(x + Dropout(Sublayer(x)))
    pre  (GPT-2 and most modern LLMs):  x = x + Dropout(Sublayer(LN(x)))

Seed 001's text says its layer is Pre-LN, but its code
``x = x + dropout(attn(x)); return norm1(x)`` is Post-LN. attnlab's default is
"post", matching that code; choose "pre" for deep stacks, where it trains more
stably without learning-rate warm-up.

Dropout is active only in training mode (``layer.train()``), and draws from the
layer's own seeded generator, so a run is reproducible. Layers start in
evaluation mode (unlike ``torch.nn.Module``, which starts in training mode):
calling a layer twice on the same input gives the same answer unless you ask
for training.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from ..errors import AttnlabError, ShapeError, as_float_array, check_positive_int, shape_str
from ..hooks import HookSite
from ..init import as_rng, init_weight
from ..special import gelu_erf
from ..trace import Recorder
from .multihead import MultiHeadAttention, linear

__all__ = ["LayerNorm", "Dropout", "FeedForward", "SelfAttentionLayer", "EncoderBlock", "gelu",
           "layer_norm_stats", "layer_norm_inplace"]

NormPlacement = Literal["post", "pre"]


class LayerNorm:
    """Layer normalisation over the last dim.

    Shapes: x (..., E) -> (..., E)

    y = (x - mean) / sqrt(var + eps) * gamma + beta, with the biased variance
    (divide by E), as in ``torch.nn.LayerNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, *, gamma: Any = None, beta: Any = None):
        self.d_model = check_positive_int(d_model, "d_model")
        if isinstance(eps, bool) or not (isinstance(eps, (int, float, np.floating)) and eps > 0):
            raise AttnlabError(f"eps: expected a positive number, got {eps!r}")
        self.eps = float(eps)
        self.gamma = np.ones(d_model) if gamma is None else _vec(gamma, "gamma", d_model)
        self.beta = np.zeros(d_model) if beta is None else _vec(beta, "beta", d_model)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_normalized`` (..., E): the output, after gamma and beta."""
        return ["hook_normalized"]

    def __call__(self, x: Any) -> np.ndarray:
        x_arr = as_float_array(x, "x")
        if x_arr.ndim < 1 or x_arr.shape[-1] != self.d_model:
            raise ShapeError(f"x: expected (..., {self.d_model}), got {shape_str(x_arr.shape)}")
        return self.forward(x_arr)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The normalisation of a checked x (..., E) -> (..., E); no checks."""
        centred, std, _ = layer_norm_stats(x, self.eps)  # (..., E), (..., 1)
        normed = centred / std  # (..., E)
        out = (normed * self.gamma + self.beta).astype(x.dtype, copy=False)
        return out if self.hook_site is None else self.hook_site("hook_normalized", out)


def layer_norm_stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm's statistics over the last axis, safe from overflow.

    Shapes: x (..., E) -> centred (..., E), std (..., 1), m (..., 1), with
    ``centred / std`` the normalised x, and ``m * std`` = √(var(x) + eps).

    Usually centred = x − mean, std = √(var + eps) and m = 1. In a row whose
    squares overflow (|x| near the dtype's largest value, e.g. 1e160 in float64)
    the variance would be inf and the row silently all zeros; there the row is
    divided by m = its largest |x| first (LayerNorm is scale-invariant but for
    eps, which becomes eps / m²).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        centred = x - mean  # (..., E)
        var = np.mean(centred * centred, axis=-1, keepdims=True)  # (..., 1)
    m = np.ones_like(var)  # (..., 1)
    bad = ~np.isfinite(var)  # (..., 1)
    if bad.any():
        m = np.where(bad, np.max(np.abs(x), axis=-1, keepdims=True), m)  # (..., 1)
        xs = x / m  # (..., E), |xs| <= 1 in the rescaled rows
        cs = xs - xs.mean(axis=-1, keepdims=True)  # (..., E)
        with np.errstate(over="ignore"):
            eps_scaled = eps / (m * m)  # (..., 1); m² may overflow: eps / inf = 0
        var_scaled = np.mean(cs * cs, axis=-1, keepdims=True)  # (..., 1)
        # A constant row (its sum overflowed) has var 0 exactly: back to m = 1, std = √eps.
        constant = bad & (var_scaled == 0)
        m = np.where(constant, 1.0, m).astype(var.dtype, copy=False)
        centred = np.where(bad, cs, centred)
        var = np.where(bad, var_scaled, var)
        return centred, np.sqrt(var + np.where(bad & ~constant, eps_scaled, eps)), m
    return centred, np.sqrt(var + eps), m


def layer_norm_inplace(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> np.ndarray:
    """LayerNorm over the last axis, written into ``x`` itself; returns ``x``.

    Shapes: x (..., E) C-contiguous, gamma (E,), beta (E,) -> x. An unchecked
    kernel for a loop that owns its buffers (the checked public op is
    :class:`LayerNorm`). Efficient implementation equivalent to the following,
    up to the rounding of the row sums::

        centred, std, _ = layer_norm_stats(x, eps)
        x[...] = centred / std * gamma + beta

    The row sums are one matrix-vector product and one einsum instead of a
    NumPy reduction per row (about 4x faster for E = 384); a row whose squares
    overflow takes :func:`layer_norm_stats`' rescaling path, as LayerNorm does.
    """
    if not x.flags.c_contiguous:  # reshape would copy, and the result be lost
        raise AttnlabError("x: expected a C-contiguous array to normalise in place")
    E = x.shape[-1]
    rows = x.reshape(-1, E)  # (N, E), a view of x
    with np.errstate(over="ignore", invalid="ignore"):
        mean = rows @ np.ones(E, dtype=rows.dtype)  # (N,) row sums
        mean /= E
        centred = rows - mean[:, None]  # (N, E); x is kept for the overflow path
        var = np.einsum("ij,ij->i", centred, centred)  # (N,) sums of squares
        var /= E
    if not np.isfinite(var).all():
        stats_centred, std, _ = layer_norm_stats(x, eps)  # (..., E), (..., 1)
        np.divide(stats_centred, std, out=x)
    else:
        var += eps
        np.divide(centred, np.sqrt(var)[:, None], out=rows)  # (N, E)
    x *= gamma
    x += beta
    return x


class Dropout:
    """Inverted dropout: zero each element with probability p, scale the rest by 1/(1-p).

    Active only while ``training`` is True; draws from its own seeded generator.
    """

    def __init__(self, p: float = 0.1, *, seed: int | np.random.Generator | None = 0):
        if not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p < 1.0):
            raise AttnlabError(f"p: expected a probability in [0, 1), got {p!r}")
        self.p = float(p)
        self.rng = as_rng(seed)
        self.training = False

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.training or self.p == 0.0:
            return x
        keep = self.rng.random(x.shape) >= self.p  # same shape as x
        return np.where(keep, x / (1.0 - self.p), 0.0).astype(x.dtype, copy=False)


def gelu(x: np.ndarray, approximate: Literal["none", "tanh"] = "none") -> np.ndarray:
    """GELU(x) = x · Φ(x). ``approximate="none"`` uses the exact erf (BERT), "tanh" GPT-2's."""
    x = as_float_array(x, "x", allow_nonfinite=True)  # integers -> float64, never truncated
    if approximate not in ("none", "tanh"):
        raise AttnlabError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return gelu_erf(x)  # x/2 · (1 + erf(x/√2)), float32 in cache-sized chunks


_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": gelu,
    "gelu_tanh": lambda x: gelu(x, "tanh"),
}


class FeedForward:
    """Position-wise feed-forward: act(x W1 + b1) W2 + b2.

    Shapes: x (..., E) -> (..., E); W1 (E, F), W2 (F, E).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        scheme: str = "xavier",
        seed: int | np.random.Generator | None = 0,
    ):
        E = check_positive_int(d_model, "d_model")
        F = check_positive_int(d_ff, "d_ff")
        if activation not in _ACTIVATIONS:
            raise AttnlabError(
                f"activation: expected one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        rng = as_rng(seed)
        self.activation = activation
        self.W1, self.b1 = init_weight(E, F, scheme, rng=rng), np.zeros(F)
        self.W2, self.b2 = init_weight(F, E, scheme, rng=rng), np.zeros(E)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_pre`` (..., F) = x W1 + b1, ``hook_post`` (..., F) = act(hook_pre)."""
        return ["hook_pre", "hook_post"]

    @classmethod
    def from_weights(
        cls, W1: Any, b1: Any, W2: Any, b2: Any, *, activation: str = "relu"
    ) -> FeedForward:
        """Wrap given weights: W1 (E, F), b1 (F,), W2 (F, E), b2 (E,)."""
        w1, w2 = as_float_array(W1, "W1"), as_float_array(W2, "W2")
        if w1.ndim != 2:
            raise ShapeError(f"W1: expected (E, F), got {shape_str(w1.shape)}")
        E, F = w1.shape
        if w2.shape != (F, E):
            raise ShapeError(f"W2: expected (F, E) = ({F}, {E}), got {shape_str(w2.shape)}")
        ffn = cls(E, F, activation=activation)
        ffn.W1, ffn.b1 = w1, _vec(b1, "b1", F)
        ffn.W2, ffn.b2 = w2, _vec(b2, "b2", E)
        return ffn

    def __call__(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        if x.ndim < 1 or x.shape[-1] != self.W1.shape[0]:
            raise ShapeError(f"x: expected (..., {self.W1.shape[0]}), got {shape_str(x.shape)}")
        return self.forward(x)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The feed-forward of a checked x (..., E) -> (..., E); no checks."""
        site = self.hook_site
        if site is None:
            hidden = _ACTIVATIONS[self.activation](linear(x, self.W1, self.b1))  # (..., F)
            return linear(hidden, self.W2, self.b2)  # (..., E)
        pre = site("hook_pre", linear(x, self.W1, self.b1))  # (..., F)
        hidden = site("hook_post", _ACTIVATIONS[self.activation](pre))  # (..., F)
        return linear(hidden, self.W2, self.b2)  # (..., E)


class SelfAttentionLayer:
    """Multi-head self-attention + dropout + residual + LayerNorm (seed 001's layer).

    Shapes: x (B, T, E) or (T, E) -> same shape; ``mask`` broadcastable to
    (B, H, T, S), True = may attend.

    post: LN(x + Dropout(MHA(x)));   pre: x + Dropout(MHA(LN(x)))

    >>> layer = SelfAttentionLayer(8, 2, dropout=0.1, seed=0)
    >>> layer(np.ones((2, 3, 8))).shape
    (2, 3, 8)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.1,
        *,
        norm: NormPlacement = "post",
        num_kv_heads: int | None = None,
        eps: float = 1e-5,
        scheme: str = "xavier",
        v_gain: float = 1.0,
        seed: int | np.random.Generator | None = 0,
    ):
        if norm not in ("post", "pre"):
            raise AttnlabError(f"norm: expected 'post' or 'pre', got {norm!r}")
        rng = as_rng(seed)
        self.norm = norm
        self.attn = MultiHeadAttention.init(
            num_heads, d_model, num_kv_heads=num_kv_heads, scheme=scheme, v_gain=v_gain, seed=rng
        )
        self.norm1 = LayerNorm(d_model, eps)
        self.dropout = Dropout(dropout, seed=rng)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The named points of :meth:`forward` in order (see :mod:`attnlab.hooks`):
        hook_resid_pre, ln1 (its hook_normalized), attn (its points), hook_attn_out,
        hook_resid_post; all (B, T, E) but the attention's."""
        if self.norm == "pre":
            return ["hook_resid_pre", ("ln1", self.norm1), ("attn", self.attn),
                    "hook_attn_out", "hook_resid_post"]
        return ["hook_resid_pre", ("attn", self.attn), "hook_attn_out", ("ln1", self.norm1),
                "hook_resid_post"]

    @property
    def training(self) -> bool:
        return self.dropout.training

    def train(self, mode: bool = True) -> SelfAttentionLayer:
        """Switch dropout on (``mode=True``) or off; returns self."""
        self.dropout.training = bool(mode)
        return self

    def eval(self) -> SelfAttentionLayer:
        return self.train(False)

    def __call__(
        self,
        x: Any,
        *,
        mask: Any = None,
        key_padding: Any = None,
        bias: Any = None,
        is_causal: bool = False,
        recorder: Recorder | None = None,
    ) -> np.ndarray:
        """Shapes: x (B, T, E) or (T, E) -> same; mask broadcastable to (B, H, T, T),
        True = may attend; key_padding bool (B, T), True = a real token."""
        x_arr, _, allowed, bias_arr, _ = self.attn.check_call(
            x, None, mask, key_padding=key_padding, bias=bias, is_causal=is_causal
        )
        return self.forward(x_arr, allowed, bias_arr, recorder=recorder)

    def forward(
        self, x: np.ndarray, allowed: np.ndarray | None = None, bias: np.ndarray | None = None,
        *, recorder: Recorder | None = None,
    ) -> np.ndarray:
        """The sublayer on arguments checked by ``self.attn.check_call``; no checks."""
        site = self.hook_site
        if site is not None:
            x = site("hook_resid_pre", x)  # (B, T, E)
        h = self.attention_sublayer(x, allowed, bias, recorder=recorder)  # (B, T, E)
        return h if site is None else site("hook_resid_post", h)

    def attention_sublayer(
        self, x: np.ndarray, allowed: np.ndarray | None = None, bias: np.ndarray | None = None,
        *, recorder: Recorder | None = None,
    ) -> np.ndarray:
        """post: LN1(x + Drop(MHA(x)));  pre: x + Drop(MHA(LN1(x))). x (B, T, E) -> (B, T, E)."""
        site = self.hook_site
        if self.norm == "post":
            attended = self.attn.forward(x, x, allowed, bias, recorder=recorder)[0]
            if site is not None:
                attended = site("hook_attn_out", attended)  # (B, T, E)
            return self.norm1.forward(x + self.dropout(attended))  # (B, T, E)
        h = self.norm1.forward(x)  # (B, T, E)
        attended = self.attn.forward(h, h, allowed, bias, recorder=recorder)[0]
        if site is not None:
            attended = site("hook_attn_out", attended)  # (B, T, E)
        return x + self.dropout(attended)  # (B, T, E)


class EncoderBlock(SelfAttentionLayer):
    """A full encoder block: the attention sublayer, then a feed-forward sublayer.

    post (BERT): h = LN1(x + Drop(MHA(x)));  out = LN2(h + Drop(FFN(h)))
    pre:         h = x + Drop(MHA(LN1(x)));  out = h + Drop(FFN(LN2(h)))

    Shapes: x (B, T, E) -> (B, T, E)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        activation: str = "gelu",
        dropout: float = 0.1,
        norm: NormPlacement = "post",
        num_kv_heads: int | None = None,
        eps: float = 1e-5,
        scheme: str = "xavier",
        seed: int | np.random.Generator | None = 0,
    ):
        rng = as_rng(seed)
        super().__init__(
            d_model, num_heads, dropout=dropout, norm=norm, num_kv_heads=num_kv_heads,
            eps=eps, scheme=scheme, seed=rng,
        )
        self.ffn = FeedForward(d_model, d_ff, activation=activation, scheme=scheme, seed=rng)
        self.norm2 = LayerNorm(d_model, eps)

    @classmethod
    def from_parts(
        cls,
        attn: MultiHeadAttention,
        norm1: LayerNorm,
        ffn: FeedForward,
        norm2: LayerNorm,
        *,
        norm: NormPlacement = "post",
        dropout: float = 0.0,
        seed: int | np.random.Generator | None = 0,
    ) -> EncoderBlock:
        """Assemble a block from existing parts (e.g. a pretrained model's weights)."""
        if norm not in ("post", "pre"):
            raise AttnlabError(f"norm: expected 'post' or 'pre', got {norm!r}")
        block = cls.__new__(cls)
        block.norm, block.attn, block.norm1, block.ffn, block.norm2 = norm, attn, norm1, ffn, norm2
        block.dropout = Dropout(dropout, seed=seed)
        return block

    def forward(
        self, x: np.ndarray, allowed: np.ndarray | None = None, bias: np.ndarray | None = None,
        *, recorder: Recorder | None = None,
    ) -> np.ndarray:
        """The block on arguments checked by ``self.attn.check_call``; no checks.

        Shapes: x (B, T, E) -> (B, T, E). ``__call__`` (inherited) checks x,
        mask, key_padding, bias and is_causal once and calls this.
        """
        site = self.hook_site
        if site is None:
            h = self.attention_sublayer(x, allowed, bias, recorder=recorder)  # (B, T, E)
            if self.norm == "post":
                return self.norm2.forward(h + self.dropout(self.ffn.forward(h)))  # (B, T, E)
            return h + self.dropout(self.ffn.forward(self.norm2.forward(h)))  # (B, T, E)
        x = site("hook_resid_pre", x)  # (B, T, E)
        h = site("hook_resid_mid", self.attention_sublayer(
            x, allowed, bias, recorder=recorder))  # (B, T, E)
        if self.norm == "post":
            mlp_out = site("hook_mlp_out", self.ffn.forward(h))  # (B, T, E)
            out = self.norm2.forward(h + self.dropout(mlp_out))  # (B, T, E)
        else:
            mlp_out = site("hook_mlp_out", self.ffn.forward(self.norm2.forward(h)))  # (B, T, E)
            out = h + self.dropout(mlp_out)  # (B, T, E)
        return site("hook_resid_post", out)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The named points of :meth:`forward` in order (see :mod:`attnlab.hooks`).

        post: hook_resid_pre, attn.*, hook_attn_out, ln1, hook_resid_mid (= LN1's
        output: what the MLP reads and adds to), mlp.*, hook_mlp_out, ln2,
        hook_resid_post; pre: hook_resid_pre, ln1, attn.*, hook_attn_out,
        hook_resid_mid, ln2, mlp.*, hook_mlp_out, hook_resid_post.
        """
        if self.norm == "pre":
            return ["hook_resid_pre", ("ln1", self.norm1), ("attn", self.attn), "hook_attn_out",
                    "hook_resid_mid", ("ln2", self.norm2), ("mlp", self.ffn), "hook_mlp_out",
                    "hook_resid_post"]
        return ["hook_resid_pre", ("attn", self.attn), "hook_attn_out", ("ln1", self.norm1),
                "hook_resid_mid", ("mlp", self.ffn), "hook_mlp_out", ("ln2", self.norm2),
                "hook_resid_post"]


def _vec(value: Any, name: str, size: int) -> np.ndarray:
    arr = as_float_array(value, name)
    if arr.shape != (size,):
        raise ShapeError(f"{name}: expected ({size},), got {shape_str(arr.shape)}")
    return arr
