"""The layers around attention: dropout, the self-attention layer and the encoder block.

Their parts live one concept per module: :mod:`attnlab.nn.norm` (LayerNorm),
:mod:`attnlab.nn.feedforward` (the feed-forward sublayer, GELU) and
:mod:`attnlab.nn.multihead`; their names are importable from here too.

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

from typing import Any, Literal

import numpy as np

from ..errors import AttnlabError
from ..hooks import HookSite
from ..init import as_rng
from ..trace import Recorder
from .feedforward import FeedForward, gelu
from .multihead import MultiHeadAttention
from .norm import LayerNorm, layer_norm_inplace, layer_norm_stats

# LayerNorm, FeedForward and gelu are defined in .norm and .feedforward and stay importable
# from here, where they were first defined.
__all__ = ["LayerNorm", "Dropout", "FeedForward", "SelfAttentionLayer", "EncoderBlock", "gelu",
           "layer_norm_stats", "layer_norm_inplace"]

NormPlacement = Literal["post", "pre"]


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
