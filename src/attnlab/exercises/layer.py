# ruff: noqa: E501  (a task reads best on one line)
"""The exercises around attention: positions (sinusoidal encoding), layer norm, the
residual block, flash attention's online softmax and softmax's gradient.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..attention import scaled_dot_product_attention, softmax
from ..backward import softmax_backward
from ..nn.layers import LayerNorm
from ..nn.multihead import MultiHeadAttention
from ..positional import sinusoidal_encoding
from .exercise import Case, Exercise, Mistake, normal, seeded_rng

__all__ = [
    "SINUSOIDAL", "LAYER_NORM", "RESIDUAL_BLOCK", "ONLINE_ATTENTION", "SOFTMAX_BACKWARD",
]


# ------------------------------------------------------------------ positions

def _pe_with(*, swapped: bool = False, halves: bool = False, column_exponent: bool = False,
             pair_exponent: bool = False, start: int = 0) -> Callable[[int, int], np.ndarray]:
    def wrong(max_len: int, d_model: int) -> np.ndarray:
        pos = np.arange(start, start + max_len, dtype=float)[:, None]  # (L, 1)
        pairs = np.arange(0, d_model, 2)  # (E/2,) the even columns 2i
        exponent = (pairs / 2) / d_model if pair_exponent else pairs / d_model
        angle = pos / 10000.0 ** exponent  # (L, E/2)
        first, second = (np.cos, np.sin) if swapped else (np.sin, np.cos)
        if halves:
            return np.concatenate([first(angle), second(angle)], axis=1)
        pe = np.zeros((max_len, d_model))
        pe[:, 0::2] = first(angle)
        if column_exponent:
            pe[:, 1::2] = second(pos / 10000.0 ** ((pairs + 1) / d_model))
        else:
            pe[:, 1::2] = second(angle)
        return pe
    return wrong


SINUSOIDAL = Exercise(
    "sinusoidal_encoding", "sinusoidal_encoding(max_len, d_model) -> pe   # -> (max_len, E), E even",
    ("正弦位置编码（原文 001）：pe[p, 2i] = sin(p / 10000^(2i/d_model))，pe[p, 2i+1] = cos(同一个角度)。",
     "The sinusoidal encoding (seed 001): pe[p, 2i] = sin(p / 10000^(2i/d_model)), pe[p, 2i+1] = cos(the same angle)."),
    lambda max_len, d_model: sinusoidal_encoding(max_len, d_model),
    lambda: [Case("random", (6, 8)), Case("random", (12, 4)), Case("one_token", (1, 6))],
    [Mistake("pe_swapped", _pe_with(swapped=True)),
     Mistake("pe_halves", _pe_with(halves=True)),
     Mistake("pe_column_exponent", _pe_with(column_exponent=True)),
     Mistake("pe_pair_exponent", _pe_with(pair_exponent=True)),
     Mistake("pe_from_one", _pe_with(start=1))],
)


# ------------------------------------------------------------------ the layer

def _ln_with(*, ddof: int = 0, axis: int = -1, eps_outside: bool = False, eps: float = 1e-5
             ) -> Callable[[np.ndarray], np.ndarray]:
    def wrong(x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=axis, keepdims=True)
        var = x.var(axis=axis, ddof=ddof, keepdims=True)
        if eps_outside:
            return (x - mean) / (np.sqrt(var) + eps)
        return (x - mean) / np.sqrt(var + eps)
    return wrong


def _ln_cases() -> list[Case]:
    rng = seeded_rng(9)
    constant = normal(rng, 3, 4)
    constant[1] = 0.7
    return [Case("random", (normal(rng, 3, 5),)), Case("small_var", (1e-3 * normal(rng, 4, 6),)),
            Case("constant_row", (constant,))]


LAYER_NORM = Exercise(
    "layer_norm", "layer_norm(x) -> y   # (T, E) -> (T, E), eps = 1e-5, no γ, β",
    ("层规范化：每个词元的特征减去均值、除以 √(方差 + ε)，ε = 1e-5（不带可学习的 γ、β）。",
     "Layer normalisation: subtract each token's feature mean and divide by √(variance + ε), ε = 1e-5 (no learned γ, β)."),
    lambda x: LayerNorm(x.shape[-1])(x), _ln_cases,
    [Mistake("ln_unbiased", _ln_with(ddof=1)),
     Mistake("ln_axis", _ln_with(axis=0)),
     Mistake("ln_eps_outside", _ln_with(eps_outside=True)),
     Mistake("ln_no_eps", _ln_with(eps=0.0))],
)


def _block_cases() -> list[Case]:
    mha = MultiHeadAttention.init(2, 8, seed=10)
    norm = LayerNorm(8)

    def attention(x: np.ndarray) -> np.ndarray:  # (T, E) -> (T, E)
        return mha(x)[0]
    x = 2.0 + 3.0 * normal(seeded_rng(11), 3, 8)
    return [Case("post", (x, attention, norm, "post")), Case("pre", (x, attention, norm, "pre"))]


def _block(x, attention, layer_norm, norm, *, residual=True, swap=False, extra_norm=False):
    if swap:
        norm = "pre" if norm == "post" else "post"
    keep = x if residual else 0.0
    if norm == "post":
        return layer_norm(keep + attention(x))
    out = keep + attention(layer_norm(x))
    return layer_norm(out) if extra_norm else out


RESIDUAL_BLOCK = Exercise(
    "residual_block", "residual_block(x, attention, layer_norm, norm) -> y   # (T, E) -> (T, E), norm \"post\" or \"pre\"",
    ("自注意力层的残差与层规范化：norm=\"post\" 是 layer_norm(x + attention(x))（原文 001 的代码），"
     "norm=\"pre\" 是 x + attention(layer_norm(x))。attention 和 layer_norm 是给定的函数。",
     "The layer's residual and layer normalisation: norm=\"post\" is layer_norm(x + attention(x)) (seed 001's code), "
     "norm=\"pre\" is x + attention(layer_norm(x)). attention and layer_norm are given functions."),
    lambda x, attention, layer_norm, norm: _block(x, attention, layer_norm, norm), _block_cases,
    [Mistake("block_no_residual", lambda *a: _block(*a, residual=False)),
     Mistake("block_swapped", lambda *a: _block(*a, swap=True)),
     Mistake("block_pre_extra_norm", lambda *a: _block(*a, extra_norm=True))],
)


# ------------------------------------------------------------------ flash's online softmax

def _online_with(*, correct: bool = True, subtract: bool = True, divide: bool = True,
                 ragged: bool = True) -> Callable[..., np.ndarray]:
    def wrong(q, K, V, block):  # (D,), (S, D), (S, Dv), int -> (Dv,)
        S = K.shape[0]
        m, total, acc = -np.inf, 0.0, np.zeros(V.shape[1])  # the paper's m, l, acc
        stop = S if ragged else S - block + 1
        for start in range(0, stop, block):
            s = K[start:start + block] @ q / np.sqrt(K.shape[1])  # (b,)
            m_new = max(m, float(s.max())) if subtract else 0.0
            scale = np.exp(m - m_new) if correct and subtract else 1.0
            p = np.exp(s - m_new)  # (b,)
            total, acc = total * scale + p.sum(), acc * scale + p @ V[start:start + block]
            m = m_new
        return acc / total if divide else acc
    return wrong


def _online_cases() -> list[Case]:
    rng = seeded_rng(12)
    q, K = normal(rng, 4), normal(rng, 8, 4)
    rising = K[np.argsort(K @ q)]  # (S, D): each tile holds a new maximum, so m moves
    return [
        Case("random", (q, rising, normal(rng, 8, 2), 2)),
        Case("ragged", (normal(rng, 4), normal(rng, 7, 4), normal(rng, 7, 3), 3)),
        Case("large", (100 * normal(rng, 8), 30 * normal(rng, 6, 8), normal(rng, 6, 2), 2)),
        Case("one_block", (normal(rng, 4), normal(rng, 5, 4), normal(rng, 5, 2), 1)),
    ]


ONLINE_ATTENTION = Exercise(
    "online_attention", "online_attention(q, K, V, block) -> out   # (D,), (S, D), (S, Dv), int -> (Dv,)",
    ("Flash Attention 的在线 softmax：一次读 block 个键，只保留运行最大值 m、指数和 l、输出累加 acc，最后输出 acc / l。",
     "Flash attention's online softmax: read block keys at a time, keep only the running maximum m, the sum of exponentials l and the output accumulator acc, and output acc / l."),
    lambda q, K, V, block: scaled_dot_product_attention(q[None], K, V)[0], _online_cases,
    [Mistake("online_no_correction", _online_with(correct=False)),
     Mistake("softmax_no_max", _online_with(subtract=False)),
     Mistake("online_no_divide", _online_with(divide=False)),
     Mistake("online_last_tile", _online_with(ragged=False))],
)


# ------------------------------------------------------------------ softmax's gradient

def _softmax_backward_cases() -> list[Case]:
    rng = seeded_rng(13)
    masked = softmax(np.where(np.tril(np.ones((4, 4), bool)), normal(rng, 4, 4), -np.inf))
    return [
        Case("rect", (softmax(normal(rng, 3, 5)), normal(rng, 3, 5))),
        Case("square", (softmax(normal(rng, 4, 4)), normal(rng, 4, 4))),
        Case("causal", (masked, normal(rng, 4, 4))),
    ]


SOFTMAX_BACKWARD = Exercise(
    "softmax_backward", "softmax_backward(y, dy) -> dx   # y = softmax(x) (T, S), dy = ∂L/∂y (T, S) -> ∂L/∂x (T, S)",
    ("softmax 的反向传播：已知输出 y 和上游梯度 dy，求 dx = y ⊙ (dy − Σ_j dy_j y_j)（每一行求和）。",
     "Softmax's backward pass: from the output y and the upstream gradient dy, compute dx = y ⊙ (dy − Σ_j dy_j y_j) (summed per row)."),
    lambda y, dy: softmax_backward(y, dy), _softmax_backward_cases,
    [Mistake("sb_no_subtract", lambda y, dy: y * dy),
     Mistake("sb_diagonal", lambda y, dy: y * (1 - y) * dy),
     Mistake("sb_axis", lambda y, dy: y * (dy - np.sum(dy * y, axis=0, keepdims=True))),
     Mistake("softmax_no_keepdims", lambda y, dy: y * (dy - np.sum(dy * y, axis=-1)))],
)
