"""explain as a full-layer lab: scaling off, positions, Wo, residual, LayerNorm, padding,
the two multi-head layouts, and the notes it adds. Every number is checked against a
computation written out here in plain NumPy (float64), not against explain itself."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.seeds import seed000_self_attention

import attnlab
from attnlab import AttnlabError, ShapeError, explain
from attnlab.lens.explain_notes import naive_softmax_fails
from attnlab.report import to_text

# Every comparison below is float64 against float64 done in a different order (whole
# matrix vs column block, one LayerNorm formula vs another): a few ulps of values of
# order 1-10, so 1e-12 absolute leaves three orders of margin and catches any real slip.
ATOL = 1e-12


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


def _nonzero_notes(trace, kind):
    return [n for n in trace.meta["notes"] if n["kind"] == kind]


def test_fused_split_is_the_same_computation_as_per_head():
    """Seed 001 projects once and does view(T, H, d_k).transpose; seed 000 gives each head
    its own columns. Same weights -> the same heads, the same output."""
    X = np.random.default_rng(1).standard_normal((5, 8))
    a = explain(X, num_heads=2, split="per_head", d_k=4, Wo=True, seed=7)
    b = explain(X, num_heads=2, split="fused", Wo=True, seed=7)
    np.testing.assert_allclose(b.weights(), a.weights(), atol=ATOL)
    np.testing.assert_allclose(b.output, a.output, atol=ATOL)
    # Seed 001's code, written out: lin(x).view(B, -1, h, d_k).transpose(1, 2), per head
    # attention, transpose back, view(B, -1, h*d_k), last linear layer.
    Wq, Wk, Wv, Wo = (b.get(k).values for k in ("Wq", "Wk", "Wv", "Wo"))
    Q, K, V = ((X @ W).reshape(1, 5, 2, 4).transpose(0, 2, 1, 3) for W in (Wq, Wk, Wv))
    p_attn = _softmax(Q @ K.transpose(0, 1, 3, 2) / np.sqrt(4))  # (1, 2, 5, 5)
    x = (p_attn @ V).transpose(0, 2, 1, 3).reshape(1, 5, 8)
    np.testing.assert_allclose(b.get("concat").values, x[0], atol=ATOL)
    np.testing.assert_allclose(b.output, x[0] @ Wo, atol=ATOL)
    np.testing.assert_allclose(b.get("Q", head=1).values, Q[0, 1], atol=ATOL)
    assert "view(T, H, d_k).transpose(0, 1)[1]" in b.get("Q", head=1).formula
    assert [s.key for s in b][4:7] == ["Q_all", "K_all", "V_all"]
    with pytest.raises(ShapeError, match="split='fused' divides E = 4 into 3 heads"):
        explain(num_heads=3, split="fused")
    with pytest.raises(ShapeError, match="split='fused' uses d_k = E / H = 2, got 3"):
        explain(num_heads=2, split="fused", d_k=3)


def test_no_scale_feeds_raw_scores_to_softmax():
    trace = explain(scale=1.0, seed=2)
    assert "scaled" not in [s.key for s in trace]
    scores = trace.get("scores").values
    np.testing.assert_allclose(trace.get("weights").values, _softmax(scores), atol=ATOL)
    assert trace.get("weights").formula == "weights = softmax(scores, axis=-1)"
    assert _nonzero_notes(trace, "scaling_off")
    scaled = explain(seed=2)
    # Unscaled scores are √3 times as spread: the largest weight of each row only grows.
    assert (trace.weights().max(-1) >= scaled.weights().max(-1) - 1e-15).all()


def test_sinusoidal_positions_tell_the_two_the_apart():
    tokens = "the cat sat on the mat".split()
    plain = explain(tokens=tokens)
    np.testing.assert_array_equal(plain.get("weights").values[0], plain.get("weights").values[4])
    [same] = _nonzero_notes(plain, "same_rows")
    assert same["rows"] == [0, 4] and same["tokens"] == ["the", "the"]
    en = to_text(plain, "en")
    assert "Tokens the, the (positions 1, 5) have identical input rows" in en

    placed = explain(tokens=tokens, pos="sinusoidal")
    X = attnlab.token_embeddings(tokens)
    p, i = np.arange(6)[:, None], np.arange(2)[None, :]
    pe = np.zeros((6, 4))
    pe[:, 0::2] = np.sin(p / 10000 ** (2 * i / 4))  # the paper's formula, by hand
    pe[:, 1::2] = np.cos(p / 10000 ** (2 * i / 4))
    np.testing.assert_allclose(placed.get("pe").values, pe, atol=ATOL)
    np.testing.assert_allclose(placed.get("embedded").values, X + pe, atol=ATOL)
    w = placed.get("weights").values
    assert not np.allclose(w[0], w[4])
    assert not _nonzero_notes(placed, "same_rows")


def test_learned_positions_are_an_untrained_table():
    trace = explain(tokens="a b a".split(), pos="learned")
    pe = trace.get("pe").values
    assert pe.shape == (3, 4) and 0 < pe.std() < 0.1  # N(0, 0.02²) before training
    np.testing.assert_allclose(trace.get("embedded").values,
                               trace.get("X").values + pe, atol=ATOL)
    assert "pe" in _nonzero_notes(trace, "untrained")[0]["weights"]


def test_rope_scores_depend_only_on_the_distance():
    """Identical tokens everywhere: with RoPE, score(i, j) is a function of i - j."""
    X = np.tile([[0.3, -1.2, 0.8, 0.5]], (5, 1))
    trace = explain(X, pos="rope", d_k=4, seed=4)
    S = trace.get("scores").values
    for offset in range(-4, 5):
        diagonal = np.diagonal(S, offset)
        np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-12)
    assert not np.allclose(S[0, 1], S[0, 2])  # and it does change with the distance
    q = trace.get("Q").values
    np.testing.assert_allclose(np.linalg.norm(trace.get("Q_rope").values, axis=-1),
                               np.linalg.norm(q, axis=-1), atol=ATOL)  # rotations keep norms
    with pytest.raises(ShapeError, match="pos='rope' rotates pairs of features, expected an "
                                         "even d_k, got 3"):
        explain(pos="rope")


def test_wo_residual_and_post_layer_norm_written_out():
    trace = explain(num_heads=2, d_k=2, Wo=True, norm="post", seed=5)
    X = trace.get("X").values
    concat, Wo = trace.get("concat").values, trace.get("Wo").values
    np.testing.assert_allclose(trace.get("projected").values, concat @ Wo, atol=ATOL)
    np.testing.assert_allclose(trace.get("residual").values, X + concat @ Wo, atol=ATOL)
    np.testing.assert_allclose(trace.output, _layer_norm(X + concat @ Wo), atol=ATOL)
    # The library's own modules agree: MultiHeadAttention with the same weights.
    Wq, Wk, Wv = (trace.get(k).values for k in ("Wq", "Wk", "Wv"))
    mha = attnlab.MultiHeadAttention(Wq, Wk, Wv, Wo, num_heads=2)
    np.testing.assert_allclose(trace.get("projected").values, mha(X)[0], atol=ATOL)


def test_pre_layer_norm_normalises_the_attention_input_only():
    trace = explain(num_heads=1, d_k=3, Wo=True, norm="pre", seed=6)
    X = trace.get("X").values
    normed = _layer_norm(X)
    np.testing.assert_allclose(trace.get("normed_in").values, normed, atol=ATOL)
    Wq, Wk, Wv, Wo = (trace.get(k).values for k in ("Wq", "Wk", "Wv", "Wo"))
    attn = _softmax((normed @ Wq) @ (normed @ Wk).T / np.sqrt(3)) @ (normed @ Wv) @ Wo
    np.testing.assert_allclose(trace.output, X + attn, atol=ATOL)
    assert [s.key for s in trace][-1] == "residual"
    with pytest.raises(ShapeError, match="Wo: the residual x \\+ attention\\(x\\) needs"):
        explain(residual=True)
    with pytest.raises(AttnlabError, match="norm: expected None, 'pre' or 'post', got 'mid'"):
        explain(norm="mid")


def test_key_padding_blocks_padding_keys_and_left_padding_makes_empty_rows():
    keep = np.array([True, True, True, False])
    trace = explain(tokens="小明 去了 学校 [PAD]".split(), key_padding=keep)
    w = trace.get("weights").values
    np.testing.assert_array_equal(w[:, 3], 0.0)
    np.testing.assert_allclose(w[:, :3], _softmax(trace.get("scaled").values[:, :3]), atol=ATOL)
    assert np.isneginf(trace.get("masked").values[:, 3]).all()
    # Left padding under a causal mask: the first query may attend to nothing.
    left = explain(tokens="[PAD] 小明 去了".split(), key_padding=np.array([False, True, True]),
                   is_causal=True)
    np.testing.assert_array_equal(left.get("weights").values[0], 0.0)
    [empty] = _nonzero_notes(left, "fully_masked")
    assert empty["rows"] == [0] and empty["tokens"] == ["[PAD]"]
    assert "第 1 行（[PAD]）没有任何可以关注的键" in to_text(left, "zh")
    with pytest.raises(ShapeError, match=r"key_padding"):
        explain(key_padding=np.array([True, False]))


def test_saturation_note_and_seed000_softmax_overflow_are_true():
    """The overflow note is given exactly when seed 000's own softmax gives non-finite
    output on this input (run here, from the article's code)."""
    X = np.array([[100, 0, 100, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=float)
    for seed in range(6):
        trace = explain(X, seed=seed)
        Wq, Wk, Wv = (trace.get(k).values for k in ("Wq", "Wk", "Wv"))
        with np.errstate(all="ignore"):
            seed_out = seed000_self_attention(X, Wq, Wk, Wv)
        overflow = bool(_nonzero_notes(trace, "naive_overflow"))
        assert overflow == (not np.isfinite(seed_out).all()), seed
        saturated = _nonzero_notes(trace, "saturated")
        rows = np.flatnonzero(trace.get("weights").values.max(-1) > 0.99).tolist()
        assert (saturated[0]["rows"] if saturated else []) == rows
    assert any(_nonzero_notes(explain(X, seed=s), "naive_overflow") for s in range(6))
    assert naive_softmax_fails(np.array([[800.0, 0.0]]), None)
    assert not naive_softmax_fails(np.array([[700.0, 0.0]]), None)


def test_near_uniform_note_and_the_untrained_note():
    flat = explain(X=np.full((3, 4), 0.01) + np.eye(3, 4) * 1e-3)
    assert _nonzero_notes(flat, "near_uniform")
    assert not _nonzero_notes(explain(X=np.eye(3, 4) * 5, seed=1), "near_uniform")
    assert _nonzero_notes(explain(), "untrained")
    rng = np.random.default_rng(0)
    given = explain(np.ones((2, 4)), Wq=rng.standard_normal((4, 3)),
                    Wk=rng.standard_normal((4, 3)), Wv=rng.standard_normal((4, 3)))
    assert not _nonzero_notes(given, "untrained")
    zh = to_text(explain(), "zh")
    assert "== 提示 ==" in zh and "没有经过训练" in zh
    assert "词元：单词1 | 单词2 | 单词3" in zh  # seed 000's labels under --lang zh

