"""Hook points inside a model built from attnlab blocks: each head's output and the
residual stream after each block, read or replaced while the model runs.

:func:`hooked` is a context manager: inside it, ``model.layers`` is a list of
:class:`HookedLayer` wrappers that call the hooks; on leaving (normally or by an
exception) the model's own list of layers is put back. Nothing in the blocks
themselves is changed, so a hooked model and its weights stay shared safely, and
hooks never outlive their ``with`` block (TransformerLens's global hooks left
behind after an exception are the failure this avoids). Contexts nest: an inner
one runs its hooks after the outer one's.

Two hook points per layer ``l`` (0-based):

``heads``     ``hook(l, heads) -> heads | None``, heads (B, H, T, Dv): every head's
              output ``weights·V`` before the output projection, that is the
              head's slice of the concatenation that ``Wo`` reads. Return a new
              array (or modify and return None) to replace it.
``residual``  ``hook(l, x) -> x | None``, x (B, T, E): the block's output, the
              residual stream that the next block reads.

A model qualifies if it has a ``layers`` list of blocks (:class:`attnlab.EncoderBlock`
or :class:`attnlab.SelfAttentionLayer`, e.g. :class:`attnlab.models.BertModel`) whose
``attn`` is an :class:`attnlab.MultiHeadAttention`. A hooked layer is not an
``EncoderBlock``, so a BERT model runs its plain per-block path (never the fused
one, which has no hook points) while hooks are in place.

Dimension legend: B batch, L layers, H heads, T tokens, S keys, D head dim,
Dv value head dim, E model width.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..kernel import abs_max, attend, check_score_range
from ..nn.layers import SelfAttentionLayer
from ..nn.multihead import MultiHeadAttention, linear, merge_heads
from ..positional_relative import alibi_bias
from ..trace import Recorder

__all__ = ["HeadHook", "HookedAttention", "HookedLayer", "ResidualHook", "check_model",
           "hooked"]

HeadHook = Callable[[int, np.ndarray], "np.ndarray | None"]
ResidualHook = Callable[[int, np.ndarray], "np.ndarray | None"]


def check_model(model: Any) -> list[SelfAttentionLayer]:
    """The blocks of ``model`` (its ``layers``), or AttnlabError saying what is missing."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise AttnlabError(f"model: expected a model with a non-empty `layers` list of attnlab "
                           f"blocks (e.g. attnlab.models.BertModel), got {type(model).__name__}")
    for i, layer in enumerate(layers):
        base = layer.block if isinstance(layer, HookedLayer) else layer
        if not isinstance(base, SelfAttentionLayer) or not isinstance(
                base.attn, MultiHeadAttention):
            raise AttnlabError(f"model: expected layers[{i}] to be an attnlab EncoderBlock or "
                               f"SelfAttentionLayer with a MultiHeadAttention, got "
                               f"{type(base).__name__}")
    return layers


