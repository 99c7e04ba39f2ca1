"""Named hook points in the NumPy blocks: names, values against hand computations,
edits, nesting, removal after an exception, filters.

References are written here from the weights (x @ Wq + bq, a softmax by hand, zeroed
rows of Wo), never read back from the code under test. Tolerances: float64
throughout; 1e-12 where the same products are summed in another order.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from tests.support.tiny_bert import tiny_bert

from attnlab import AttnlabError, EncoderBlock, MultiHeadAttention, SelfAttentionLayer
from attnlab.hooks import attached, hook_names
from attnlab.lens import run_with_cache, run_with_hooks

RNG = np.random.default_rng(7)
X = RNG.normal(size=(2, 4, 8))  # (B, T, E)


def _block(norm: str = "post") -> EncoderBlock:
    block = EncoderBlock(8, 2, 12, dropout=0.0, norm=norm, seed=3)
    for arr in (block.attn.bq, block.attn.bk, block.attn.bv, block.attn.bo):
        arr[:] = RNG.normal(size=arr.shape)  # non-zero biases: a missing one shows
    return block


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _heads(a: np.ndarray, H: int) -> np.ndarray:  # (B, T, H*D) -> (B, H, T, D)
    B, T, W = a.shape
    return a.reshape(B, T, H, W // H).transpose(0, 2, 1, 3)


POST_NAMES = [
    "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores",
    "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out",
    "ln1.hook_normalized", "hook_resid_mid", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out",
    "ln2.hook_normalized", "hook_resid_post",
]


def test_names_in_forward_order_post_and_pre():
    assert hook_names(_block("post")) == POST_NAMES
    pre = hook_names(_block("pre"))
    assert pre[:2] == ["hook_resid_pre", "ln1.hook_normalized"]
    assert pre.index("ln2.hook_normalized") < pre.index("mlp.hook_pre")
    assert sorted(pre) == sorted(POST_NAMES)  # the same names, another order
    layer = SelfAttentionLayer(8, 2, dropout=0.0)
    assert "hook_resid_mid" not in hook_names(layer)  # no MLP: nothing between sublayers
    rope = MultiHeadAttention.init(2, 8, rope=True)
    assert {"hook_rot_q", "hook_rot_k"} <= set(hook_names(rope))
    assert "hook_rot_q" not in hook_names(MultiHeadAttention.init(2, 8))


def test_cached_values_equal_a_hand_computation():
    block = _block()
    a = block.attn
    mask = np.ones((2, 1, 4, 4), bool)
    mask[1, ..., 3] = False  # one blocked key in the second item
    out, cache = run_with_cache(block, X, mask=mask)
    assert "attn.hook_result" not in cache  # opt-in: not in names=None
    q = _heads(X @ a.Wq + a.bq, 2)  # (B, H, T, D)
    k = _heads(X @ a.Wk + a.bk, 2)
    v = _heads(X @ a.Wv + a.bv, 2)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(4)
    scores = np.where(mask, scores, -np.inf)
    pattern = _softmax(scores)
    z = pattern @ v  # (B, H, T, Dv)
    attn_out = z.transpose(0, 2, 1, 3).reshape(2, 4, 8) @ a.Wo + a.bo
    np.testing.assert_allclose(cache["attn.hook_q"], q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache["attn.hook_v"], v, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(cache["attn.hook_attn_scores"]), ~mask[:, :, :, :]
                                  .repeat(2, axis=1))
    np.testing.assert_allclose(cache["attn.hook_pattern"], pattern, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache["attn.hook_z"], z, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache["hook_attn_out"], attn_out, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(cache["hook_resid_post"], out)
    np.testing.assert_array_equal(out, block(X, mask=mask))  # reading changes nothing


def test_uniform_pattern_equals_a_hand_computation():
    mha = MultiHeadAttention.init(2, 8, seed=1)
    mha.bv[:] = RNG.normal(size=8)
    mha.bo[:] = RNG.normal(size=8)

    def uniform(pattern: np.ndarray, name: str) -> np.ndarray:
        return np.full_like(pattern, 1.0 / pattern.shape[-1])

    out, weights = run_with_hooks(mha, X, hooks=[("hook_pattern", uniform)],
                                  return_weights=True)
    mean_v = (X @ mha.Wv + mha.bv).mean(axis=1, keepdims=True)  # (B, 1, H*Dv): all keys alike
    expected = np.broadcast_to(mean_v, X.shape) @ mha.Wo + mha.bo
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    assert np.all(weights == 0.25)


@pytest.mark.parametrize("head", [0, 1])
def test_zeroing_one_head_z_equals_zeroing_its_rows_of_wo(head):
    block = _block()

    def zero(z: np.ndarray, name: str) -> np.ndarray:
        z = z.copy()
        z[:, head] = 0.0
        return z

    edited = run_with_hooks(block, X, hooks=[("attn.hook_z", zero)])
    surgery = copy.deepcopy(block)
    Dv = surgery.attn.value_head_dim
    surgery.attn.Wo = surgery.attn.Wo.copy()
    surgery.attn.Wo[head * Dv:(head + 1) * Dv] = 0.0
    np.testing.assert_allclose(edited, surgery(X), rtol=0, atol=1e-12)
    assert np.abs(edited - block(X)).max() > 1e-3  # the head mattered


def test_hook_result_sums_to_the_attention_output_and_can_be_edited():
    block = _block()
    _, cache = run_with_cache(block, X, names=["attn.hook_result", "hook_attn_out"])
    result = cache["attn.hook_result"]  # (B, H, T, E)
    assert result.shape == (2, 2, 4, 8)
    np.testing.assert_allclose(result.sum(axis=1) + block.attn.bo, cache["hook_attn_out"],
                               rtol=0, atol=1e-12)

    def drop_head_1(r: np.ndarray, name: str) -> np.ndarray:
        r = r.copy()
        r[:, 1] = 0.0
        return r

    via_result = run_with_hooks(block, X, hooks=[("attn.hook_result", drop_head_1)])
    via_z = run_with_hooks(block, X, hooks=[
        ("attn.hook_z", lambda z, n: np.concatenate([z[:, :1], 0 * z[:, 1:]], axis=1))])
    np.testing.assert_allclose(via_result, via_z, rtol=0, atol=1e-12)


def test_edits_of_residual_and_mlp_points_take_effect():
    block = _block("pre")
    # Zeroing the MLP's output leaves the block's output at resid_mid.
    out, cache = run_with_cache(block, X)
    edited = run_with_hooks(block, X, hooks=[("hook_mlp_out", lambda v, n: np.zeros_like(v))])
    np.testing.assert_allclose(edited, cache["hook_resid_mid"], rtol=0, atol=1e-12)
    # Replacing the block's input by zeros: the output is that of a zero input.
    zeroed = run_with_hooks(block, X, hooks=[("hook_resid_pre", lambda v, n: np.zeros_like(v))])
    np.testing.assert_allclose(zeroed, block(np.zeros_like(X)), rtol=0, atol=1e-12)


def test_hooks_nest_and_inner_ones_run_after_outer_ones():
    block = _block()
    seen: list[str] = []
    with attached(block, [("attn.hook_z", lambda v, n: seen.append("outer"))]):
        with attached(block, [("attn.hook_z", lambda v, n: seen.append("inner")),
                              ("hook_resid_post", lambda v, n: v * 2)]):
            doubled = block(X)
        seen.append("|")
        plain = block(X)
    seen.append("|")
    block(X)
    assert seen == ["outer", "inner", "|", "outer", "|"]
    np.testing.assert_allclose(doubled, 2 * plain, rtol=0, atol=1e-12)


def test_hooks_are_removed_after_an_exception():
    block = _block()
    before = block(X)

    def boom(v: np.ndarray, name: str) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run_with_hooks(block, X, hooks=[("attn.hook_q", boom),
                                        ("hook_resid_post", lambda v, n: v + 1)])
    assert block.hook_site is None and block.attn.hook_site is None
    np.testing.assert_array_equal(block(X), before)


def test_filters_and_bad_hooks_are_refused_with_the_name():
    block = _block()
    _, cache = run_with_cache(block, X, names=lambda n: n.startswith("attn."))
    assert sorted(cache) == sorted(n for n in POST_NAMES if n.startswith("attn."))
    with pytest.raises(AttnlabError, match="blocks.9"):
        run_with_cache(block, X, names=["blocks.9.attn.hook_q"])
    with pytest.raises(AttnlabError, match=r"hook attn.hook_z: expected None or a replacement "
                                           r"of shape \(2, 2, 4, 4\)"):
        run_with_hooks(block, X, hooks=[("attn.hook_z", lambda v, n: v[:, :1])])
    with pytest.raises(AttnlabError, match="name"):
        cache["attn.hook_nothing"]
    with pytest.raises(AttnlabError, match="hooks"):
        run_with_hooks(block, X, hooks=[("attn.hook_z",)])


def test_bert_names_and_last_resid_post_equal_the_fused_output():
    model = tiny_bert(dtype=np.float32)  # float32: the fused path runs without hooks
    names = hook_names(model)
    assert names[:3] == ["hook_embed", "hook_pos_embed", "hook_token_type_embed"]
    assert "blocks.2.attn.hook_pattern" in names and "blocks.3.hook_resid_pre" not in names
    ids = np.array([[1, 5, 7, 2, 0], [1, 9, 2, 0, 0]])
    real = (ids != 0).astype(np.int64)
    fused = model.forward(ids, real)  # no hooks: the fused path
    out, cache = run_with_cache(model, ids, real)  # hooks: the plain blocks
    np.testing.assert_array_equal(cache["blocks.2.hook_resid_post"], out)
    # Fused vs plain float32: rounding of different summation orders, 1e-5 on O(1) values.
    np.testing.assert_allclose(out, fused, rtol=0, atol=1e-5)
    # The embeddings' points add up to the first block's input (before its LayerNorm).
    summed = cache["hook_embed"] + cache["hook_pos_embed"] + cache["hook_token_type_embed"]
    centred = summed - summed.mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-12)
    expected = normed * model.embedding_norm.gamma + model.embedding_norm.beta
    np.testing.assert_allclose(cache["blocks.0.hook_resid_pre"], expected, rtol=0, atol=1e-5)


def test_tiny_decoder_names_and_its_cached_path_refuses_hooks():
    from attnlab.nn.decoder import DecoderConfig, TinyDecoder

    model = TinyDecoder(DecoderConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=12,
                                      num_layers=2))
    names = hook_names(model)
    assert names[0] == "hook_embed" and names[-1] == "ln_final.hook_normalized"
    assert "blocks.1.attn.hook_rot_q" in names  # RoPE by default
    ids = np.array([[1, 2, 3, 4]])
    logits, cache = run_with_cache(model, ids)
    final = cache["ln_final.hook_normalized"]  # (B, T, E): the unembedding reads it
    np.testing.assert_allclose(logits, final @ model.W_head, rtol=0, atol=1e-5)
    with attached(model, [("blocks.0.attn.hook_q", lambda v, n: None)]):
        with pytest.raises(AttnlabError, match="cached path has no hook points"):
            model.generate([1, 2], 2)
