# ruff: noqa: E501  (a task reads best on one line)
"""The exercises of attention itself (seed 000): Q, K, V, the scores and their scaling,
softmax, attention pooling (with a sink), self-attention.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..attention import scaled_dot_product_attention, softmax
from .exercise import Case, Exercise, Mistake, attention_weights, naive_softmax, normal, seeded_rng

__all__ = [
    "QKV", "SCORES", "SCALED_SCORES", "SOFTMAX", "ATTENTION", "ATTENTION_WITH_SINK",
    "SELF_ATTENTION",
]


SEED000_X = np.array([[1.0, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])

def _global_max_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / np.sum(e, axis=-1, keepdims=True)


def _axis0_softmax(x: np.ndarray) -> np.ndarray:
    return softmax(x, axis=-2)


def _attention_with(softmax_fn: Callable[[np.ndarray], np.ndarray], scale: bool = True
                    ) -> Callable[..., np.ndarray]:
    def wrong(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
        scores = Q @ K.T  # (T, S)
        if scale:
            scores = scores / np.sqrt(K.shape[-1])
        return softmax_fn(scores) @ V  # (T, Dv)
    return wrong


# ------------------------------------------------------------------ Q, K, V

def _qkv_reference(X, Wq, Wk, Wv):  # (T, E), (E, D), (E, D), (E, Dv) -> (T, D), (T, D), (T, Dv)
    return X @ Wq, X @ Wk, X @ Wv


def _qkv_cases() -> list[Case]:
    rng = seeded_rng(0)
    square = (normal(rng, 4, 4), *(normal(rng, 4, 4) for _ in range(3)))
    return [
        Case("square", square),
        Case("seed", (SEED000_X, normal(rng, 4, 3), normal(rng, 4, 3), normal(rng, 4, 5))),
        Case("one_token", (normal(rng, 1, 6), normal(rng, 6, 2), normal(rng, 6, 2),
                           normal(rng, 6, 3))),
    ]


QKV = Exercise(
    "qkv", "qkv(X, Wq, Wk, Wv) -> (Q, K, V)   # (T, E), (E, D), (E, D), (E, Dv)",
    ("用三个权重矩阵把输入 X 投影成查询 Q、键 K、值 V，返回 (Q, K, V)。",
     "Project the input X with the three weight matrices into queries Q, keys K and values V; return (Q, K, V)."),
    _qkv_reference, _qkv_cases,
    [Mistake("qkv_weight_first", lambda X, Wq, Wk, Wv: (Wq @ X, Wk @ X, Wv @ X)),
     Mistake("qkv_transposed_weight", lambda X, Wq, Wk, Wv: (X @ Wq.T, X @ Wk.T, X @ Wv.T))],
    outputs=3,
)


# ------------------------------------------------------------------ scores and scaling

def _score_cases() -> list[Case]:
    rng = seeded_rng(1)
    return [
        Case("square", (normal(rng, 4, 4), normal(rng, 4, 4))),
        Case("rect", (normal(rng, 3, 16), normal(rng, 5, 16))),
        Case("one_token", (normal(rng, 1, 2), normal(rng, 1, 2))),
    ]


SCORES = Exercise(
    "scores", "scores(Q, K) -> scores   # (T, D), (S, D) -> (T, S)",
    ("计算注意力分数：每个查询与每个键的点积（这一步还不缩放）。",
     "Compute the attention scores: the dot product of every query with every key (no scaling yet)."),
    lambda Q, K: Q @ K.T, _score_cases,
    [Mistake("no_transpose", lambda Q, K: Q @ K),
     Mistake("scores_transposed", lambda Q, K: K @ Q.T),
     Mistake("scaled_too_early", lambda Q, K: Q @ K.T / np.sqrt(K.shape[-1]))],
)

SCALED_SCORES = Exercise(
    "scaled_scores", "scaled_scores(Q, K) -> scaled   # (T, D), (S, D) -> (T, S)",
    ("计算缩放后的注意力分数：Q Kᵀ / √d_k。",
     "Compute the scaled attention scores: Q Kᵀ / √d_k."),
    lambda Q, K: Q @ K.T / np.sqrt(K.shape[-1]), _score_cases,
    [Mistake("no_scale", lambda Q, K: Q @ K.T),
     Mistake("scale_by_dk", lambda Q, K: Q @ K.T / K.shape[-1]),
     Mistake("scale_by_length", lambda Q, K: Q @ K.T / np.sqrt(K.shape[0])),
     Mistake("scale_by_length", lambda Q, K: Q @ K.T / np.sqrt(Q.shape[0])),
     Mistake("scale_multiplied", lambda Q, K: Q @ K.T * np.sqrt(K.shape[-1])),
     Mistake("no_transpose", lambda Q, K: Q @ K / np.sqrt(K.shape[-1]))],
)


# ------------------------------------------------------------------ softmax

def _softmax_cases() -> list[Case]:
    rng = seeded_rng(2)
    with_inf = normal(rng, 3, 4)
    with_inf[0, 1] = with_inf[2, 0] = with_inf[2, 3] = -np.inf
    return [
        Case("rect", (normal(rng, 3, 5),)),
        Case("square", (normal(rng, 4, 4),)),
        Case("large", (np.array([[1000.0, 999.0, 998.0], [1001.0, 1000.0, 0.0],
                                 [0.5, 0.1, -0.3]]),)),
        Case("neg_inf", (with_inf,)),
        Case("far_rows", (np.array([[1000.0, 999.0, 998.0], [0.0, -1.0, -2.0]]),)),
    ]


SOFTMAX = Exercise(
    "softmax", "softmax(x) -> weights   # (T, S) -> (T, S), each row sums to 1",
    ("把分数的每一行变成和为 1 的注意力权重（softmax），大的 logits 也不能溢出。",
     "Turn each row of scores into attention weights summing to 1 (softmax), without overflow on large logits."),
    lambda x: softmax(x, axis=-1), _softmax_cases,
    [Mistake("softmax_axis", _axis0_softmax),
     Mistake("softmax_no_max", naive_softmax),
     Mistake("softmax_global_sum", lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()),
     Mistake("softmax_global_sum", lambda x: np.exp(x) / np.exp(x).sum()),
     Mistake("softmax_no_keepdims", lambda x: np.exp(x - x.max(-1, keepdims=True))
             / np.exp(x - x.max(-1, keepdims=True)).sum(-1)),
     Mistake("softmax_no_keepdims", lambda x: np.exp(x) / np.exp(x).sum(-1)),
     Mistake("softmax_no_max", naive_softmax),
     Mistake("softmax_global_max", _global_max_softmax)],
)


# ------------------------------------------------------------------ attention pooling

def _attention_cases() -> list[Case]:
    rng = seeded_rng(3)
    return [
        Case("rect", (normal(rng, 3, 4), normal(rng, 5, 4), normal(rng, 5, 2))),
        Case("square", (normal(rng, 4, 4), normal(rng, 4, 4), normal(rng, 4, 4))),
        Case("large", (100 * normal(rng, 3, 8), 10 * normal(rng, 3, 8), normal(rng, 3, 2))),
        Case("one_token", (normal(rng, 1, 4), normal(rng, 1, 4), normal(rng, 1, 3))),
    ]


ATTENTION = Exercise(
    "attention", "attention(Q, K, V) -> out   # (T, D), (S, D), (S, Dv) -> (T, Dv)",
    ("缩放点积注意力：softmax(Q Kᵀ / √d_k) V，即用注意力权重对 V 做加权求和（注意力汇聚）。",
     "Scaled dot-product attention: softmax(Q Kᵀ / √d_k) V, the weighted sum of V (attention pooling)."),
    lambda Q, K, V: scaled_dot_product_attention(Q, K, V), _attention_cases,
    [Mistake("returned_weights", lambda Q, K, V: attention_weights(Q, K)),
     Mistake("weights_transposed", lambda Q, K, V: attention_weights(Q, K).T @ V),
     Mistake("output_transposed", lambda Q, K, V: (attention_weights(Q, K) @ V).T),
     Mistake("no_scale", _attention_with(lambda s: softmax(s, axis=-1), scale=False)),
     Mistake("softmax_axis", _attention_with(_axis0_softmax)),
     Mistake("softmax_no_max", _attention_with(naive_softmax)),
     Mistake("no_transpose", lambda Q, K, V: softmax(Q @ K / np.sqrt(K.shape[-1]), axis=-1) @ V)],
)


def _sink_cases() -> list[Case]:
    rng = seeded_rng(14)
    return [
        Case("rect", (normal(rng, 3, 4), normal(rng, 5, 4), normal(rng, 5, 2), 0.5)),
        Case("large", (100 * normal(rng, 3, 8), 10 * normal(rng, 3, 8), normal(rng, 3, 2),
                       300.0)),
        Case("one_token", (normal(rng, 1, 4), normal(rng, 1, 4), normal(rng, 1, 3), -1.0)),
    ]


def _sink_reference(Q: np.ndarray, K: np.ndarray, V: np.ndarray, sink: float) -> np.ndarray:
    out = scaled_dot_product_attention(Q[None], K[None], V[None], sinks=np.array([sink]))
    return np.asarray(out)[0]  # (1, T, Dv) -> (T, Dv)


def _sink_no_max(Q: np.ndarray, K: np.ndarray, V: np.ndarray, sink: float) -> np.ndarray:
    e = np.exp(Q @ K.T / np.sqrt(K.shape[-1]))  # (T, S)
    return e / (e.sum(-1, keepdims=True) + np.exp(sink)) @ V


ATTENTION_WITH_SINK = Exercise(
    "attention_with_sink",
    "attention_with_sink(Q, K, V, sink) -> out   # (T, D), (S, D), (S, Dv), scalar -> (T, Dv)",
    ("GPT-OSS 的注意力停靠点：sink 作为每一行 softmax 的多一列参与归一化，但它没有值向量；"
     "输出 = 前 S 列的权重 @ V（每行权重之和小于 1）。",
     "GPT-OSS's attention sink: the sink joins each row's softmax as one more column with no "
     "value; out = the first S columns' weights @ V (each row sums to less than 1)."),
    _sink_reference, _sink_cases,
    [Mistake("sink_ignored", lambda Q, K, V, sink: attention_weights(Q, K) @ V),
     Mistake("softmax_no_max", _sink_no_max)],
)


def _self_attention_cases() -> list[Case]:
    rng = seeded_rng(4)
    return [
        Case("seed", (SEED000_X, normal(rng, 4, 3), normal(rng, 4, 3), normal(rng, 4, 3))),
        Case("rect", (normal(rng, 5, 6), normal(rng, 6, 4), normal(rng, 6, 4),
                      normal(rng, 6, 2))),
        Case("large", (30 * normal(rng, 3, 4), 5 * normal(rng, 4, 8), 5 * normal(rng, 4, 8),
                       normal(rng, 4, 2))),
    ]


def _self_attention_with(attend: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda X, Wq, Wk, Wv: attend(X @ Wq, X @ Wk, X @ Wv)


SELF_ATTENTION = Exercise(
    "self_attention", "self_attention(X, Wq, Wk, Wv) -> out   # (T, E), (E, D), (E, D), (E, Dv) -> (T, Dv)",
    ("原文 000 的完整函数：先投影出 Q、K、V，再做缩放点积注意力。",
     "Seed 000's whole function: project Q, K and V, then scaled dot-product attention."),
    lambda X, Wq, Wk, Wv: scaled_dot_product_attention(X @ Wq, X @ Wk, X @ Wv),
    _self_attention_cases,
    [Mistake(m.hint, _self_attention_with(m.fn)) for m in ATTENTION.mistakes],
)
