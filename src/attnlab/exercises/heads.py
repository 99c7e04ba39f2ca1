# ruff: noqa: E501  (a task reads best on one line)
"""The exercises of masks and heads (seed 001): the causal and padding masks, masked
attention, splitting and merging heads, multi-head attention.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..attention import scaled_dot_product_attention, softmax
from ..masks import causal_mask
from ..nn.multihead import MultiHeadAttention, merge_heads, split_heads
from .exercise import Case, Exercise, Mistake, attention_weights, naive_softmax, normal, seeded_rng

__all__ = [
    "CAUSAL_MASK", "PADDING_MASK", "MASKED_ATTENTION", "SPLIT_HEADS", "MERGE_HEADS",
    "MULTI_HEAD_ATTENTION",
]


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
    rng = seeded_rng(5)
    partial = np.array([[True, False, True, False, True], [False, True, True, True, False],
                        [True, True, False, False, False]])
    full_row = np.array([[True, False, False, True], [False, False, False, False],
                         [True, True, True, False]])
    return [
        Case("partial", (normal(rng, 3, 4), normal(rng, 5, 4), normal(rng, 5, 2), partial)),
        Case("causal", (normal(rng, 4, 4), normal(rng, 4, 4), normal(rng, 4, 3),
                        causal_mask(4))),
        Case("full_row", (normal(rng, 3, 4), normal(rng, 4, 4), normal(rng, 4, 2), full_row)),
    ]


MASKED_ATTENTION = Exercise(
    "masked_attention", "masked_attention(Q, K, V, mask) -> out   # (T, D), (S, D), (S, Dv), (T, S) bool -> (T, Dv)",
    ("掩蔽的缩放点积注意力：mask 为 False 的位置不能被关注（True = 可以关注）；一整行都被掩蔽时，这一行输出 0。",
     "Masked scaled dot-product attention: positions where mask is False cannot be attended to (True = may attend); a row with everything masked outputs 0."),
    lambda Q, K, V, mask: scaled_dot_product_attention(Q, K, V, mask), _masked_cases,
    [Mistake("mask_reversed", lambda Q, K, V, m: softmax(_masked_scores(Q, K, ~m, -np.inf), -1) @ V),
     Mistake("mask_reversed", lambda Q, K, V, m: softmax(_masked_scores(Q, K, ~m, -1e9), -1) @ V),
     Mistake("mask_reversed", lambda Q, K, V, m: scaled_dot_product_attention(Q, K, V, ~m)),
     Mistake("mask_after_softmax", lambda Q, K, V, m: (attention_weights(Q, K) * m) @ V),
     Mistake("no_scale", lambda Q, K, V, m: scaled_dot_product_attention(Q, K, V, m, scale=1.0)),
     Mistake("full_row_minus_1e9", lambda Q, K, V, m: softmax(_masked_scores(Q, K, m, -1e9), -1) @ V),
     Mistake("full_row_minus_1e9", lambda Q, K, V, m: softmax(
         Q @ K.T / np.sqrt(K.shape[-1]) + (1 - m) * -1e9, -1) @ V),
     Mistake("full_row_nan", lambda Q, K, V, m: naive_softmax(
         Q @ K.T / np.sqrt(K.shape[-1]) + (1 - m) * -1e9) @ V),
     Mistake("full_row_nan", lambda Q, K, V, m: _global_free_softmax(
         _masked_scores(Q, K, m, -np.inf)) @ V)],
)


def _global_free_softmax(x: np.ndarray) -> np.ndarray:  # max subtracted, no empty-row rule
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------ heads

def _split_cases() -> list[Case]:
    rng = seeded_rng(6)
    return [Case("random", (normal(rng, 2, 3, 8), 2)), Case("three_heads", (normal(rng, 1, 4, 6), 3)),
            Case("one_head", (normal(rng, 2, 2, 4), 1))]


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
    rng = seeded_rng(7)
    return [Case("random", (normal(rng, 2, 2, 3, 4),)), Case("three_heads", (normal(rng, 1, 3, 4, 2),)),
            Case("one_head", (normal(rng, 2, 1, 3, 4),))]


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
    rng = seeded_rng(8)

    def case(label: str, T: int, E: int, H: int) -> Case:
        weights = [normal(rng, E, E) / np.sqrt(E) for _ in range(4)]
        return Case(label, (normal(rng, T, E), *weights, H))
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
