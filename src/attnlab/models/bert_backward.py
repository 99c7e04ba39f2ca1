"""The backward pass of the whole BERT encoder, written out by hand in NumPy.

:func:`bert_backward` takes ∂L/∂hidden for the last hidden states and returns the
gradient of every weight (embeddings, LayerNorms, attention, feed-forward) and of a
gate ξ_{l,h} on every head's output, chaining the blocks' backward passes
(:func:`attnlab.nn.backward.block_backward`) and the embeddings'::

    forward:  s = word[ids] + position[0..T-1] + token_type[types];  x₀ = LN(s)
              x_l = block_l(x_{l-1}; ξ_l)                                l = 1..L
    backward: dx_L = dhidden;  dx_{l-1}, dparams_l, dξ_l = block_l'(x_{l-1}, dx_l)
              ds = LN'(s) dx₀;  dword[id] += ds at every position holding id
              dposition[t] = Σ_b ds[b, t];  dtoken_type[k] = Σ over positions of type k

It is checked against finite differences in float64 and against torch autograd on
the same weights (tests/core, tests/torch). Weight gradients use attnlab's (in, out)
layout (``W = torch_linear.weight.T``).

Dimension legend: B batch, L layers, H heads, T tokens, E width, V vocabulary,
P positions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backward import check_upstream
from ..checks import as_float_array, shape_str
from ..errors import AttnlabError, ShapeError
from ..masks import padding_mask
from ..nn.backward import block_backward, layer_norm_backward
from .bert import BertModel

__all__ = ["BertGrads", "bert_backward"]


@dataclass
class BertGrads:
    """What :func:`bert_backward` returns.

    ``dgates`` (L, H): ∂L/∂ξ for each head's gate; ``layers[l]``: the gradients of
    block l by name (``attn.Wq`` … ``norm2.beta``, see
    :class:`attnlab.nn.backward.BlockGrads`); ``embeddings``: ``word`` (V, E),
    ``position`` (P, E), ``token_type`` (types, E), ``norm.gamma``, ``norm.beta`` (E,).
    """

    dgates: np.ndarray
    layers: list[dict[str, np.ndarray]]
    embeddings: dict[str, np.ndarray]


def bert_backward(
    model: BertModel, input_ids: Any, dhidden: Any, attention_mask: Any = None,
    token_type_ids: Any = None, *, head_gates: Any = None,
) -> BertGrads:
    """Gradients of a scalar loss of ``model.forward(input_ids, attention_mask)``.

    Shapes: input_ids (B, T) int, dhidden (B, T, E) = ∂L/∂hidden, attention_mask
    (B, T) 1 = real token (HF style), token_type_ids (B, T) or None, head_gates
    (L, H) (default all 1: the model as it is) -> :class:`BertGrads`. The forward
    is recomputed in the model's dtype (float64 weights give float64 gradients).
    """
    if not isinstance(model, BertModel):
        raise AttnlabError(f"model: expected an attnlab BertModel, got {type(model).__name__}")
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ShapeError(f"input_ids: expected integer (B, T), got {ids.dtype} "
                         f"{shape_str(ids.shape)}")
    if ids.size and (ids.min() < 0 or ids.max() >= model.config.vocab_size):
        raise AttnlabError(f"input_ids: expected ids in [0, {model.config.vocab_size}), "
                           f"got [{ids.min()}, {ids.max()}]")
    if ids.shape[1] > model.config.max_position_embeddings:
        raise ShapeError(f"input_ids: expected at most {model.config.max_position_embeddings} "
                         f"tokens, got {ids.shape[1]}")
    if attention_mask is not None and np.shape(attention_mask) != ids.shape:
        raise ShapeError(f"attention_mask: expected {shape_str(ids.shape)} to match input_ids, "
                         f"got {shape_str(np.shape(attention_mask))}")
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    gates = np.ones((L, H)) if head_gates is None else as_float_array(head_gates, "head_gates")
    if gates.shape != (L, H):
        raise ShapeError(f"head_gates: expected ({L}, {H}) (L, H), got {shape_str(gates.shape)}")
    mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, T)
    B, T = ids.shape
    types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
    summed = (model.word_embeddings[ids] + model.position_embeddings[:T]
              + model.token_type_embeddings[types])  # (B, T, E)
    x = model.embedding_norm.forward(summed)  # (B, T, E)
    inputs = []
    for layer, block in enumerate(model.layers):
        inputs.append(x)
        x = _gated_forward(block, x, mask, gates[layer])  # (B, T, E)
    dx = check_upstream(dhidden, x.shape, "(B, T, E)", x.dtype)
    dgates = np.zeros((L, H))
    layer_grads: list[dict[str, np.ndarray]] = [{} for _ in range(L)]
    for layer in reversed(range(L)):
        grads = block_backward(model.layers[layer], inputs[layer], dx, mask,
                               head_gates=gates[layer])
        dx, layer_grads[layer], dgates[layer] = grads.dx, grads.params, grads.dgates
    norm = layer_norm_backward(model.embedding_norm, summed, dx)
    dsum = norm.dx  # (B, T, E)
    dword = np.zeros_like(model.word_embeddings)  # (V, E)
    np.add.at(dword, ids.reshape(-1), dsum.reshape(-1, dsum.shape[-1]))
    dposition = np.zeros_like(model.position_embeddings)  # (P, E)
    dposition[:T] = dsum.sum(axis=0)
    dtype = np.zeros_like(model.token_type_embeddings)  # (types, E)
    np.add.at(dtype, types.reshape(-1), dsum.reshape(-1, dsum.shape[-1]))
    embeddings = {"word": dword, "position": dposition, "token_type": dtype,
                  "norm.gamma": norm.dgamma, "norm.beta": norm.dbeta}
    return BertGrads(dgates, layer_grads, embeddings)


def _gated_forward(block: Any, x: np.ndarray, mask: np.ndarray | None,
                   gates: np.ndarray) -> np.ndarray:
    """block(x) with head h's output scaled by gates[h] (rows of Wo scaled): (B, T, E)."""
    if np.all(gates == 1.0):
        return block(x, mask=mask)
    gated_block = copy.copy(block)
    gated_block.attn = copy.copy(block.attn)
    Dv = block.attn.value_head_dim
    gated_block.attn.Wo = block.attn.Wo * np.repeat(gates, Dv)[:, None].astype(
        block.attn.Wo.dtype)
    return gated_block(x, mask=mask)
