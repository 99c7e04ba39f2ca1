"""Seed 000's NumPy functions, copied from the article unchanged.

Global RNG, softmax without max-subtraction: that is the point. Used by
tests/core/test_seeds.py and tests/torch/test_seeds_torch.py.
"""

import numpy as np


def seed000_self_attention(X, Wq, Wk, Wv):
    # 计算QKV
    Q = np.dot(X, Wq)
    K = np.dot(X, Wk)
    V = np.dot(X, Wv)

    # 计算注意力分数
    attention_scores = np.dot(Q, K.T) / np.sqrt(K.shape[1])
    attention_weights = np.exp(attention_scores) / np.sum(np.exp(attention_scores), axis=1, keepdims=True)  # noqa: E501

    # 加权求和
    output = np.dot(attention_weights, V)

    return output


def seed000_multi_head_attention(X, head=4):
    # 假设我们有4个头
    outputs = []
    for _ in range(head):
        # 每个头有自己的Wq,Wk,Wv
        Wq = np.random.randn(X.shape[1], 3)
        Wk = np.random.randn(X.shape[1], 3)
        Wv = np.random.randn(X.shape[1], 3)

        # 计算单个头的输出
        output = seed000_self_attention(X, Wq, Wk, Wv)
        outputs.append(output)

    # 拼接所有头的输出
    multi_head_output = np.concatenate(outputs, axis=1)

    return multi_head_output

