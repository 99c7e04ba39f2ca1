"""Head importance (Michel, Levy & Neubig 2019): how much a loss moves when a head is
scaled, read from one backward pass.

Every head's output (before Wo) is multiplied by a gate ξ_{l,h} = 1; the importance
of a head is ``|∂L/∂ξ_{l,h}|`` averaged over inputs — a first-order estimate of the
change in L when the head is removed (ξ = 0). The gradients come from attnlab's own
NumPy backward passes (:func:`attnlab.models.bert_backward.bert_backward`), checked
against finite differences in float64 and against torch autograd.

For a sentence-embedding model the loss here is the cosine similarity of a pair of
sentences' mean-pooled embeddings (the similarity the model is trained for):
``head_importance(model, pairs)`` averages ``|∂ cos(a, b) / ∂ξ|`` over the pairs.
:func:`head_gradients` takes any loss given with its gradient.

Dimension legend: B batch, L layers, H heads, T tokens, E width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..models.bert_backward import bert_backward
from .runs import encode_inputs, mean_pool

__all__ = ["LossGrad", "head_gradients", "head_importance", "pair_cosine"]

#: loss(hidden (B, T, E), real (B, T)) -> (L, ∂L/∂hidden (B, T, E))
LossGrad = Callable[[np.ndarray, np.ndarray], tuple[float, np.ndarray]]


def pair_cosine(hidden: np.ndarray, real: np.ndarray) -> tuple[float, np.ndarray]:
    """The cosine of two mean-pooled embeddings (rows 0 and 1), and its gradient.

    Shapes: hidden (2, T, E), real (2, T) -> (cos, dhidden (2, T, E)). With u, v the
    pooled rows: d cos / du = v / (|u||v|) − cos · u / |u|², and the pooling spreads
    it over the real tokens: dhidden[b, t] = du_b · real[b, t] / Σ_t real[b, t].
    """
    if hidden.shape[0] != 2:
        raise AttnlabError(f"hidden: expected a pair (2, T, E), got batch {hidden.shape[0]}")
    pooled = mean_pool(hidden, real)  # (2, E)
    u, v = pooled
    nu, nv = np.linalg.norm(u), np.linalg.norm(v)
    cos = float(u @ v / (nu * nv))
    du = v / (nu * nv) - cos * u / (nu * nu)  # (E,)
    dv = u / (nu * nv) - cos * v / (nv * nv)  # (E,)
    counts = real.sum(axis=1, keepdims=True).astype(hidden.dtype)  # (2, 1)
    spread = real.astype(hidden.dtype) / counts  # (2, T)
    dhidden = spread[..., None] * np.stack([du, dv])[:, None, :]  # (2, T, E)
    return cos, dhidden


def head_gradients(model: Any, inputs: Any, loss: LossGrad) -> tuple[float, np.ndarray]:
    """``loss`` of the model's run on ``inputs`` and its gradient ∂L/∂ξ (L, H) at ξ = 1."""
    ids, real = encode_inputs(model, inputs)
    hidden = model.forward(ids, real)  # (B, T, E)
    value, dhidden = loss(hidden, real)
    grads = bert_backward(model, ids, dhidden, real)
    return value, grads.dgates


def head_importance(model: Any, pairs: Sequence[tuple[Any, Any]]) -> np.ndarray:
    """Mean over ``pairs`` of |∂ cos(a, b) / ∂ξ_{l,h}|: an (L, H) table.

    ``pairs``: (text, text) tuples, each run as a batch of two, padded to the longer
    one (for token ids, call :func:`head_gradients` with a (2, T) array).
    """
    pairs = list(pairs)
    if not pairs:
        raise AttnlabError("pairs: expected at least one (text, text) pair, got none")
    tables = []
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(text, str) for text in pair)):
            raise AttnlabError(f"pairs: expected (text, text) pairs, got {pair!r}")
        tables.append(np.abs(head_gradients(model, list(pair), pair_cosine)[1]))
    return np.mean(tables, axis=0)  # (L, H)
