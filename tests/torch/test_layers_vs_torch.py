"""LayerNorm, gelu, FeedForward and the attention layers against torch.

The NumPy-only tests of the same layers are in tests/core/test_layers.py.

Every comparison is against an independent torch reference holding the same parameters,
copied from attnlab to torch. attnlab stores weights (in, out) and applies ``x @ W``;
torch.nn.Linear stores (out, in), hence ``linear.weight = W.T``.

Mask conventions: attnlab's mask is bool, True = may attend. torch.nn.MultiheadAttention
and torch.nn.TransformerEncoderLayer mean the OPPOSITE (True = NOT allowed / padding), so
the tests pass ``~allowed`` and ``~key_padding`` to torch.

Tolerances: both sides compute the same O(E) or O(F) sums in a different order, so
float64 results agree to a few ulps of O(1) values (1e-12 leaves a wide margin) and
float32 ones to a few ulps of 1.2e-7 (1e-6 relative, and 1e-6 absolute for entries near
0 where a relative bound means nothing).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.support.modules import random_key_padding, randomise_attention

import attnlab
from attnlab.masks import causal_mask
from attnlab.nn.layers import EncoderBlock, FeedForward, LayerNorm, SelfAttentionLayer, gelu

F64 = {"rtol": 1e-12, "atol": 1e-12}  # float64: reordered O(E) sums, a few ulps
F32 = {"rtol": 1e-6, "atol": 1e-6}  # float32: reordered O(E) sums, a few ulps of 1.2e-7


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def copy_mha(attn: attnlab.MultiHeadAttention, ref: torch.nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(t(np.concatenate([attn.Wq.T, attn.Wk.T, attn.Wv.T])))
        ref.in_proj_bias.copy_(t(np.concatenate([attn.bq, attn.bk, attn.bv])))
        ref.out_proj.weight.copy_(t(attn.Wo.T))
        ref.out_proj.bias.copy_(t(attn.bo))


def copy_norm(norm: LayerNorm, ref: torch.nn.LayerNorm) -> None:
    with torch.no_grad():
        ref.weight.copy_(t(norm.gamma))
        ref.bias.copy_(t(norm.beta))


def copy_linear(W: np.ndarray, b: np.ndarray, ref: torch.nn.Linear) -> None:
    with torch.no_grad():
        ref.weight.copy_(t(W.T))  # (in, out) -> torch's (out, in)
        ref.bias.copy_(t(b))


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-3, 0.5])
def test_layer_norm_matches_torch_float64(eps):
    rng = np.random.default_rng(0)
    E = 16
    gamma, beta = rng.standard_normal(E), rng.standard_normal(E)
    # An offset and a scale far from (0, 1), so centring and scaling are both exercised.
    x = 3.0 + 5.0 * rng.standard_normal((2, 3, E))

    ours = LayerNorm(E, eps, gamma=gamma, beta=beta)(x)
    ref = torch.nn.LayerNorm(E, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t(gamma))
        ref.bias.copy_(t(beta))
        expected = ref(t(x)).numpy()
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, expected, **F64)  # float64: O(E) reordered sums


def test_layer_norm_matches_torch_float32():
    rng = np.random.default_rng(1)
    E = 16
    gamma = rng.standard_normal(E).astype(np.float32)
    beta = rng.standard_normal(E).astype(np.float32)
    x = (1.0 + 2.0 * rng.standard_normal((4, E))).astype(np.float32)

    ours = LayerNorm(E, 1e-5, gamma=gamma, beta=beta)(x)
    ref = torch.nn.LayerNorm(E, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(t(gamma))
        ref.bias.copy_(t(beta))
        expected = ref(t(x)).numpy()
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, expected, **F32)  # float32: O(E) reordered sums


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_exact_matches_torch(dtype):
    x = np.linspace(-8.0, 8.0, 161).astype(dtype)
    ours = gelu(x)
    expected = F.gelu(t(x)).numpy()
    assert ours.dtype == dtype
    # Both evaluate x/2 (1 + erf(x/sqrt 2)) with a correctly rounded-ish erf; 1 + erf
    # cancels for x << 0, leaving absolute (not relative) error of ~eps there.
    tol = F64 if dtype == np.float64 else F32
    np.testing.assert_allclose(ours, expected, **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_tanh_matches_torch(dtype):
    x = np.linspace(-8.0, 8.0, 161).astype(dtype)
    ours = gelu(x, "tanh")
    expected = F.gelu(t(x), approximate="tanh").numpy()
    assert ours.dtype == dtype
    # Same formula, same constants (sqrt(2/pi), 0.044715); only rounding differs.
    tol = F64 if dtype == np.float64 else F32
    np.testing.assert_allclose(ours, expected, **tol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_on_integers_is_not_truncated(approximate):
    """gelu(int array) must compute in float, not round the result back to int."""
    ints = np.arange(-3, 4)
    expected = F.gelu(t(ints.astype(np.float64)), approximate=approximate).numpy()
    np.testing.assert_allclose(gelu(ints, approximate), expected, **F64)  # float64 rounding


@pytest.mark.parametrize(
    "activation, torch_act",
    [
        ("relu", torch.nn.ReLU()),
        ("gelu", torch.nn.GELU()),
        ("gelu_tanh", torch.nn.GELU(approximate="tanh")),
    ],
)
def test_feed_forward_matches_torch(activation, torch_act):
    rng = np.random.default_rng(3)
    E, Fw = 8, 20
    ffn = FeedForward(E, Fw, activation=activation, seed=0)
    ffn.b1 = rng.standard_normal(Fw)  # init sets the biases to 0; make them count
    ffn.b2 = rng.standard_normal(E)
    x = rng.standard_normal((2, 5, E))

    lin1 = torch.nn.Linear(E, Fw, dtype=torch.float64)
    lin2 = torch.nn.Linear(Fw, E, dtype=torch.float64)
    copy_linear(ffn.W1, ffn.b1, lin1)
    copy_linear(ffn.W2, ffn.b2, lin2)
    with torch.no_grad():
        expected = lin2(torch_act(lin1(t(x)))).numpy()

    ours = ffn(x)
    assert ours.shape == (2, 5, E)
    np.testing.assert_allclose(ours, expected, **F64)  # float64: O(E + F) reordered sums


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("masking", ["key_padding", "causal"])
def test_self_attention_layer_matches_torch_composition(norm, masking):
    rng = np.random.default_rng(4)
    B, T, E, H = 3, 5, 8, 2
    layer = SelfAttentionLayer(E, H, dropout=0.3, norm=norm, seed=1)
    randomise_attention(layer, rng)
    x = rng.standard_normal((B, T, E))
    assert not layer.training  # attnlab layers start in eval mode: dropout is off

    key_padding = random_key_padding(B, T)
    if masking == "key_padding":
        ours = layer(x, mask=key_padding[:, None, None, :])  # (B, 1, 1, S) -> (B, H, T, S)
    else:
        ours = layer(x, is_causal=True)

    mha = torch.nn.MultiheadAttention(E, H, dropout=0.3, batch_first=True, dtype=torch.float64)
    ln = torch.nn.LayerNorm(E, eps=1e-5, dtype=torch.float64)
    copy_mha(layer.attn, mha)
    copy_norm(layer.norm1, ln)
    mha.eval()

    def attend(h: torch.Tensor) -> torch.Tensor:
        if masking == "key_padding":
            # torch: key_padding_mask True = padding, the opposite of attnlab.
            return mha(h, h, h, key_padding_mask=t(~key_padding), need_weights=False)[0]
        # torch: attn_mask True = NOT allowed, the opposite of attnlab.
        return mha(h, h, h, attn_mask=t(~causal_mask(T)), need_weights=False)[0]

    xt = t(x)
    if norm == "post":
        expected = ln(xt + attend(xt))  # LN(x + MHA(x))
    else:
        expected = xt + attend(ln(xt))  # x + MHA(LN(x))
    np.testing.assert_allclose(ours, expected.detach().numpy(), **F64)  # float64 reordered sums


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_encoder_block_matches_torch_transformer_encoder_layer(norm, activation):
    rng = np.random.default_rng(6)
    B, T, E, H, Fw = 3, 5, 8, 2, 16
    block = EncoderBlock(E, H, Fw, activation=activation, dropout=0.2, norm=norm, seed=2)
    randomise_attention(block, rng)
    x = rng.standard_normal((B, T, E))
    key_padding = random_key_padding(B, T)

    ref = torch.nn.TransformerEncoderLayer(
        E, H, dim_feedforward=Fw, dropout=0.0, activation=activation, batch_first=True,
        norm_first=(norm == "pre"), dtype=torch.float64,
    )
    copy_mha(block.attn, ref.self_attn)
    copy_linear(block.ffn.W1, block.ffn.b1, ref.linear1)
    copy_linear(block.ffn.W2, block.ffn.b2, ref.linear2)
    copy_norm(block.norm1, ref.norm1)
    copy_norm(block.norm2, ref.norm2)
    ref.eval()
    # Grad stays enabled (parameters require grad), so torch takes its plain path, which
    # computes every position, padded queries included, like attnlab.
    # torch: src_key_padding_mask True = padding, the opposite of attnlab.
    expected = ref(t(x), src_key_padding_mask=t(~key_padding)).detach().numpy()

    ours = block(x, mask=key_padding[:, None, None, :])  # (B, 1, 1, S), True = real token
    assert ours.shape == (B, T, E)
    np.testing.assert_allclose(ours, expected, **F64)  # float64: O(E + F) reordered sums


def test_encoder_block_float32_matches_torch():
    rng = np.random.default_rng(7)
    B, T, E, H, Fw = 2, 4, 8, 2, 16
    block = EncoderBlock(E, H, Fw, activation="relu", dropout=0.0, norm="pre", seed=3)
    randomise_attention(block, rng)
    for name, value in block.attn.parameters().items():
        setattr(block.attn, name, value.astype(np.float32))
    for obj, names in ((block.ffn, ("W1", "b1", "W2", "b2")), (block.norm1, ("gamma", "beta")),
                       (block.norm2, ("gamma", "beta"))):
        for name in names:
            setattr(obj, name, getattr(obj, name).astype(np.float32))
    x = rng.standard_normal((B, T, E)).astype(np.float32)

    ref = torch.nn.TransformerEncoderLayer(
        E, H, dim_feedforward=Fw, dropout=0.0, activation="relu", batch_first=True,
        norm_first=True,
    )
    copy_mha(block.attn, ref.self_attn)
    copy_linear(block.ffn.W1, block.ffn.b1, ref.linear1)
    copy_linear(block.ffn.W2, block.ffn.b2, ref.linear2)
    copy_norm(block.norm1, ref.norm1)
    copy_norm(block.norm2, ref.norm2)
    ref.eval()
    expected = ref(t(x)).detach().numpy()

    ours = block(x)
    assert ours.dtype == np.float32
    # float32 through two sublayers: a few ulps each; 1e-5 absolute on O(1) outputs.
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)

