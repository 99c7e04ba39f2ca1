"""The hand-written backward passes of GELU, the feed-forward layer, whole encoder blocks
and the whole BERT encoder (embeddings included), and the head-importance gradients,
against central finite differences in float64.

Tolerance: relative 1e-6 (the issue's bar). Central differences with step 1e-5 on
float64 functions of O(1) values have a truncation error ~ h² = 1e-10 and a rounding
error ~ 1e-16 / h = 1e-11, far below it."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.tiny_bert import tiny_bert

from attnlab.errors import AttnlabError
from attnlab.lens.hooks import hooked
from attnlab.lens.importance import head_gradients, pair_cosine
from attnlab.models.bert_backward import bert_backward
from attnlab.nn.backward import block_backward, feed_forward_backward, gelu_backward
from attnlab.nn.layers import EncoderBlock, FeedForward, SelfAttentionLayer, gelu

STEP = 1e-5
RTOL = 1e-6


def numeric(f, array, index, step=STEP):
    """Central difference of the scalar f() in array[index] (restored afterwards)."""
    old = array[index]
    array[index] = old + step
    up = f()
    array[index] = old - step
    down = f()
    array[index] = old
    return (up - down) / (2 * step)


def assert_close(got, expected):
    scale = max(abs(expected), 1e-3)  # relative, except for gradients near 0
    assert abs(got - expected) <= RTOL * scale, (got, expected)


def sample(shape, rng, n=4):
    return [tuple(int(rng.integers(s)) for s in shape) for _ in range(n)]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward(approximate) -> None:
    x = np.linspace(-6, 6, 41)
    upstream = np.cos(x)
    got = gelu_backward(x, upstream, approximate)
    expected = upstream * (gelu(x + STEP, approximate) - gelu(x - STEP, approximate)) / (2 * STEP)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-9)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_feed_forward_backward(activation) -> None:
    rng = np.random.default_rng(0)
    ffn = FeedForward(6, 10, activation=activation, seed=1)
    ffn.b1 = rng.standard_normal(10)
    x = rng.standard_normal((2, 3, 6))
    weights = rng.standard_normal((2, 3, 6))

    def loss():
        return float((ffn.forward(x) * weights).sum())

    grads = feed_forward_backward(ffn, x, weights)
    for index in sample(x.shape, rng):
        assert_close(grads.dx[index], numeric(loss, x, index))
    for name in ("W1", "b1", "W2", "b2"):
        param = getattr(ffn, name)
        for index in sample(param.shape, rng):
            assert_close(grads.params[name][index], numeric(loss, param, index))


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("kind", [EncoderBlock, SelfAttentionLayer])
def test_block_backward_with_gates_and_padding(norm, kind) -> None:
    rng = np.random.default_rng(2)
    block = (EncoderBlock(8, 2, 12, dropout=0.0, norm=norm, seed=3) if kind is EncoderBlock
             else SelfAttentionLayer(8, 2, dropout=0.0, norm=norm, seed=3))
    for param in block.attn.parameters().values():
        param += 0.3 * rng.standard_normal(param.shape)
    block.norm1.gamma = 1 + 0.2 * rng.standard_normal(8)
    x = rng.standard_normal((2, 4, 8))
    real = np.array([[True, True, True, True], [True, True, True, False]])
    mask = real[:, None, None, :]  # (B, 1, 1, T)
    gates = np.array([0.7, 1.3])
    weights = rng.standard_normal((2, 4, 8))
    Dv = block.attn.value_head_dim

    def loss():
        original = block.attn.Wo
        block.attn.Wo = original * np.repeat(gates, Dv)[:, None]
        try:
            return float((block(x, mask) * weights).sum())
        finally:
            block.attn.Wo = original

    grads = block_backward(block, x, weights, mask, head_gates=gates)
    for h in range(2):
        assert_close(grads.dgates[h], numeric(loss, gates, h))
    for index in sample(x.shape, rng, 6):
        assert_close(grads.dx[index], numeric(loss, x, index))
    params = {f"attn.{k}": v for k, v in block.attn.parameters().items()}
    params["norm1.gamma"], params["norm1.beta"] = block.norm1.gamma, block.norm1.beta
    if kind is EncoderBlock:
        params.update({"ffn.W1": block.ffn.W1, "ffn.b2": block.ffn.b2,
                       "norm2.gamma": block.norm2.gamma})
    for name, param in params.items():
        if name == "attn.Wo":  # the loss reads Wo through the gates: Wo' = G Wo
            continue
        for index in sample(param.shape, rng, 2):
            assert_close(grads.params[name][index], numeric(loss, param, index))
    # dWo: the loss depends on Wo[r, c] through Wo'[r, c] = ξ_h Wo[r, c]
    for index in sample(block.attn.Wo.shape, rng, 3):
        assert_close(grads.params["attn.Wo"][index], numeric(loss, block.attn.Wo, index))


def _gated_hidden(model, ids, real, gates):
    def scale(layer, heads):
        return heads * gates[layer][None, :, None, None]

    with hooked(model, heads=scale):
        return model.forward(ids, real)


def test_bert_backward_every_kind_of_weight_and_the_gates() -> None:
    model = tiny_bert(seed=4)
    rng = np.random.default_rng(5)
    ids = np.array([[1, 5, 7, 3, 2], [1, 9, 2, 0, 0]])  # the second row left-aligned, padded
    real = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    types = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    weights = rng.standard_normal((2, 5, 8)) * real[..., None]
    gates = np.array([[1.0, 1.0], [0.8, 1.2], [1.0, 0.5]])

    def loss():
        return float((_gated_hidden_types(model, ids, real, types, gates) * weights).sum())

    grads = bert_backward(model, ids, weights, real, types, head_gates=gates)
    for index in np.ndindex(gates.shape):
        assert_close(grads.dgates[index], numeric(loss, gates, index))
    for name, array in (("word", model.word_embeddings), ("position", model.position_embeddings),
                        ("token_type", model.token_type_embeddings)):
        rows = {"word": [1, 5, 9, 0, 4], "position": [0, 3, 6], "token_type": [0, 1]}[name]
        for row in rows:  # 0 is the padding id (used, but its positions are masked); 4 unused
            column = int(rng.integers(array.shape[1]))
            assert_close(grads.embeddings[name][row, column],
                         numeric(loss, array, (row, column)))
    assert_close(grads.embeddings["norm.gamma"][3], numeric(loss, model.embedding_norm.gamma, 3))
    block = model.layers[1]
    for name, param in (("attn.Wq", block.attn.Wq), ("attn.bv", block.attn.bv),
                        ("ffn.W2", block.ffn.W2), ("norm2.beta", block.norm2.beta)):
        for index in sample(param.shape, rng, 2):
            assert_close(grads.layers[1][name][index], numeric(loss, param, index))


def _gated_hidden_types(model, ids, real, types, gates):
    def scale(layer, heads):
        return heads * gates[layer][None, :, None, None]

    with hooked(model, heads=scale):
        return model.forward(ids, real, types)


def test_pair_cosine_importance_gradients() -> None:
    model = tiny_bert(seed=6)
    ids = np.array([[1, 5, 7, 3, 2], [1, 9, 11, 6, 2]])  # padding: see the test above
    real = np.ones((2, 5), dtype=np.int64)
    gates = np.ones((3, 2))

    def loss():
        return pair_cosine(_gated_hidden(model, ids, real, gates), real)[0]

    value, dgates = head_gradients(model, ids, pair_cosine)
    assert value == pytest.approx(loss(), abs=1e-14)
    for index in np.ndindex(gates.shape):
        assert_close(dgates[index], numeric(loss, gates, index))


def test_backward_errors() -> None:
    model = tiny_bert()
    with pytest.raises(AttnlabError, match=r"head_gates: expected \(3, 2\)"):
        bert_backward(model, np.array([[1, 2]]), np.zeros((1, 2, 8)), head_gates=np.ones(2))
    with pytest.raises(AttnlabError, match="dout|dhidden|expected"):
        bert_backward(model, np.array([[1, 2]]), np.zeros((1, 3, 8)))
    with pytest.raises(AttnlabError, match=r"input_ids: expected ids in \[0, 20\)"):
        bert_backward(model, np.array([[1, 20]]), np.zeros((1, 2, 8)))
    with pytest.raises(AttnlabError, match="attention_mask: expected"):
        bert_backward(model, np.array([[1, 2]]), np.zeros((1, 2, 8)), np.ones((1, 3)))
    block = EncoderBlock(8, 2, 12, dropout=0.1)
    block.train()
    with pytest.raises(AttnlabError, match="block: the backward pass covers evaluation mode"):
        block_backward(block, np.zeros((1, 2, 8)), np.zeros((1, 2, 8)))
