# ruff: noqa: E501  (a task reads best on one line)
"""The exercises: for each, attnlab's own answer, the inputs tried, and the usual mistakes.

An exercise is the seed's few lines as a function the learner writes. The checker
runs it on every :class:`Case` (random inputs first, edge cases after) and compares
with ``reference`` (attnlab's implementation). When they differ, each
:class:`Mistake` is a wrong version written the way learners write it: if the
learner's output equals a mistake's (or fails the same way), the mistake's hint
names what went wrong.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..attention import scaled_dot_product_attention, softmax
from ..backward import softmax_backward
from ..masks import causal_mask
from ..nn.layers import LayerNorm
from ..nn.multihead import MultiHeadAttention, merge_heads, split_heads
from ..positional import sinusoidal_encoding

__all__ = ["Case", "Mistake", "Exercise", "EXERCISES"]


@dataclass(frozen=True)
class Case:
    """One set of inputs: ``label`` names it for the learner (a key of hints.CASES)."""

    label: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Mistake:
    """A wrong version (``fn`` takes the exercise's arguments) and the hint that names it."""

    hint: str
    fn: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    name: str
    signature: str
    task: tuple[str, str]  # (zh, en)
    reference: Callable[..., Any]
    cases: Callable[[], list[Case]]
    mistakes: list[Mistake] = field(default_factory=list)
    outputs: int = 1  # how many arrays the function returns
    bool_output: bool = False  # a mask: the answer must be dtype bool


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


SEED000_X = np.array([[1.0, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])


def _naive_softmax(x: np.ndarray) -> np.ndarray:  # seed 000's line, no max subtracted
    return np.exp(x) / np.sum(np.exp(x), axis=-1, keepdims=True)


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
    rng = _rng(0)
    square = (_normal(rng, 4, 4), *(_normal(rng, 4, 4) for _ in range(3)))
    return [
        Case("square", square),
        Case("seed", (SEED000_X, _normal(rng, 4, 3), _normal(rng, 4, 3), _normal(rng, 4, 5))),
        Case("one_token", (_normal(rng, 1, 6), _normal(rng, 6, 2), _normal(rng, 6, 2),
                           _normal(rng, 6, 3))),
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
    rng = _rng(1)
    return [
        Case("square", (_normal(rng, 4, 4), _normal(rng, 4, 4))),
        Case("rect", (_normal(rng, 3, 16), _normal(rng, 5, 16))),
        Case("one_token", (_normal(rng, 1, 2), _normal(rng, 1, 2))),
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
    rng = _rng(2)
    with_inf = _normal(rng, 3, 4)
    with_inf[0, 1] = with_inf[2, 0] = with_inf[2, 3] = -np.inf
    return [
        Case("rect", (_normal(rng, 3, 5),)),
        Case("square", (_normal(rng, 4, 4),)),
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
     Mistake("softmax_no_max", _naive_softmax),
     Mistake("softmax_global_sum", lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()),
     Mistake("softmax_global_sum", lambda x: np.exp(x) / np.exp(x).sum()),
     Mistake("softmax_no_keepdims", lambda x: np.exp(x - x.max(-1, keepdims=True))
             / np.exp(x - x.max(-1, keepdims=True)).sum(-1)),
     Mistake("softmax_no_keepdims", lambda x: np.exp(x) / np.exp(x).sum(-1)),
     Mistake("softmax_no_max", _naive_softmax),
     Mistake("softmax_global_max", _global_max_softmax)],
)


# ------------------------------------------------------------------ attention pooling

def _attention_cases() -> list[Case]:
    rng = _rng(3)
    return [
        Case("rect", (_normal(rng, 3, 4), _normal(rng, 5, 4), _normal(rng, 5, 2))),
        Case("square", (_normal(rng, 4, 4), _normal(rng, 4, 4), _normal(rng, 4, 4))),
        Case("large", (100 * _normal(rng, 3, 8), 10 * _normal(rng, 3, 8), _normal(rng, 3, 2))),
        Case("one_token", (_normal(rng, 1, 4), _normal(rng, 1, 4), _normal(rng, 1, 3))),
    ]


def _weights(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    return softmax(Q @ K.T / np.sqrt(K.shape[-1]), axis=-1)  # (T, S)


ATTENTION = Exercise(
    "attention", "attention(Q, K, V) -> out   # (T, D), (S, D), (S, Dv) -> (T, Dv)",
    ("缩放点积注意力：softmax(Q Kᵀ / √d_k) V，即用注意力权重对 V 做加权求和（注意力汇聚）。",
     "Scaled dot-product attention: softmax(Q Kᵀ / √d_k) V, the weighted sum of V (attention pooling)."),
    lambda Q, K, V: scaled_dot_product_attention(Q, K, V), _attention_cases,
    [Mistake("returned_weights", lambda Q, K, V: _weights(Q, K)),
     Mistake("weights_transposed", lambda Q, K, V: _weights(Q, K).T @ V),
     Mistake("output_transposed", lambda Q, K, V: (_weights(Q, K) @ V).T),
     Mistake("no_scale", _attention_with(lambda s: softmax(s, axis=-1), scale=False)),
     Mistake("softmax_axis", _attention_with(_axis0_softmax)),
     Mistake("softmax_no_max", _attention_with(_naive_softmax)),
     Mistake("no_transpose", lambda Q, K, V: softmax(Q @ K / np.sqrt(K.shape[-1]), axis=-1) @ V)],
)


def _sink_cases() -> list[Case]:
    rng = _rng(14)
    return [
        Case("rect", (_normal(rng, 3, 4), _normal(rng, 5, 4), _normal(rng, 5, 2), 0.5)),
        Case("large", (100 * _normal(rng, 3, 8), 10 * _normal(rng, 3, 8), _normal(rng, 3, 2),
                       300.0)),
        Case("one_token", (_normal(rng, 1, 4), _normal(rng, 1, 4), _normal(rng, 1, 3), -1.0)),
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
    [Mistake("sink_ignored", lambda Q, K, V, sink: _weights(Q, K) @ V),
     Mistake("softmax_no_max", _sink_no_max)],
)


def _self_attention_cases() -> list[Case]:
    rng = _rng(4)
    return [
        Case("seed", (SEED000_X, _normal(rng, 4, 3), _normal(rng, 4, 3), _normal(rng, 4, 3))),
        Case("rect", (_normal(rng, 5, 6), _normal(rng, 6, 4), _normal(rng, 6, 4),
                      _normal(rng, 6, 2))),
        Case("large", (30 * _normal(rng, 3, 4), 5 * _normal(rng, 4, 8), 5 * _normal(rng, 4, 8),
                       _normal(rng, 4, 2))),
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


# ------------------------------------------------------------------ masks

CAUSAL_MASK = Exercise(
    "causal_mask", "causal_mask(T) -> mask   # -> (T, T) bool, True = may attend",
    ("因果掩码：第 i 个词元只能关注位置 0..i。返回布尔矩阵，True = 可以关注。",
     "The causal mask: token i may attend to positions 0..i only. Return a boolean matrix, True = may attend."),
    lambda T: causal_mask(T), lambda: [Case("random", (4,)), Case("one_token", (1,)),
                                       Case("random", (6,))],
    [Mistake("mask_reversed", lambda T: np.triu(np.ones((T, T), dtype=bool), 1)),
     Mistake("mask_reversed", lambda T: np.triu(np.ones((T, T), dtype=bool))),
     Mistake("mask_seed000", lambda T: np.triu(np.ones((T, T)), 1)),
     Mistake("mask_seed000", lambda T: np.triu(np.ones((T, T), dtype=int), 1)),
     Mistake("causal_no_diagonal", lambda T: np.tril(np.ones((T, T), dtype=bool), -1))],
    bool_output=True,
)


def _positions_below(valid_lens: np.ndarray, S: int) -> np.ndarray:
    return np.arange(S)[None, :] < np.asarray(valid_lens)[:, None]  # (B, S)


PADDING_MASK = Exercise(
    "padding_mask", "padding_mask(valid_lens, S) -> key_padding   # (B,) ints -> (B, S) bool, True = a real token",
    ("填充掩码：第 b 个序列前 valid_lens[b] 个位置是真实词元，其余是填充。返回布尔矩阵，True = 真实词元（可以关注）。",
     "The padding mask: sequence b's first valid_lens[b] positions are real tokens, the rest padding. Return a boolean matrix, True = a real token (may be attended to)."),
    _positions_below,
    lambda: [Case("random", (np.array([2, 4, 1]), 4)), Case("zero_length", (np.array([0, 3]), 3))],
    [Mistake("mask_reversed", lambda v, S: ~_positions_below(v, S)),
     Mistake("padding_off_by_one", lambda v, S: np.arange(S)[None, :] <= np.asarray(v)[:, None]),
     Mistake("mask_not_bool", lambda v, S: _positions_below(v, S).astype(int))],
    bool_output=True,
)


def _masked_scores(Q, K, mask, fill):  # (T, S)
    return np.where(mask, Q @ K.T / np.sqrt(K.shape[-1]), fill)


def _masked_cases() -> list[Case]:
    rng = _rng(5)
    partial = np.array([[True, False, True, False, True], [False, True, True, True, False],
                        [True, True, False, False, False]])
    full_row = np.array([[True, False, False, True], [False, False, False, False],
                         [True, True, True, False]])
    return [
        Case("partial", (_normal(rng, 3, 4), _normal(rng, 5, 4), _normal(rng, 5, 2), partial)),
        Case("causal", (_normal(rng, 4, 4), _normal(rng, 4, 4), _normal(rng, 4, 3),
                        causal_mask(4))),
        Case("full_row", (_normal(rng, 3, 4), _normal(rng, 4, 4), _normal(rng, 4, 2), full_row)),
    ]


MASKED_ATTENTION = Exercise(
    "masked_attention", "masked_attention(Q, K, V, mask) -> out   # (T, D), (S, D), (S, Dv), (T, S) bool -> (T, Dv)",
    ("掩蔽的缩放点积注意力：mask 为 False 的位置不能被关注（True = 可以关注）；一整行都被掩蔽时，这一行输出 0。",
     "Masked scaled dot-product attention: positions where mask is False cannot be attended to (True = may attend); a row with everything masked outputs 0."),
    lambda Q, K, V, mask: scaled_dot_product_attention(Q, K, V, mask), _masked_cases,
    [Mistake("mask_reversed", lambda Q, K, V, m: softmax(_masked_scores(Q, K, ~m, -np.inf), -1) @ V),
     Mistake("mask_reversed", lambda Q, K, V, m: softmax(_masked_scores(Q, K, ~m, -1e9), -1) @ V),
     Mistake("mask_reversed", lambda Q, K, V, m: scaled_dot_product_attention(Q, K, V, ~m)),
     Mistake("mask_after_softmax", lambda Q, K, V, m: (_weights(Q, K) * m) @ V),
     Mistake("no_scale", lambda Q, K, V, m: scaled_dot_product_attention(Q, K, V, m, scale=1.0)),
     Mistake("full_row_minus_1e9", lambda Q, K, V, m: softmax(_masked_scores(Q, K, m, -1e9), -1) @ V),
     Mistake("full_row_minus_1e9", lambda Q, K, V, m: softmax(
         Q @ K.T / np.sqrt(K.shape[-1]) + (1 - m) * -1e9, -1) @ V),
     Mistake("full_row_nan", lambda Q, K, V, m: _naive_softmax(
         Q @ K.T / np.sqrt(K.shape[-1]) + (1 - m) * -1e9) @ V),
     Mistake("full_row_nan", lambda Q, K, V, m: _global_free_softmax(
         _masked_scores(Q, K, m, -np.inf)) @ V)],
)


def _global_free_softmax(x: np.ndarray) -> np.ndarray:  # max subtracted, no empty-row rule
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------ heads

def _split_cases() -> list[Case]:
    rng = _rng(6)
    return [Case("random", (_normal(rng, 2, 3, 8), 2)), Case("three_heads", (_normal(rng, 1, 4, 6), 3)),
            Case("one_head", (_normal(rng, 2, 2, 4), 1))]


SPLIT_HEADS = Exercise(
    "split_heads", "split_heads(x, num_heads) -> heads   # (B, T, E) -> (B, H, T, D), D = E / H",
    ("原文 001 的 .view(B, T, h, d_k).transpose(1, 2)：把 E 维拆成 H 个 D 维的头。",
     "Seed 001's .view(B, T, h, d_k).transpose(1, 2): split the E dims into H heads of D dims."),
    split_heads, _split_cases,
    [Mistake("split_reshape_only", lambda x, H: x.reshape(x.shape[0], H, x.shape[1], -1)),
     Mistake("split_no_transpose", lambda x, H: x.reshape(x.shape[0], x.shape[1], H, -1)),
     Mistake("split_interleaved", lambda x, H: x.reshape(x.shape[0], x.shape[1], -1, H)
             .transpose(0, 3, 1, 2))],
)


def _merge_cases() -> list[Case]:
    rng = _rng(7)
    return [Case("random", (_normal(rng, 2, 2, 3, 4),)), Case("three_heads", (_normal(rng, 1, 3, 4, 2),)),
            Case("one_head", (_normal(rng, 2, 1, 3, 4),))]


MERGE_HEADS = Exercise(
    "merge_heads", "merge_heads(heads) -> x   # (B, H, T, D) -> (B, T, H*D)",
    ("把各个头拼接回来（原文 001 的 .transpose(1, 2).contiguous().view(B, T, h * d_k)）。",
     "Concatenate the heads back (seed 001's .transpose(1, 2).contiguous().view(B, T, h * d_k))."),
    merge_heads, _merge_cases,
    [Mistake("merge_reshape_only", lambda x: x.reshape(x.shape[0], x.shape[2], -1)),
     Mistake("split_interleaved", lambda x: x.transpose(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1))],
)


def _mha_reference(X, Wq, Wk, Wv, Wo, num_heads):  # (T, E) ... -> (T, E)
    return MultiHeadAttention(Wq, Wk, Wv, Wo, num_heads)(X)[0]


def _mha_with(*, scale_width: bool = False, wo: bool = True, split: str = "right"
              ) -> Callable[..., np.ndarray]:
    def wrong(X, Wq, Wk, Wv, Wo, num_heads):
        T, E = X.shape
        H = num_heads if split != "none" else 1
        D = E // H

        def heads(M: np.ndarray) -> np.ndarray:  # (T, E) -> (H, T, D)
            if split == "reshape":
                return M.reshape(H, T, D)
            return M.reshape(T, H, D).transpose(1, 0, 2)

        q, k, v = heads(X @ Wq), heads(X @ Wk), heads(X @ Wv)
        scale = 1 / np.sqrt(E if scale_width else E // num_heads if split == "none" else D)
        out = softmax(q @ k.transpose(0, 2, 1) * scale, axis=-1) @ v  # (H, T, D)
        out = out.transpose(1, 0, 2).reshape(T, E)  # (T, E)
        return out @ Wo if wo else out
    return wrong


def _mha_cases() -> list[Case]:
    rng = _rng(8)

    def case(label: str, T: int, E: int, H: int) -> Case:
        weights = [_normal(rng, E, E) / np.sqrt(E) for _ in range(4)]
        return Case(label, (_normal(rng, T, E), *weights, H))
    return [case("random", 3, 8, 2), case("three_heads", 4, 6, 3), case("one_head", 2, 4, 1)]


MULTI_HEAD_ATTENTION = Exercise(
    "multi_head_attention",
    "multi_head_attention(X, Wq, Wk, Wv, Wo, num_heads) -> out   # (T, E), four (E, E) -> (T, E)",
    ("多头注意力：投影、拆成 H 个头、每个头做缩放点积注意力（d_k = E / H）、拼接、乘以 Wo。",
     "Multi-head attention: project, split into H heads, scaled dot-product attention in each (d_k = E / H), concatenate, multiply by Wo."),
    _mha_reference, _mha_cases,
    [Mistake("mha_scale_width", _mha_with(scale_width=True)),
     Mistake("mha_no_wo", _mha_with(wo=False)),
     Mistake("mha_no_split", _mha_with(split="none")),
     Mistake("mha_no_split", _mha_with(split="none", scale_width=True)),  # scaled by √E
     Mistake("mha_bad_split", _mha_with(split="reshape"))],
)


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
    rng = _rng(9)
    constant = _normal(rng, 3, 4)
    constant[1] = 0.7
    return [Case("random", (_normal(rng, 3, 5),)), Case("small_var", (1e-3 * _normal(rng, 4, 6),)),
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
    x = 2.0 + 3.0 * _normal(_rng(11), 3, 8)
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
    rng = _rng(12)
    q, K = _normal(rng, 4), _normal(rng, 8, 4)
    rising = K[np.argsort(K @ q)]  # (S, D): each tile holds a new maximum, so m moves
    return [
        Case("random", (q, rising, _normal(rng, 8, 2), 2)),
        Case("ragged", (_normal(rng, 4), _normal(rng, 7, 4), _normal(rng, 7, 3), 3)),
        Case("large", (100 * _normal(rng, 8), 30 * _normal(rng, 6, 8), _normal(rng, 6, 2), 2)),
        Case("one_block", (_normal(rng, 4), _normal(rng, 5, 4), _normal(rng, 5, 2), 1)),
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
    rng = _rng(13)
    masked = softmax(np.where(np.tril(np.ones((4, 4), bool)), _normal(rng, 4, 4), -np.inf))
    return [
        Case("rect", (softmax(_normal(rng, 3, 5)), _normal(rng, 3, 5))),
        Case("square", (softmax(_normal(rng, 4, 4)), _normal(rng, 4, 4))),
        Case("causal", (masked, _normal(rng, 4, 4))),
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


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (
    QKV, SCORES, SCALED_SCORES, SOFTMAX, ATTENTION, SELF_ATTENTION, CAUSAL_MASK, PADDING_MASK,
    MASKED_ATTENTION, SPLIT_HEADS, MERGE_HEADS, MULTI_HEAD_ATTENTION, SINUSOIDAL, LAYER_NORM,
    RESIDUAL_BLOCK, ONLINE_ATTENTION, SOFTMAX_BACKWARD, ATTENTION_WITH_SINK,
)}
