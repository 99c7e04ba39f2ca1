"""Hooks, ablation and activation patching, against independent computations: weight
surgery (zeroed rows of Wo, a moved bias) and a by-hand re-run of the encoder written
here with plain NumPy (no attnlab block is called in it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.support.tiny_bert import tiny_bert

from attnlab.errors import AttnlabError
from attnlab.lens.ablation import ablate, head_means
from attnlab.lens.hooks import hooked
from attnlab.lens.patching import patch, patch_sweep, path_patch, token_cosine
from attnlab.lens.runs import record, sentence_embeddings
from attnlab.nn.layers import EncoderBlock
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.trace import Recorder

CLEAN = np.array([[1, 5, 7, 3, 9, 2]])
CORRUPTED = np.array([[1, 5, 11, 3, 4, 2]])

_erf = np.vectorize(math.erf)


def _layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def by_hand(model, ids, override=None):
    """The encoder written out (float64): returns hidden (T, E) and heads[l] (H, T, Dv).

    ``override(l, heads (H, T, Dv)) -> heads`` replaces head outputs before Wo."""
    T = ids.shape[1]
    eps = model.config.layer_norm_eps
    x = model.word_embeddings[ids[0]] + model.position_embeddings[:T] + \
        model.token_type_embeddings[0]
    x = _layer_norm(x, model.embedding_norm.gamma, model.embedding_norm.beta, eps)
    all_heads = []
    for index, block in enumerate(model.layers):
        a = block.attn
        H, D = a.num_heads, a.head_dim
        q = (x @ a.Wq + a.bq).reshape(T, H, D).transpose(1, 0, 2)
        k = (x @ a.Wk + a.bk).reshape(T, H, D).transpose(1, 0, 2)
        v = (x @ a.Wv + a.bv).reshape(T, H, D).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        heads = p @ v  # (H, T, D)
        if override is not None:
            heads = override(index, heads.copy())
        all_heads.append(heads)
        attn_out = heads.transpose(1, 0, 2).reshape(T, H * D) @ a.Wo + a.bo
        h = _layer_norm(x + attn_out, block.norm1.gamma, block.norm1.beta, eps)
        pre = h @ block.ffn.W1 + block.ffn.b1
        f = (0.5 * pre * (1 + _erf(pre / math.sqrt(2)))) @ block.ffn.W2 + block.ffn.b2
        x = _layer_norm(h + f, block.norm2.gamma, block.norm2.beta, eps)
    return x, all_heads


def _cos_embedding(hidden_a, hidden_b):
    a, b = hidden_a.mean(0), hidden_b.mean(0)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ------------------------------------------------------------------------- hooks


def test_by_hand_matches_the_model() -> None:
    # The by-hand encoder is the reference below: it must be the model. Float64, six
    # layers of sums of a dozen terms: 1e-12.
    model = tiny_bert()
    hidden, _ = by_hand(model, CLEAN)
    np.testing.assert_allclose(model.forward(CLEAN)[0], hidden, rtol=0, atol=1e-12)


def _stack_block(**attn_options):
    block = EncoderBlock(8, 4, 16, dropout=0.0, seed=1)
    block.attn = MultiHeadAttention.init(4, 8, seed=2, **attn_options)
    return block


class Stack:
    hook_site = None

    def __init__(self, blocks):
        self.layers = blocks

    def hook_points(self):
        return [(f"blocks.{i}", block) for i, block in enumerate(self.layers)]

    def forward(self, x, recorder=None):
        for block in self.layers:
            x = block.forward(x, recorder=recorder)
        return x


@pytest.mark.parametrize("options", [{}, {"rope": True}, {"alibi": True}, {"num_kv_heads": 2}])
def test_a_hook_that_changes_nothing_changes_nothing(options) -> None:
    # Same arithmetic in the same order as MultiHeadAttention.forward: bit for bit.
    stack = Stack([_stack_block(**options), _stack_block(**options)])
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    plain_recorder, hooked_recorder = Recorder("all"), Recorder("all")
    plain = stack.forward(x, recorder=plain_recorder)
    with hooked(stack, heads=lambda layer, h: None, residual=lambda layer, x: None):
        hooked_out = stack.forward(x, recorder=hooked_recorder)
    np.testing.assert_array_equal(hooked_out, plain)
    assert [(s.key, s.head, s.layer) for s in hooked_recorder.steps] == \
        [(s.key, s.head, s.layer) for s in plain_recorder.steps]
    for a, b in zip(hooked_recorder.steps, plain_recorder.steps, strict=True):
        np.testing.assert_array_equal(a.values, b.values)
    # Called as a block (checks included, a key padding mask), as a packed encode calls it.
    key_padding = np.array([[True] * 5, [True] * 3 + [False] * 2])
    block = stack.layers[0]
    plain_called = block(x, key_padding=key_padding)
    with hooked(stack, heads=lambda layer, h: None):
        np.testing.assert_array_equal(stack.layers[0](x, key_padding=key_padding), plain_called)
    with hooked(stack, heads=lambda layer, h: np.zeros_like(h)):
        zeroed = stack.layers[0](x, key_padding=key_padding)
    assert not np.allclose(zeroed, plain_called)


def test_hooks_are_removed_even_after_an_exception_and_nest() -> None:
    model = tiny_bert()
    own = model.layers
    with pytest.raises(RuntimeError, match="inside"):
        with hooked(model, heads=lambda layer, h: None):
            assert all(layer.attn.hook_site is not None for layer in model.layers)
            raise RuntimeError("inside")
    assert model.layers is own
    assert all(layer.attn.hook_site is None for layer in model.layers)
    calls = []
    with hooked(model, heads=lambda layer, h: calls.append(("outer", layer))):
        with hooked(model, heads=lambda layer, h: calls.append(("inner", layer))):
            model.forward(CLEAN)
        assert all(b.attn.hook_site is not None for b in model.layers)
    assert model.layers is own and all(b.attn.hook_site is None for b in model.layers)
    assert calls[:2] == [("outer", 0), ("inner", 0)] and len(calls) == 6


def test_hook_errors() -> None:
    model = tiny_bert()
    with pytest.raises(AttnlabError, match=r"hook blocks\.0\.attn\.hook_z: expected None or "
                                           r"a replacement of shape"):
        with hooked(model, heads=lambda layer, h: h[:, :1]):
            model.forward(CLEAN)
    with pytest.raises(AttnlabError, match="heads: expected a function"):
        with hooked(model, heads=3):
            pass
    with pytest.raises(AttnlabError, match="model: expected a model with hook points"):
        with hooked(object()):
            pass


# ---------------------------------------------------------------------- ablation


def _surgery_copy(model):
    """The model with its own copy of every attention module, to edit weights."""
    import copy
    edited = copy.copy(model)
    edited.layers = [copy.copy(b) for b in model.layers]
    for b in edited.layers:
        b.attn = copy.copy(b.attn)
        b.attn.Wo, b.attn.bo = b.attn.Wo.copy(), b.attn.bo.copy()
    return edited


def test_zero_ablation_equals_zeroed_rows_of_wo() -> None:
    model = tiny_bert(width=12, heads=3)
    chosen = [(0, 1), (2, 0), (2, 2)]
    edited = _surgery_copy(model)
    Dv = model.layers[0].attn.value_head_dim
    for layer, head in chosen:
        edited.layers[layer].attn.Wo[head * Dv: (head + 1) * Dv] = 0.0
    with ablate(model, heads=chosen) as ablated:
        got = ablated.forward(CLEAN)
    # The same products (0 · w in both), summed in the same order: 1e-12 allows for BLAS
    # choosing a different blocking for the two calls.
    np.testing.assert_allclose(got, edited.forward(CLEAN), rtol=0, atol=1e-12)
    assert not np.allclose(got, model.forward(CLEAN), atol=1e-3)  # the heads did matter


def test_mean_ablation_equals_a_moved_bias() -> None:
    # A constant head output m replaces its slice of the concatenation: the same as zero
    # rows of Wo plus m·Wo[rows] added to bo.
    model = tiny_bert()
    reference = np.array([[1, 4, 6, 8, 2], [1, 9, 10, 12, 2]])
    means = head_means(model, reference)  # (L, H, Dv)
    _, heads_by_hand = zip(*[by_hand(model, reference[i: i + 1]) for i in range(2)],
                           strict=True)
    for layer in range(3):  # head_means against the by-hand heads
        expected = np.mean([h[layer] for h in heads_by_hand], axis=0).mean(axis=1)  # (H, Dv)
        np.testing.assert_allclose(means[layer], expected, rtol=0, atol=1e-12)
    edited = _surgery_copy(model)
    Dv = model.layers[0].attn.value_head_dim
    attn = edited.layers[1].attn
    attn.bo += means[1, 0] @ attn.Wo[:Dv]
    attn.Wo[:Dv] = 0.0
    with ablate(model, heads=[(1, 0)], how="mean", reference=reference):
        got = model.forward(CLEAN)
    with ablate(model, heads=[(1, 0)], how="mean", reference=means):
        again = model.forward(CLEAN)
    np.testing.assert_allclose(got, edited.forward(CLEAN), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got, again)


def test_ablation_on_encode_runs_the_plain_path_float32() -> None:
    # float32 takes the fused path when not hooked; ablation must still take effect.
    model = tiny_bert(dtype=np.float32)
    edited = _surgery_copy(model)
    edited.layers[0].attn.Wo[:4] = 0.0
    with ablate(model, heads=[(0, 0)]):
        got = model.forward(CLEAN)
    # float32 fused vs per-block path: rounding of O(1) values through 3 layers, 1e-5.
    np.testing.assert_allclose(got, edited.forward(CLEAN), rtol=0, atol=1e-5)


def test_ablation_errors() -> None:
    model = tiny_bert()
    with pytest.raises(AttnlabError, match=r"heads: expected \(layer, head\) pairs"):
        with ablate(model, heads=[(3, 0)]):
            pass
    with pytest.raises(AttnlabError, match="reference: how='mean' needs"):
        with ablate(model, heads=[(0, 0)], how="mean"):
            pass
    with pytest.raises(AttnlabError, match="how: expected 'zero' or 'mean'"):
        with ablate(model, heads=[(0, 0)], how="one"):  # type: ignore[arg-type]
            pass
    with pytest.raises(AttnlabError, match=r"reference: expected head means of shape"):
        with ablate(model, heads=[(0, 0)], how="mean", reference=np.zeros((3, 2, 3))):
            pass


# ---------------------------------------------------------------------- patching


def test_patch_a_head_equals_the_by_hand_rerun() -> None:
    model = tiny_bert()
    clean_hidden, clean_heads = by_hand(model, CLEAN)

    def put_clean(layer, heads):
        if layer == 1:
            heads[0, [2, 4]] = clean_heads[1][0, [2, 4]]
        return heads

    patched_hidden, _ = by_hand(model, CORRUPTED, put_clean)
    got = patch(model, CLEAN, CORRUPTED, heads=[(1, 0)], positions=[2, 4])
    # float64 through three layers, then a cosine: 1e-12.
    assert got == pytest.approx(_cos_embedding(patched_hidden, clean_hidden), abs=1e-12)
    # one token's state as the metric
    clean_run = record(model, CLEAN)
    metric = token_cosine(clean_run, 3)
    state, target = patched_hidden[3], clean_hidden[3]
    assert patch(model, CLEAN, CORRUPTED, heads=[(1, 0)], positions=[2, 4], metric=metric) == \
        pytest.approx(float(state @ target / np.linalg.norm(state) / np.linalg.norm(target)),
                      abs=1e-12)


def test_patching_everything_restores_the_clean_run() -> None:
    model = tiny_bert()
    # The whole stream after any block, at every position, is the clean run from there on.
    for layer in range(3):
        assert patch(model, CLEAN, CORRUPTED, layers=[layer]) == pytest.approx(1.0, abs=1e-12)
    corrupted_alone = _cos_embedding(by_hand(model, CORRUPTED)[0], by_hand(model, CLEAN)[0])
    assert corrupted_alone < 0.99  # the inputs do differ
    # the residual stream after layer 0 at the only changed positions restores all too
    assert patch(model, CLEAN, CORRUPTED, layers=[0], positions=[2, 4]) == \
        pytest.approx(_cos_embedding(*_residual_patch_by_hand(model)), abs=1e-12)


def _residual_patch_by_hand(model):
    # Patching layer 0's output at positions 2 and 4 leaves the other positions at their
    # corrupted values: re-run layers 1.. by hand from the mixed stream.
    clean = record(model, CLEAN)
    corrupted = record(model, CORRUPTED)
    stream = corrupted.residual[0].copy()
    stream[:, [2, 4]] = clean.residual[0][:, [2, 4]]
    x = stream
    for block in model.layers[1:]:
        x = block(x)
    return x[0], clean.hidden[0]


def test_patch_sweep_is_each_head_alone() -> None:
    model = tiny_bert()
    table = patch_sweep(model, CLEAN, CORRUPTED)
    assert table.shape == (3, 2)
    clean_hidden, clean_heads = by_hand(model, CLEAN)
    for layer in range(3):
        for head in range(2):
            def put(index, heads, layer=layer, head=head):
                if index == layer:
                    heads[head] = clean_heads[layer][head]
                return heads
            expected = _cos_embedding(by_hand(model, CORRUPTED, put)[0], clean_hidden)
            assert table[layer, head] == pytest.approx(expected, abs=1e-12)


def test_residual_sweep_is_each_layer_and_position_alone() -> None:
    model = tiny_bert()
    table = patch_sweep(model, CLEAN, CORRUPTED, site="residual")
    assert table.shape == (3, 6)
    for layer, position in [(0, 2), (1, 4), (2, 0)]:
        assert table[layer, position] == patch(model, CLEAN, CORRUPTED, layers=[layer],
                                               positions=[position])
    # After the last layer nothing mixes any more: the patched output is the corrupted
    # hidden states with row t taken from the clean ones.
    clean_hidden, corrupted_hidden = by_hand(model, CLEAN)[0], by_hand(model, CORRUPTED)[0]
    for position in range(6):
        mixed = corrupted_hidden.copy()
        mixed[position] = clean_hidden[position]
        assert table[2, position] == pytest.approx(_cos_embedding(mixed, clean_hidden),
                                                   abs=1e-12)
    with pytest.raises(AttnlabError, match="site: expected 'heads' or 'residual'"):
        patch_sweep(model, CLEAN, CORRUPTED, site="mlp")


@pytest.mark.parametrize("sender, receivers", [((0, 1), [(2, 0)]), ((0, 0), [(1, 1), (2, 1)])])
def test_path_patching_equals_the_two_by_hand_runs(sender, receivers) -> None:
    model = tiny_bert()
    clean_hidden, clean_heads = by_hand(model, CLEAN)
    _, corrupted_heads = by_hand(model, CORRUPTED)
    positions = [2, 4]
    kept = {}

    def first(layer, heads):
        if layer == sender[0]:
            heads[sender[1], positions] = clean_heads[layer][sender[1], positions]
        elif layer > sender[0]:
            fresh = heads.copy()
            heads = corrupted_heads[layer].copy()
            for lr, hr in receivers:
                if lr == layer:
                    heads[hr] = fresh[hr]
                    kept[(lr, hr)] = fresh[hr].copy()
        return heads

    by_hand(model, CORRUPTED, first)

    def second(layer, heads):
        for lr, hr in receivers:
            if lr == layer:
                heads[hr] = kept[(lr, hr)]
        return heads

    expected = _cos_embedding(by_hand(model, CORRUPTED, second)[0], clean_hidden)
    got = path_patch(model, CLEAN, CORRUPTED, sender=sender, receivers=receivers,
                     positions=positions)
    assert got == pytest.approx(expected, abs=1e-12)
    # not the same as patching the sender everywhere (the other paths are cut)
    direct = patch(model, CLEAN, CORRUPTED, heads=[sender], positions=positions)
    assert abs(got - direct) > 1e-6


def test_patching_errors() -> None:
    model = tiny_bert()
    with pytest.raises(AttnlabError, match="heads, layers: expected exactly one"):
        patch(model, CLEAN, CORRUPTED)
    with pytest.raises(AttnlabError, match="corrupted: expected as many tokens as clean"):
        patch(model, CLEAN, CORRUPTED[:, :4], heads=[(0, 0)])
    with pytest.raises(AttnlabError, match="positions: expected token indices in 0..5"):
        patch(model, CLEAN, CORRUPTED, heads=[(0, 0)], positions=[6])
    with pytest.raises(AttnlabError, match="receivers: expected heads in layers after"):
        path_patch(model, CLEAN, CORRUPTED, sender=(1, 0), receivers=[(1, 1)])
    with pytest.raises(AttnlabError, match="clean: texts need a model with a tokenizer"):
        patch(model, "a text", CORRUPTED, heads=[(0, 0)])
    with pytest.raises(AttnlabError, match="layers: expected indices in 0..2"):
        patch(model, CLEAN, CORRUPTED, layers=[3])


def test_sentence_embeddings_are_unit_mean_pools() -> None:
    hidden = np.arange(12.0).reshape(1, 3, 4)
    real = np.array([[1, 1, 0]])
    pooled = hidden[0, :2].mean(0)
    np.testing.assert_allclose(sentence_embeddings(hidden, real)[0],
                               pooled / np.linalg.norm(pooled), rtol=0, atol=1e-15)


def test_positions_and_heads_must_be_whole_indices() -> None:
    # positions=[1.5] was truncated to 1, [True] read as 1; heads=[(True, False)] was
    # taken as (1, 0).
    model = tiny_bert()
    for positions in ([1.5], [True], [np.float64(2.5)]):
        with pytest.raises(AttnlabError, match=r"^positions: expected whole token indices"):
            patch(model, CLEAN, CORRUPTED, heads=[(1, 0)], positions=positions)
    assert math.isfinite(patch(model, CLEAN, CORRUPTED, heads=[(1, 0)],
                               positions=[np.int64(2), 4]))
    for heads in ([(True, False)], [(0, np.bool_(True))], [(0.5, 1)]):
        with pytest.raises(AttnlabError, match=r"^heads: expected \(layer, head\) pairs"):
            with ablate(model, heads=heads):
                pass
