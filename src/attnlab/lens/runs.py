"""Running a BERT-like model on texts or token ids for the lenses, and reading what
every head and every block produced on the way.

A model here is a :class:`attnlab.models.BertModel` or :class:`attnlab.torch.models.BertModel`
(or any model with the same ``forward(input_ids, attention_mask) -> (B, T, E)`` and hook
points ``blocks.{l}.attn.hook_z``); texts need its ``tokenize``. Results are NumPy arrays
for both. Inputs are a text, a list of texts, or integer
token ids (T,) or (B, T) (then every token is real).

Dimension legend: B batch, L layers, H heads, T tokens, Dv value head dim, E width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import shape_str
from ..errors import AttnlabError
from .hooks import check_model, forward, hooked, to_numpy

__all__ = ["Activations", "encode_inputs", "mean_pool", "record", "sentence_embeddings"]


def encode_inputs(model: Any, inputs: Any, name: str = "inputs") -> tuple[np.ndarray, np.ndarray]:
    """Texts or ids -> token ids (B, T) int64 and the real-token mask (B, T) of 0/1."""
    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                   and all(isinstance(t, str) for t in inputs)):
        if getattr(model, "tokenizer", None) is None or not callable(
                getattr(model, "tokenize", None)):
            raise AttnlabError(f"{name}: texts need a model with a tokenizer; pass token ids "
                               f"(B, T) instead")
        ids, real, _ = model.tokenize([inputs] if isinstance(inputs, str) else list(inputs))
        return to_numpy(ids).astype(np.int64), to_numpy(real).astype(np.int64)
    ids = to_numpy(inputs)
    if ids.ndim == 1:
        ids = ids[None]  # (1, T)
    if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise AttnlabError(f"{name}: expected a text, a list of texts or integer token ids "
                           f"(T,) or (B, T), got {ids.dtype} {shape_str(ids.shape)}")
    return ids.astype(np.int64), np.ones(ids.shape, dtype=np.int64)


def mean_pool(hidden: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Mean over real tokens (sentence-transformers' pooling): (B, T, E), (B, T) -> (B, E)."""
    weights = real[..., None].astype(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)  # (B, E)


def sentence_embeddings(hidden: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence embeddings: (B, T, E), (B, T) -> (B, E)."""
    pooled = mean_pool(hidden, real)  # (B, E)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


@dataclass
class Activations:
    """What one run produced: per layer l, ``heads[l]`` (B, H, T, Dv) (each head's
    output before Wo) and ``residual[l]`` (B, T, E) (the block's output); the final
    ``hidden`` (B, T, E); the inputs ``ids`` and ``real`` (B, T)."""

    heads: list[np.ndarray]
    residual: list[np.ndarray]
    hidden: np.ndarray
    ids: np.ndarray
    real: np.ndarray


def record(model: Any, inputs: Any, name: str = "inputs") -> Activations:
    """Run ``model`` on ``inputs`` and keep every head output and block output."""
    check_model(model)
    ids, real = encode_inputs(model, inputs, name)
    heads: list[np.ndarray] = []
    residual: list[np.ndarray] = []

    def keep_heads(_layer: int, values: np.ndarray) -> None:
        heads.append(values.copy())

    def keep_residual(_layer: int, values: np.ndarray) -> None:
        residual.append(values.copy())

    with hooked(model, heads=keep_heads, residual=keep_residual):
        hidden = forward(model, ids, real)  # (B, T, E)
    return Activations(heads, residual, hidden, ids, real)
