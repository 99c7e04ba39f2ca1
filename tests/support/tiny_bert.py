"""A tiny BERT with random weights (no files, no tokenizer), in float32 or float64."""

from __future__ import annotations

import numpy as np

from attnlab.models.bert import BertModel
from attnlab.models.config import BertConfig


def tiny_config(layers: int = 3, heads: int = 2, width: int = 8, ff: int = 12) -> BertConfig:
    return BertConfig(vocab_size=20, hidden_size=width, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=ff,
                      max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12)


def tiny_bert(seed: int = 0, *, dtype=np.float64, **sizes: int) -> BertModel:
    """Random weights of the scale of a trained BERT's (σ ≈ 0.5 for dense weights, LayerNorm
    gains near 1), so the attention is neither flat nor one-hot; cast to ``dtype``."""
    config = tiny_config(**sizes)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in config.expected_tensors().items():
        if name.endswith("LayerNorm.weight"):
            tensors[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 2 and "embeddings" not in name:
            tensors[name] = rng.standard_normal(shape) / np.sqrt(shape[1]) * 1.5
        else:
            tensors[name] = 0.5 * rng.standard_normal(shape)
    model = BertModel(config, tensors, tokenizer=None, max_length=16)
    return as_dtype(model, tensors, dtype)


def as_dtype(model: BertModel, tensors: dict, dtype) -> BertModel:
    """BertModel stores float32: put the float64 originals back for exact float64 runs."""
    if dtype == np.float32:
        return model
    t = {k: np.asarray(v, dtype=dtype) for k, v in tensors.items()}
    model.word_embeddings = t["embeddings.word_embeddings.weight"]
    model.position_embeddings = t["embeddings.position_embeddings.weight"]
    model.token_type_embeddings = t["embeddings.token_type_embeddings.weight"]
    model.embedding_norm.gamma = t["embeddings.LayerNorm.weight"]
    model.embedding_norm.beta = t["embeddings.LayerNorm.bias"]
    for i, block in enumerate(model.layers):
        p = f"encoder.layer.{i}."
        attn = block.attn
        for w, key in (("q", "attention.self.query"), ("k", "attention.self.key"),
                       ("v", "attention.self.value"), ("o", "attention.output.dense")):
            setattr(attn, f"W{w}", np.ascontiguousarray(t[p + key + ".weight"].T))
            setattr(attn, f"b{w}", t[p + key + ".bias"])
        block.norm1.gamma = t[p + "attention.output.LayerNorm.weight"]
        block.norm1.beta = t[p + "attention.output.LayerNorm.bias"]
        block.ffn.W1 = np.ascontiguousarray(t[p + "intermediate.dense.weight"].T)
        block.ffn.b1 = t[p + "intermediate.dense.bias"]
        block.ffn.W2 = np.ascontiguousarray(t[p + "output.dense.weight"].T)
        block.ffn.b2 = t[p + "output.dense.bias"]
        block.norm2.gamma = t[p + "output.LayerNorm.weight"]
        block.norm2.beta = t[p + "output.LayerNorm.bias"]
    return model
