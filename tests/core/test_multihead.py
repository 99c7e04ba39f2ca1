"""MultiHeadAttention against independent NumPy references.

References: a per-head NumPy loop written here and seed 000's ``SelfAttention`` class
copied verbatim (the comparisons with torch.nn.MultiheadAttention and torch's SDPA are in
tests/torch/test_multihead_vs_torch.py). attnlab is never compared with itself, except
where a test is about the library's own consistency (unbatched == batched with B = 1).

Mask conventions differ and are converted explicitly:

- attnlab ``mask``: bool, True = may attend; ``key_padding`` (B, S): True = real token.
- seed 000: a 0/1 array with 1 = blocked, added as ``mask * -1e9``; ``from_blocked(m)``.

Tolerances (see ``TOL``): both sides compute the same O(E) sums of products, in a different
order. In float64 that leaves errors of a few ulps of O(1) values, far below 1e-12. In
float32 the same reasoning gives a few ulps of 1.2e-7, so 1e-6 relative (with 1e-6 absolute
for entries that happen to be near 0, where a relative bound means nothing).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tests.support.modules import random_allowed, random_params

import attnlab
from attnlab.masks import from_blocked
from attnlab.nn.multihead import MultiHeadAttention

#: rtol/atol per dtype; the reasons are in the module docstring.
TOL = {
    np.float64: {"rtol": 1e-12, "atol": 1e-12},
    np.float32: {"rtol": 1e-6, "atol": 1e-6},
}


# ------------------------------------------------------------------------------------- GQA


def gqa_reference_loop(mha: MultiHeadAttention, x, context, allowed):
    """Hand-written GQA: one head at a time, kv head chosen by repeat_interleave's rule.

    Query head h reads kv head ``kv_of[h]`` with ``kv_of = repeat_interleave(arange(Hkv),
    H // Hkv)``, i.e. consecutive query heads share a kv head.
    """
    B, T, _ = x.shape
    S = context.shape[1]
    H, Hkv, D = mha.num_heads, mha.num_kv_heads, mha.head_dim
    kv_of = np.repeat(np.arange(Hkv), H // Hkv)  # numpy's repeat == torch.repeat_interleave
    out = np.zeros((B, T, mha.Wo.shape[1]))
    weights = np.zeros((B, H, T, S))
    for b in range(B):
        heads = []
        for h in range(H):
            g = kv_of[h]
            q = x[b] @ mha.Wq[:, h * D:(h + 1) * D] + mha.bq[h * D:(h + 1) * D]  # (T, D)
            k = context[b] @ mha.Wk[:, g * D:(g + 1) * D] + mha.bk[g * D:(g + 1) * D]  # (S, D)
            v = context[b] @ mha.Wv[:, g * D:(g + 1) * D] + mha.bv[g * D:(g + 1) * D]  # (S, D)
            scores = q @ k.T / np.sqrt(D)  # (T, S)
            scores = np.where(allowed, scores, -np.inf)
            e = np.exp(scores - scores.max(axis=-1, keepdims=True))
            w = e / e.sum(axis=-1, keepdims=True)  # (T, S)
            weights[b, h] = w
            heads.append(w @ v)  # (T, D)
        out[b] = np.concatenate(heads, axis=-1) @ mha.Wo + mha.bo  # (T, E)
    return out, weights


@pytest.mark.parametrize("H, Hkv", [(4, 2), (6, 2), (3, 1)])
def test_gqa_matches_hand_written_loop(H, Hkv):
    rng = np.random.default_rng(4)
    B, T, S, E, D = 2, 3, 5, 6, 2
    mha = random_params(rng, E, H, Hkv=Hkv, D=D)
    x = rng.standard_normal((B, T, E))
    context = rng.standard_normal((B, S, E))
    allowed = random_allowed(rng, T, S)

    ours, our_weights = mha(x, context, mask=allowed, return_weights=True)
    expected, expected_weights = gqa_reference_loop(mha, x, context, allowed)
    # float64, same sums in a different order: 1e-12.
    np.testing.assert_allclose(ours, expected, **TOL[np.float64])
    np.testing.assert_allclose(our_weights, expected_weights, **TOL[np.float64])


# ------------------------------------------------------------------------------- unbatched


def test_unbatched_equals_batched_with_one_sequence():
    rng = np.random.default_rng(6)
    T, S, E, H = 4, 5, 8, 2
    mha = random_params(rng, E, H)
    x = rng.standard_normal((T, E))
    context = rng.standard_normal((S, E))
    allowed = random_allowed(rng, T, S)
    key_padding = np.array([True, True, True, False, True])

    out, weights = mha(x, context, mask=allowed, key_padding=key_padding, return_weights=True)
    out_b, weights_b = mha(
        x[None], context[None], mask=allowed, key_padding=key_padding[None], return_weights=True
    )
    assert out.shape == (T, E) and weights.shape == (H, T, S)
    # Same arithmetic on the same numbers; only the batch loop differs. 1e-14 leaves room
    # for a BLAS that blocks a (T, E) and a (1, T, E) product differently.
    np.testing.assert_allclose(out, out_b[0], rtol=0, atol=1e-14)
    np.testing.assert_allclose(weights, weights_b[0], rtol=0, atol=1e-14)


# ------------------------------------------------------------------------------- seed 000


# Copied verbatim from seed article 000 (section 8); only the
# trailing spaces of its blank lines were dropped and a noqa added to its one long line.
# Mask convention: 1 = blocked, added as mask * -1e9. No biases. Head split reshapes
# (batch, seq, heads*dim) -> (batch, seq, heads, dim), i.e. head h = columns h*D:(h+1)*D,
# the same column layout as attnlab's split_heads.
class SelfAttention:
    def __init__(self, input_dim, head_dim, num_heads):
        self.input_dim = input_dim
        self.head_dim = head_dim
        self.num_heads = num_heads

        # 初始化权重矩阵
        self.Wq = np.random.randn(input_dim, head_dim * num_heads)
        self.Wk = np.random.randn(input_dim, head_dim * num_heads)
        self.Wv = np.random.randn(input_dim, head_dim * num_heads)
        self.Wo = np.random.randn(head_dim * num_heads, input_dim)

    def __call__(self, X, mask=None):
        batch_size, seq_len, _ = X.shape

        # 线性变换得到QKV
        Q = np.dot(X, self.Wq)  # (batch, seq, head*dim)
        K = np.dot(X, self.Wk)
        V = np.dot(X, self.Wv)

        # 分割多头
        Q = Q.reshape(batch_size, seq_len, self.num_heads, self.head_dim)
        K = K.reshape(batch_size, seq_len, self.num_heads, self.head_dim)
        V = V.reshape(batch_size, seq_len, self.num_heads, self.head_dim)

        # 计算注意力分数
        attention_scores = np.einsum('bqhd,bkhd->bhqk', Q, K) / np.sqrt(self.head_dim)

        # 应用掩码（如果有）
        if mask is not None:
            attention_scores = attention_scores + mask * -1e9

        # softmax归一化
        attention_weights = np.exp(attention_scores) / np.sum(np.exp(attention_scores), axis=3, keepdims=True)  # noqa: E501

        # 加权求和
        output = np.einsum('bhqk,bkhd->bqhd', attention_weights, V)
        output = output.reshape(batch_size, seq_len, self.num_heads * self.head_dim)

        # 最终线性变换
        output = np.dot(output, self.Wo)

        return output
# (end of the verbatim copy)


def seed_000_with_weights(rng: np.random.Generator, E: int, D: int, H: int) -> SelfAttention:
    """The seed's class, with its global-RNG weights replaced by ones drawn from ``rng``.

    Scaled by 1/sqrt(fan_in) so the seed's unstabilised exp() stays far from overflow.
    """
    seed_layer = SelfAttention(E, D, H)
    seed_layer.Wq = rng.standard_normal((E, H * D)) / np.sqrt(E)
    seed_layer.Wk = rng.standard_normal((E, H * D)) / np.sqrt(E)
    seed_layer.Wv = rng.standard_normal((E, H * D)) / np.sqrt(E)
    seed_layer.Wo = rng.standard_normal((H * D, E)) / np.sqrt(H * D)
    return seed_layer


def attnlab_like(seed_layer: SelfAttention) -> MultiHeadAttention:
    return MultiHeadAttention(
        Wq=seed_layer.Wq, Wk=seed_layer.Wk, Wv=seed_layer.Wv, Wo=seed_layer.Wo,
        num_heads=seed_layer.num_heads,
    )


@pytest.mark.parametrize("with_mask", [False, True])
def test_seed_000_self_attention_class(with_mask):
    rng = np.random.default_rng(7)
    B, T, E, D, H = 2, 4, 6, 2, 3
    seed_layer = seed_000_with_weights(rng, E, D, H)
    x = rng.standard_normal((B, T, E))
    # Seed convention: 1 = blocked. Every row keeps at least one 0 (one open key).
    blocked = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 1], [0, 1, 0, 0]])

    expected = seed_layer(x, blocked if with_mask else None)
    mask = from_blocked(blocked) if with_mask else None
    ours, _ = attnlab_like(seed_layer)(x, mask=mask)

    # float64. exp(s - 1e9) underflows to exactly 0, so blocked keys drop out on both
    # sides; the seed skips the max subtraction, which changes rounding only: 1e-12.
    np.testing.assert_allclose(ours, expected, **TOL[np.float64])


def test_seed_000_fully_blocked_row_is_nan_where_attnlab_gives_zero():
    """Documented difference: a query with every key blocked.

    The seed adds -1e9 and then takes exp() without subtracting the row max, so every
    exp underflows to 0 and the row is 0/0 = NaN. attnlab's rule: weights 0, output 0
    (plus bo, which is None here).
    """
    rng = np.random.default_rng(8)
    B, T, E, D, H = 1, 3, 4, 2, 2
    seed_layer = seed_000_with_weights(rng, E, D, H)
    x = rng.standard_normal((B, T, E))
    blocked = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1]])  # row 1 sees nothing

    with np.errstate(invalid="ignore"):  # the seed's 0/0
        expected = seed_layer(x, blocked)
    ours, weights = attnlab_like(seed_layer)(x, mask=from_blocked(blocked), return_weights=True)

    assert np.isnan(expected[0, 1]).all()
    assert (ours[0, 1] == 0).all() and (weights[0, :, 1] == 0).all()
    assert np.isfinite(ours).all()
    # Rows with at least one open key agree (float64, reordered sums: 1e-12).
    np.testing.assert_allclose(ours[0, [0, 2]], expected[0, [0, 2]], **TOL[np.float64])

    # Neither -1e9 variant gives attnlab's 0 even with a stabilised softmax: filling the row
    # with -1e9 (seed 001's masked_fill) makes it uniform, and *adding* -1e9 to every score
    # of the row (seed 000) shifts them all equally, so the mask has no effect at all.
    scores = np.array([0.3, -1.2, 2.0])

    def stable_softmax(s):
        return np.exp(s - s.max()) / np.exp(s - s.max()).sum()

    assert (stable_softmax(np.full(3, -1e9)) == 1 / 3).all()  # exact: all exps are 1
    # 1e9 + O(1) in float64 keeps the O(1) part to ~1e-7, hence 1e-6.
    np.testing.assert_allclose(stable_softmax(scores - 1e9), stable_softmax(scores), atol=1e-6)


# ----------------------------------------------------------------------------- validation


def _weights(E=8, H=2, Hkv=None, D=4, Ekv=None, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    Ekv = E if Ekv is None else Ekv
    Hkv = H if Hkv is None else Hkv
    return {
        "Wq": rng.standard_normal((E, H * D)),
        "Wk": rng.standard_normal((Ekv, Hkv * D)),
        "Wv": rng.standard_normal((Ekv, Hkv * D)),
        "Wo": rng.standard_normal((H * D, E)),
    }


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"Wq": np.ones((8, 7))}, r"Wq: expected \(E, H\*D\) with H = 2 dividing its width"),
        ({"Wq": np.ones(8)}, r"Wq: expected a 2-D \(in, out\) matrix, got \(8\)"),
        ({"num_kv_heads": 3}, "num_kv_heads: expected a divisor of num_heads = 2, got 3"),
        ({"num_heads": 0}, "num_heads: expected an integer >= 1, got 0"),
        ({"num_heads": 2.0}, "num_heads: expected an integer, got float"),
        ({"Wk": np.ones((8, 6))}, re.escape("Wk: expected (Ekv, Hkv*D) = (Ekv, 8)")),
        ({"Wo": np.ones((6, 8))}, re.escape("Wo: expected (H*Dv, E_out) = (8, E_out), got (6, 8)")),
        ({"bq": np.ones(7)}, re.escape("bq: expected (8,), got (7)")),
        ({"bk": np.ones((1, 8))}, re.escape("bk: expected (8,), got (1, 8)")),
        ({"bv": np.ones(9)}, re.escape("bv: expected (8,), got (9)")),
        ({"bo": np.ones(4)}, re.escape("bo: expected (8,), got (4)")),
        ({"Wq": np.full((8, 8), np.nan)}, "Wq: expected finite values"),
    ],
)
def test_constructor_validation(overrides, match):
    kwargs = {**_weights(), "num_heads": 2, **overrides}
    with pytest.raises(attnlab.AttnlabError, match=match):
        MultiHeadAttention(**kwargs)


def test_num_kv_heads_not_dividing_num_heads_in_init():
    match = "num_kv_heads: expected a divisor of num_heads = 4, got 3"
    with pytest.raises(attnlab.AttnlabError, match=match):
        MultiHeadAttention(**_weights(E=8, H=4, Hkv=3, D=2), num_heads=4, num_kv_heads=3)


def _x(shape=(2, 5, 8)):
    return np.ones(shape)


def _bools(shape):
    return np.ones(shape, dtype=bool)


KP = _bools((2, 5))  # a valid key_padding for x of shape (2, 5, 8)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((_x((2, 5, 7)),), {},
         r"x: expected \(B, T, 8\) or \(T, 8\) with E = d_model, got \(2, 5, 7\)"),
        ((_x((1, 2, 5, 8)),), {}, r"x: expected \(B, T, 8\) or \(T, 8\) .*got \(1, 2, 5, 8\)"),
        ((_x((8,)),), {}, r"x: expected \(B, T, 8\) or \(T, 8\) .*got \(8\)"),
        ((_x() * np.nan,), {}, "x: expected finite values"),
        ((_x(), _x((2, 4, 7))), {}, r"context: expected \(2, S, 8\) to match .* got \(2, 4, 7\)"),
        ((_x(), _x((3, 4, 8))), {}, r"context: expected \(2, S, 8\) to match .* got \(3, 4, 8\)"),
        ((_x(), _x((4, 8))), {},
         r"context: expected \(2, S, 8\) to match x's batch and d_context = 8, got \(4, 8\)"),
        ((_x(),), {"key_padding": _bools((2, 4))}, r"key_padding: .*\(2, 5\) .*got bool \(2, 4\)"),
        ((_x(),), {"key_padding": _x((2, 5))}, r"key_padding: .*\(2, 5\) .*got float64 \(2, 5\)"),
        ((_x(),), {"key_padding": _bools(5)}, r"key_padding: expected bool \(2, 5\)"),
        ((_x(),), {"mask": np.ones((5, 5), np.int64)}, "mask: expected a bool .*dtype int64"),
        ((_x(),), {"mask": _x((5, 5))}, "mask: expected a bool array .*got dtype float64"),
        ((_x(),), {"mask": _bools((5, 4))}, "mask: expected a shape broadcastable to"),
        ((_x(),), {"bias": _x((3, 5, 5))}, "bias: expected a shape broadcastable to"),
        # A bad mask is refused with AttnlabError also when combined with key_padding
        # (it used to reach numpy's `&` first: TypeError / a bare broadcasting ValueError).
        ((_x(),), {"mask": _x((5, 5)), "key_padding": KP}, "mask: expected a bool array"),
        ((_x(),), {"mask": _bools((5, 4)), "key_padding": KP}, "mask: expected a shape broadcast"),
    ],
)
def test_call_validation(args, kwargs, match):
    mha = MultiHeadAttention(**_weights(), num_heads=2)
    with pytest.raises(attnlab.AttnlabError, match=match):
        mha(*args, **kwargs)


@pytest.mark.parametrize("dtype, message", [
    (int, "dtype: expected a float dtype .*, got int64"),  # was: every weight rounded to 0
    ("banana", "dtype: expected a float dtype, got 'banana'"),
])
def test_init_refuses_non_float_dtypes(dtype, message):
    with pytest.raises(attnlab.AttnlabError, match=message):
        MultiHeadAttention.init(2, 8, dtype=dtype)


def test_huge_inputs_are_refused_not_nan():
    mha = MultiHeadAttention.init(2, 8)
    with pytest.raises(attnlab.AttnlabError, match="the scaled scores could reach"):
        mha(np.full((3, 8), 1e200))


def test_ragged_key_padding_is_a_named_error():
    mha = MultiHeadAttention.init(2, 4)
    with pytest.raises(attnlab.AttnlabError, match="key_padding: could not be read as an array"):
        mha(np.ones((2, 3, 4)), key_padding=[[True, True, True], [True]])


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
def test_scale_multiplies_the_scores(scale):
    """``scale`` (None: 1/√D) against a hand-written per-head loop; float64, 1e-12 (TOL)."""
    rng = np.random.default_rng(7)
    H, D, E, T = 2, 3, 6, 4
    mha = MultiHeadAttention.init(H, E, seed=1, scale=scale)
    x = rng.standard_normal((T, E))
    allowed = np.tril(np.ones((T, T), dtype=bool))
    factor = 1 / np.sqrt(D) if scale is None else scale
    heads, patterns = [], []
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        q, k, v = (x @ w[:, cols] + b[cols] for w, b in ((mha.Wq, mha.bq), (mha.Wk, mha.bk),
                                                         (mha.Wv, mha.bv)))  # (T, D)
        scores = np.where(allowed, q @ k.T * factor, -np.inf)  # (T, T)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        patterns.append(e / e.sum(axis=-1, keepdims=True))
        heads.append(patterns[-1] @ v)  # (T, D)
    expected = np.concatenate(heads, axis=-1) @ mha.Wo + mha.bo  # (T, E)
    out, weights = mha(x, mask=allowed, return_weights=True)
    np.testing.assert_allclose(out, expected, **TOL[np.float64])
    np.testing.assert_allclose(weights, np.stack(patterns), **TOL[np.float64])
    assert mha.score_scale() == factor


@pytest.mark.parametrize("scale, message", [
    ("0.5", r"^scale: expected a real number .*"), (float("inf"), r"^scale: .*finite.*"),
])
def test_scale_is_checked(scale, message):
    with pytest.raises(attnlab.AttnlabError, match=message):
        MultiHeadAttention.init(2, 4, scale=scale)