class HookedAttention:
    """A :class:`MultiHeadAttention` whose per-head outputs pass through hooks.

    Computes what ``mha.forward`` computes (the same public steps: project, RoPE,
    ALiBi, GQA expansion, :func:`attnlab.kernel.attend`, ``Wo``), with the head
    hooks applied to ``heads`` (B, H, T, Dv) between the attention and ``Wo``.
    Every other attribute is the wrapped module's.
    """

    def __init__(self, mha: MultiHeadAttention, layer: int, hooks: Sequence[HeadHook]):
        self.mha, self.layer, self.hooks = mha, layer, tuple(hooks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mha, name)

    def forward(
        self, x: np.ndarray, context: np.ndarray, allowed: np.ndarray | None = None,
        bias: np.ndarray | None = None, *, recorder: Recorder | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """x (B, T, E), context (B, S, Ekv) -> out (B, T, E_out), weights (B, H, T, S)."""
        mha = self.mha
        q, k, v = mha.project(x, context)  # (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
        T, S = q.shape[-2], k.shape[-2]
        if mha.rope is not None:
            q = mha.rope(q, np.arange(S - T, S))  # (B, H, T, D)
            k = mha.rope(k, np.arange(S))  # (B, Hkv, S, D)
        if mha.alibi:
            slopes = alibi_bias(mha.num_heads, T, S).astype(q.dtype)  # (H, T, S)
            bias = slopes if bias is None else slopes + bias  # (B, H, T, S)
        k, v = mha.expand_kv(k), mha.expand_kv(v)  # (B, H, S, D), (B, H, S, Dv)
        scale = 1.0 / math.sqrt(mha.head_dim)
        if bias is not None:
            bias = bias.astype(q.dtype, copy=False)
        check_score_range(
            abs_max(q), abs_max(k), mha.head_dim, scale, q.dtype,
            bias_max=float(np.max(bias)) if bias is not None and bias.size else 0.0,
        )
        heads, weights = attend(q, k, v, allowed, bias, scale)  # (B, H, T, Dv), (B, H, T, S)
        if recorder is not None:  # what the heads computed, before any hook replaced it
            recorder.add("X", x, "X (this layer's input)")
            recorder.add_heads("Q", q, "Q = X·Wq + bq")
            recorder.add_heads("K", k, "K = X·Wk + bk")
            recorder.add_heads("V", v, "V = X·Wv + bv")
            if recorder.wants("scores") or recorder.wants("scaled"):
                scores = q @ np.swapaxes(k, -1, -2)  # (B, H, T, S)
                recorder.add_heads("scores", scores, "scores = Q·Kᵀ")
                recorder.add_heads("scaled", scores / np.sqrt(mha.head_dim),
                                   f"scaled = scores / √{mha.head_dim}")
            recorder.add_heads("weights", weights, "weights = softmax(scaled + mask, axis=-1)")
            recorder.add_heads("output", heads, "output = weights·V")
        for hook in self.hooks:
            replaced = hook(self.layer, heads)
            if replaced is not None:
                if replaced.shape != heads.shape:
                    raise AttnlabError(f"heads hook: expected an array of shape {heads.shape} "
                                       f"(B, H, T, Dv), got {np.shape(replaced)}")
                heads = replaced
        out = linear(merge_heads(heads), mha.Wo, mha.bo)  # (B, T, E_out)
        if recorder is not None:
            recorder.add("projected", out, "out = concat(heads)·Wo + bo")
        return out, weights


class HookedLayer:
    """A block of the model, run with hooks on its heads and on its output.

    ``forward`` has the block's own signature; attributes are the block's (its
    ``attn`` is the :class:`HookedAttention`).
    """

    def __init__(self, layer: int, block: SelfAttentionLayer, head_hooks: Sequence[HeadHook],
                 residual_hooks: Sequence[ResidualHook]):
        self.layer, self.block = layer, block
        self.head_hooks, self.residual_hooks = tuple(head_hooks), tuple(residual_hooks)
        self.attn = HookedAttention(block.attn, layer, self.head_hooks)
        self._inner = copy.copy(block)  # the block's own forward, reading the hooked attn
        self._inner.attn = self.attn  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.block, name)

    def __call__(self, x: Any, mask: Any = None, *, key_padding: Any = None, bias: Any = None,
                 is_causal: bool = False, recorder: Recorder | None = None) -> np.ndarray:
        """The block's call (checks once, as ``SelfAttentionLayer.__call__``), hooked."""
        x_arr, _, allowed, bias_arr, _ = self.attn.check_call(
            x, None, mask, key_padding=key_padding, bias=bias, is_causal=is_causal)
        return self.forward(x_arr, allowed, bias_arr, recorder=recorder)

    def forward(self, x: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        """The block's forward (x (B, T, E) -> (B, T, E)), then the residual hooks."""
        out = self._inner.forward(x, *args, **kwargs)  # (B, T, E)
        for hook in self.residual_hooks:
            replaced = hook(self.layer, out)
            if replaced is not None:
                if replaced.shape != out.shape:
                    raise AttnlabError(f"residual hook: expected an array of shape {out.shape} "
                                       f"(B, T, E), got {np.shape(replaced)}")
                out = replaced
        return out


@contextmanager
def hooked(
    model: Any, *, heads: HeadHook | None = None, residual: ResidualHook | None = None,
) -> Iterator[Any]:
    """Run ``model`` with hooks on every layer's head outputs and residual stream.

    ``heads(l, heads (B, H, T, Dv))`` and ``residual(l, x (B, T, E))`` are called
    for every layer ``l``; each may return a replacement (same shape) or None.
    Yields the model; on exit its ``layers`` are its own again, even after an
    exception.

    >>> import numpy as np
    >>> from attnlab import EncoderBlock
    >>> class Stack:
    ...     def __init__(self):
    ...         self.layers = [EncoderBlock(8, 2, 16, dropout=0.0)]
    ...     def forward(self, x):
    ...         for block in self.layers:
    ...             x = block.forward(x)
    ...         return x
    >>> stack, seen = Stack(), []
    >>> with hooked(stack, heads=lambda layer, h: seen.append(h.shape)):
    ...     _ = stack.forward(np.ones((1, 3, 8)))
    >>> seen
    [(1, 2, 3, 4)]
    """
    layers = check_model(model)
    for name, hook in (("heads", heads), ("residual", residual)):
        if hook is not None and not callable(hook):
            raise AttnlabError(f"{name}: expected a function (layer, array) -> array or None, "
                               f"got {type(hook).__name__}")
    original = model.layers
    wrapped = []
    for i, layer in enumerate(layers):
        outer = layer if isinstance(layer, HookedLayer) else None
        block = outer.block if outer is not None else layer
        head_hooks = (outer.head_hooks if outer else ()) + ((heads,) if heads else ())
        residual_hooks = (outer.residual_hooks if outer else ()) + (
            (residual,) if residual else ())
        wrapped.append(HookedLayer(i, block, head_hooks, residual_hooks))
    model.layers = wrapped
    try:
        yield model
    finally:
        model.layers = original
