"""Multi-head attention with explicit parameters, self- and cross-attention, and GQA.

Weights are stored as (in, out) and applied as ``X @ W`` like the seeds do
(``torch.nn.Linear`` stores (out, in): ``W = linear.weight.T``); their head
layout, the split into heads and the projection are :mod:`attnlab.nn.heads`'.

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length, D head dim, Dv value head dim, E model width (Ekv for the
context in cross-attention).

Formula, for head h (with GQA, head h reads key/value head h // (H / Hkv))::

    Q_h = X Wq[:, h]       K_g = C Wk[:, g]      V_g = C Wv[:, g]
    head_h = softmax(Q_h K_gᵀ · scale  [masked]) V_g     scale = 1/√D unless given
    out = concat(head_1, ..., head_H) Wo + bo

Seed 000's ``multi_head_attention`` draws a fresh random Wq/Wk/Wv per head and
concatenates; that is exactly this with Wq = [Wq_1 | ... | Wq_H] and Wo = I.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..checks import (
    as_array,
    as_bool_mask,
    as_float_array,
    as_vector,
    check_broadcastable,
    check_flag,
    check_positive_int,
    check_scale,
    shape_str,
)
from ..errors import AttnlabError, ShapeError
from ..gqa import repeat_kv
from ..hooks import HookSite, attached
from ..init import as_rng, init_weight
from ..kernel import (
    abs_max,
    attend,
    check_mask_and_bias,
    check_score_range,
    check_softcap,
    scaled_scores,
)
from ..masked_softmax import stable_softmax
from ..positional_relative import RotaryEmbedding, alibi_bias
from ..shapes import check_key_padding_shape, check_module_inputs
from ..trace import Recorder
from .heads import check_head_layout, linear, merge_heads, split_heads
from .recording import recording_hooks

# linear, split_heads and merge_heads are defined in .heads and stay importable from here.
__all__ = ["MultiHeadAttention", "linear", "split_heads", "merge_heads"]


@dataclass
class MultiHeadAttention:
    """Multi-head (and grouped-query) attention with explicit NumPy parameters.

    Parameters (all (in, out)):
        Wq (E, H*D), Wk (Ekv, Hkv*D), Wv (Ev, Hkv*Dv), Wo (H*Dv, E_out)
        (Ev = Ekv unless values come from their own input, torch's ``vdim``)
        bq (H*D,), bk (Hkv*D,), bv (Hkv*Dv,), bo (E_out,) — optional biases
        num_heads H, num_kv_heads Hkv (default H; H must be a multiple of Hkv)
        rope   an :class:`attnlab.positional_relative.RotaryEmbedding` applied to queries and
               keys per head: keys at positions 0 .. S-1, queries at S-T .. S-1
               (bottom-right, as ``is_causal``), so T <= S is required
        alibi  add ``alibi_bias(H, T, S)`` to the scores (combine with ``is_causal``)
        scale  the factor of the scores q·kᵀ before the softmax: None = 1/√D (the
               paper's), a number = that factor (1.0: no scaling)

    Build random ones with :meth:`init`; build from arrays directly to check
    against another implementation.

    A call returns an ``(out, weights)`` pair (``weights`` is None unless
    ``return_weights``), the same as the torch twin and ``torch.nn.MultiheadAttention``;
    masks and flags are keyword-only.

    >>> mha = MultiHeadAttention.init(2, 8, seed=0)
    >>> x = np.ones((1, 3, 8))
    >>> out, _ = mha(x)
    >>> out.shape
    (1, 3, 8)
    >>> out, weights = mha(x, return_weights=True)
    >>> weights.shape
    (1, 2, 3, 3)
    """

    Wq: np.ndarray
    Wk: np.ndarray
    Wv: np.ndarray
    Wo: np.ndarray
    num_heads: int
    num_kv_heads: int | None = None
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    rope: RotaryEmbedding | None = None
    alibi: bool = False
    scale: float | None = None
    head_dim: int = field(init=False)
    value_head_dim: int = field(init=False)
    #: Set by :func:`attnlab.hooks.attached` while hooks are attached (see hook_points).
    hook_site: ClassVar[HookSite | None] = None

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The named points of :meth:`forward`, in order (see :mod:`attnlab.hooks`):
        hook_q (B, H, T, D), hook_k (B, Hkv, S, D), hook_v (B, Hkv, S, Dv), hook_rot_q,
        hook_rot_k (with RoPE), hook_attn_scores and hook_pattern (B, H, T, S), hook_z
        (B, H, T, Dv), hook_result (B, H, T, E_out, opt-in)."""
        rotated = ["hook_rot_q", "hook_rot_k"] if self.rope is not None else []
        return ["hook_q", "hook_k", "hook_v", *rotated, "hook_attn_scores", "hook_pattern",
                "hook_z", "hook_result"]

    def __post_init__(self) -> None:
        layout = check_head_layout(self.Wq, self.Wk, self.Wv, self.Wo, self.num_heads,
                                   self.num_kv_heads)
        self.Wq, self.Wk, self.Wv, self.Wo = layout.Wq, layout.Wk, layout.Wv, layout.Wo
        self.num_heads, self.num_kv_heads = layout.H, layout.Hkv
        D, Dv = layout.D, layout.Dv
        self.head_dim, self.value_head_dim = D, Dv
        if self.rope is not None:
            if not isinstance(self.rope, RotaryEmbedding):
                raise AttnlabError(
                    f"rope: expected an attnlab.positional_relative.RotaryEmbedding or None, "
                    f"got {type(self.rope).__name__}"
                )
            if self.rope.head_dim != D:
                raise AttnlabError(
                    f"rope: expected head_dim {D} to match Wq's heads, got {self.rope.head_dim}"
                )
        self.alibi = check_flag(self.alibi, "alibi")
        self.scale = None if self.scale is None else check_scale(self.scale, D)
        self.bq, self.bk, self.bv, self.bo = (
            None if b is None else as_vector(b, name, w.shape[1])
            for b, name, w in ((self.bq, "bq", self.Wq), (self.bk, "bk", self.Wk),
                               (self.bv, "bv", self.Wv), (self.bo, "bo", self.Wo)))

    @classmethod
    def init(
        cls,
        num_heads: int,
        d_model: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        d_context: int | None = None,
        d_value_context: int | None = None,
        use_bias: bool = True,
        scheme: str = "xavier",
        v_gain: float = 1.0,
        seed: int | np.random.Generator | None = 0,
        dtype: Any = np.float64,
        rope: bool = False,
        rope_base: float = 10000.0,
        alibi: bool = False,
        scale: float | None = None,
    ) -> MultiHeadAttention:
        """Random parameters: Xavier/Glorot by default, zero biases.

        ``head_dim`` defaults to d_model // num_heads; ``d_context`` (Ekv) is the
        width of the keys/values' input for cross-attention (default d_model), and
        ``d_value_context`` (Ev) that of the values' when they come from their own
        input (default Ekv; torch's ``kdim`` and ``vdim``).
        ``scheme`` is "xavier", "xavier_normal" or "normal" (the seeds' randn);
        ``v_gain`` < 1 scales Wv down (seed 001's "smaller scale for V").
        ``rope=True`` rotates queries and keys (RoPE, base ``rope_base``);
        ``alibi=True`` adds ALiBi's per-head linear bias; ``scale`` multiplies the
        scores (None: 1/√head_dim). ``use_bias=False``
        leaves out bq, bk, bv and bo (``bias`` is always the additive score bias
        of a call, never a flag).
        """
        E = check_positive_int(d_model, "d_model")
        H = check_positive_int(num_heads, "num_heads")
        Hkv = H if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
        if head_dim is None:
            if E % H:
                raise AttnlabError(
                    f"d_model: expected a multiple of num_heads = {H} (or pass head_dim), got {E}"
                )
            head_dim = E // H
        D = check_positive_int(head_dim, "head_dim")
        Ekv = E if d_context is None else check_positive_int(d_context, "d_context")
        Ev = Ekv if d_value_context is None else check_positive_int(
            d_value_context, "d_value_context"
        )
        try:
            float_dtype = np.dtype(dtype)
        except (TypeError, ValueError, UnicodeError):  # not a dtype, e.g. a tensor
            raise AttnlabError(f"dtype: expected a float dtype, got {dtype!r}") from None
        if not np.issubdtype(float_dtype, np.floating):  # an int dtype would round W to 0
            raise AttnlabError(
                f"dtype: expected a float dtype (float32, float64), got {float_dtype}"
            )
        use_bias, rope = check_flag(use_bias, "use_bias"), check_flag(rope, "rope")
        rng = as_rng(seed)
        def zeros(n: int) -> np.ndarray | None:
            return np.zeros(n, dtype=dtype) if use_bias else None

        return cls(
            Wq=init_weight(E, H * D, scheme, rng=rng).astype(dtype),
            Wk=init_weight(Ekv, Hkv * D, scheme, rng=rng).astype(dtype),
            Wv=init_weight(Ev, Hkv * D, scheme, rng=rng, gain=v_gain, std=v_gain).astype(dtype),
            Wo=init_weight(H * D, E, scheme, rng=rng).astype(dtype),
            num_heads=H,
            num_kv_heads=Hkv,
            bq=zeros(H * D), bk=zeros(Hkv * D), bv=zeros(Hkv * D), bo=zeros(E),
            rope=RotaryEmbedding(D, base=rope_base) if rope else None,
            alibi=alibi,
            scale=scale,
        )

    def score_scale(self) -> float:
        """The factor of the scores q·kᵀ: ``scale``, or 1/√D when it is None."""
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale

    def parameters(self) -> dict[str, np.ndarray]:
        """Name -> array of every parameter that is set (biases may be None)."""
        names = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def project(
        self, x: np.ndarray, context: np.ndarray, value: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K, V split into heads: (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv).

        Keys come from ``context``, values from ``value`` (default: ``context``)."""
        q = linear(x, self.Wq, self.bq)  # (..., T, H*D)
        k = linear(context, self.Wk, self.bk)  # (..., S, Hkv*D)
        v = linear(context if value is None else value, self.Wv, self.bv)  # (..., S, Hkv*Dv)
        Hkv = self.num_kv_heads or self.num_heads  # an int after __post_init__
        return (
            split_heads(q, self.num_heads),  # (..., H, T, D)
            split_heads(k, Hkv),  # (..., Hkv, S, D)
            split_heads(v, Hkv),  # (..., Hkv, S, Dv)
        )

    def expand_kv(self, kv: np.ndarray) -> np.ndarray:
        """GQA: repeat each key/value head for the H / Hkv query heads that share it.

        (..., Hkv, S, D) -> (..., H, S, D); query head h reads kv head h // (H / Hkv).
        """
        return repeat_kv(kv, self.num_heads // (self.num_kv_heads or self.num_heads))

    def prepare_inputs(
        self, x: Any, context: Any = None, mask: Any = None, key_padding: Any = None
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """Validate the inputs of a call; fold ``key_padding`` into ``mask``.

        Returns x (B, T, E), context (B, S, Ekv) (x itself for self-attention) and
        the combined mask (or None). Shared by the forward and the backward pass.
        """
        x_arr = as_float_array(x, "x")
        ctx = x_arr if context is None else as_float_array(context, "context")
        lead, _, S = check_module_inputs(x_arr.shape, ctx.shape, ctx.shape, self.Wq.shape[0],
                                         self.Wk.shape[0], ("x", "context", "context"))
        if key_padding is not None:
            kp = as_array(key_padding, "key_padding")
            check_key_padding_shape(kp.shape, str(kp.dtype), kp.dtype == np.bool_, (*lead, S))
            kp = kp[..., None, None, :]  # (B, 1, 1, S)
            if mask is not None:
                # Validate before `&`, which would raise a bare TypeError/ValueError.
                mask = as_bool_mask(mask, "mask")
                scores = (*x_arr.shape[:-2], self.num_heads, x_arr.shape[-2], ctx.shape[-2])
                check_broadcastable(mask.shape, scores, "mask", "(B, H, T, S)")
            mask = kp if mask is None else (mask & kp)
        return x_arr, ctx, mask

    def __call__(
        self,
        x: Any,
        context: Any = None,
        value: Any = None,
        *,
        mask: Any = None,
        key_padding: Any = None,
        bias: Any = None,
        is_causal: bool = False,
        return_weights: bool = False,
        average_attn_weights: bool = False,
        softcap: float | None = None,
        recorder: Recorder | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Attend from ``x`` to ``context`` (default: ``x`` itself); returns ``(out, weights)``,
        ``weights`` None unless ``return_weights``.

        Shapes:
            x           (B, T, E) or (T, E)
            context     (B, S, Ekv) or (S, Ekv): the keys' input (and the values'
                        unless ``value`` is given); None = self-attention
            value       (B, S, Ev) or (S, Ev): the values' input; None = ``context``
            mask        bool, broadcastable to (B, H, T, S); True = may attend
            key_padding bool (B, S); True = a real token (may be attended to)
            bias        float, broadcastable to (B, H, T, S), e.g. ALiBi (H, T, S)
            softcap     c: scores c·tanh(s / c) before bias and mask (Gemma 2), or None
            recorder    an :class:`attnlab.trace.Recorder` to keep Q, K, V, scores,
                        weights, per-head outputs (per head, one batch item)
            ->          out (B, T, E_out), and per-head weights (B, H, T, S) if
                        ``return_weights`` ((B, T, S), their mean over heads, with
                        ``average_attn_weights``, torch's default), else None

        Masks and flags are keyword-only (torch's 4th positional argument is
        ``key_padding_mask``, True = padding: the opposite of attnlab's masks).
        """
        return_weights = check_flag(return_weights, "return_weights")
        average = check_flag(average_attn_weights, "average_attn_weights")
        x_arr, ctx, allowed, bias_arr, is_causal = self.check_call(
            x, context, mask, key_padding=key_padding, bias=bias, is_causal=is_causal
        )
        value_arr = self.check_value(value, ctx)
        out, weights = self.forward(x_arr, ctx, allowed, bias_arr, recorder=recorder,
                                    value=value_arr, softcap=check_softcap(softcap))
        if not return_weights:
            return out, None
        return out, (weights.mean(axis=-3) if average else weights)  # (B, T, S) or (B, H, T, S)

    def check_value(self, value: Any, context: np.ndarray) -> np.ndarray | None:
        """The values' own input: (B, S, Ev), the keys' batch and length. -> a float array
        (None: the values read ``context``, which needs Wv to read its width)."""
        if value is None:
            if self.Wv.shape[0] != self.Wk.shape[0]:
                raise ShapeError(
                    f"value: expected an input of width {self.Wv.shape[0]} (Wv reads its own "
                    f"input, Wk one of width {self.Wk.shape[0]}), got None"
                )
            return None
        if isinstance(value, np.ndarray) and value.dtype == np.bool_:
            raise AttnlabError(
                "value: expected a float array, got a bool one (masks are keyword-only: "
                "mask=..., key_padding=...)"
            )
        arr = as_float_array(value, "value")
        expected = (*context.shape[:-1], self.Wv.shape[0])
        if arr.shape != expected:
            raise ShapeError(
                f"value: expected {shape_str(expected)} (the keys' batch and length, Wv's "
                f"width), got {shape_str(arr.shape)}"
            )
        return arr

    def check_call(
        self, x: Any, context: Any = None, mask: Any = None, *, key_padding: Any = None,
        bias: Any = None, is_causal: Any = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, bool]:
        """Validate the arguments of a call, once; returns what :meth:`forward` takes.

        -> x (B, T, E), context (B, S, Ekv) (x itself for self-attention), the
        allowed mask (mask & key_padding & causal; None if none), the bias and
        ``is_causal`` as a bool. The layers around this module call it at their
        own boundary and then :meth:`forward`, so nothing is checked twice.
        """
        x_arr, ctx, mask = self.prepare_inputs(x, context, mask, key_padding)
        T, S = x_arr.shape[-2], ctx.shape[-2]
        if self.rope is not None and T > S:
            raise AttnlabError(
                f"x: RoPE places queries at positions S - T .. S - 1, expected T <= S, "
                f"got T = {T}, S = {S}"
            )
        score_shape = (*x_arr.shape[:-2], self.num_heads, T, S)  # (B, H, T, S)
        dtype = np.result_type(x_arr, self.Wq)
        allowed, bias_arr, is_causal = check_mask_and_bias(
            mask, bias, is_causal, score_shape, dtype
        )
        return x_arr, ctx, allowed, bias_arr, is_causal

    def forward(
        self, x: np.ndarray, context: np.ndarray, allowed: np.ndarray | None = None,
        bias: np.ndarray | None = None, *, recorder: Recorder | None = None,
        value: np.ndarray | None = None, softcap: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The computation of a call, on arguments already checked by :meth:`check_call`.

        Shapes: x (B, T, E), context (B, S, Ekv), value (B, S, Ev) (default: context),
        allowed and bias broadcastable to (B, H, T, S) -> out (B, T, E_out), weights
        (B, H, T, S). No checks but the scores' overflow bound (O(T·D), read from q and k).
        """
        if recorder is not None:  # recording is reading the hook points
            recorder.add("X", x, "X (this layer's input)")
            with attached(self, recording_hooks(self, recorder)):
                out, weights = self.forward(x, context, allowed, bias, value=value,
                                            softcap=softcap)
            recorder.add("projected", out, "out = concat(heads)·Wo + bo")
            return out, weights
        site = self.hook_site  # None unless hooks are attached (attnlab.hooks)
        q, k, v = self.project(x, context, value)  # (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
        if site is not None:
            q, k, v = site("hook_q", q), site("hook_k", k), site("hook_v", v)
        T, S = q.shape[-2], k.shape[-2]
        if self.rope is not None:
            q = self.rope(q, np.arange(S - T, S))  # (B, H, T, D)
            k = self.rope(k, np.arange(S))  # (B, Hkv, S, D)
            if site is not None:
                q, k = site("hook_rot_q", q), site("hook_rot_k", k)
        if self.alibi:
            slopes = alibi_bias(self.num_heads, T, S).astype(q.dtype)  # (H, T, S)
            bias = slopes if bias is None else slopes + bias  # (B, H, T, S)
        k, v = self.expand_kv(k), self.expand_kv(v)  # (B, H, S, D), (B, H, S, Dv)
        scale = self.score_scale()
        if bias is not None:
            bias = bias.astype(q.dtype, copy=False)
        check_score_range(
            abs_max(q), abs_max(k), self.head_dim, scale, q.dtype,
            bias_max=float(np.max(bias)) if bias is not None and bias.size else 0.0,
        )
        if site is not None and (site.wants("hook_attn_scores") or site.wants("hook_pattern")):
            # attend's steps one by one, so that the hooks see (and may replace) each.
            scores = site("hook_attn_scores", scaled_scores(
                q, k, allowed, bias, scale, softcap=softcap))  # (B, H, T, S)
            weights = site("hook_pattern", stable_softmax(scores))  # (B, H, T, S)
            heads = weights @ v  # (B, H, T, Dv)
        else:
            heads, weights = attend(q, k, v, allowed, bias, scale,
                                    softcap=softcap)  # (B, H, T, Dv), (B, H, T, S)
        if site is not None:
            heads = site("hook_z", heads)  # (B, H, T, Dv)
        if site is not None and site.wants("hook_result"):
            H, Dv = heads.shape[-3], heads.shape[-1]
            per_head_wo = self.Wo.reshape(H, Dv, self.Wo.shape[1])  # (H, Dv, E_out)
            result = site("hook_result", np.einsum(
                "...htd,hde->...hte", heads, per_head_wo))  # (B, H, T, E_out)
            out = result.sum(axis=-3)  # (B, T, E_out)
            if self.bo is not None:
                out = out + self.bo
        else:
            out = linear(merge_heads(heads), self.Wo, self.bo)  # (B, T, E_out)
        return out, weights
