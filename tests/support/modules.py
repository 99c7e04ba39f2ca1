"""Random, non-trivial parameters for the NumPy modules, shared by the core and torch tiers."""

from __future__ import annotations

import numpy as np

from attnlab.nn.layers import EncoderBlock, SelfAttentionLayer
from attnlab.nn.multihead import MultiHeadAttention


def random_params(
    rng: np.random.Generator,
    E: int,
    H: int,
    *,
    Ekv: int | None = None,
    Hkv: int | None = None,
    D: int | None = None,
    bias: bool = True,
    dtype=np.float64,
) -> MultiHeadAttention:
    """A MultiHeadAttention with random weights *and* random (non-zero) biases."""
    Ekv = E if Ekv is None else Ekv
    Hkv = H if Hkv is None else Hkv
    D = E // H if D is None else D

    def w(n_in: int, n_out: int) -> np.ndarray:
        # 1/sqrt(n_in) keeps the scores O(1), so the softmax is neither flat nor one-hot.
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)

    def b(n: int) -> np.ndarray | None:
        return (0.5 * rng.standard_normal(n)).astype(dtype) if bias else None

    return MultiHeadAttention(
        Wq=w(E, H * D), Wk=w(Ekv, Hkv * D), Wv=w(Ekv, Hkv * D), Wo=w(H * D, E),
        num_heads=H, num_kv_heads=Hkv,
        bq=b(H * D), bk=b(Hkv * D), bv=b(Hkv * D), bo=b(E),
    )


def random_allowed(rng: np.random.Generator, T: int, S: int) -> np.ndarray:
    """A random bool (T, S) mask, True = may attend, that leaves key 0 open on every row.

    torch gives NaN on a fully masked row while attnlab gives 0; that difference is
    tested separately, so the comparisons here keep every row attendable.
    """
    allowed = rng.random((T, S)) > 0.4
    allowed[:, 0] = True
    return allowed


def random_key_padding(B: int, S: int) -> np.ndarray:
    """(B, S) bool, True = real token: batch b has its last b tokens padded (key 0 kept)."""
    lengths = np.maximum(S - np.arange(B), 1)
    return np.arange(S)[None, :] < lengths[:, None]



def randomise_attention(layer: SelfAttentionLayer, rng: np.random.Generator) -> None:
    """Give the layer non-trivial biases and LayerNorm parameters (init makes them 0 and 1)."""
    attn = layer.attn
    attn.bq = 0.3 * rng.standard_normal(attn.Wq.shape[1])
    attn.bk = 0.3 * rng.standard_normal(attn.Wk.shape[1])
    attn.bv = 0.3 * rng.standard_normal(attn.Wv.shape[1])
    attn.bo = 0.3 * rng.standard_normal(attn.Wo.shape[1])
    norms = [layer.norm1] + ([layer.norm2] if isinstance(layer, EncoderBlock) else [])
    for norm in norms:
        norm.gamma = 1.0 + 0.3 * rng.standard_normal(norm.d_model)
        norm.beta = 0.3 * rng.standard_normal(norm.d_model)
    if isinstance(layer, EncoderBlock):
        layer.ffn.b1 = 0.3 * rng.standard_normal(layer.ffn.b1.shape)
        layer.ffn.b2 = 0.3 * rng.standard_normal(layer.ffn.b2.shape)

