"""Hook points on the torch blocks and models: the NumPy twins' names, the same values,
edits, gradients through edits, detached caches, removal after an exception.

Tolerances: float64 twins (tiny BERT) agree to 1e-10 (the same products in another
order); float32 MiniLM to 2e-4 absolute on hidden states and MLP activations (values up
to ~20, 384-wide sums in other orders) and 1e-5 on softmax patterns (values in [0, 1]).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tests.support.tiny_bert import tiny_bert

from attnlab import AttnlabError, EncoderBlock
from attnlab import MultiHeadAttention as NpMHA
from attnlab import SelfAttentionLayer as NpLayer
from attnlab.lens import hook_names, run_with_cache, run_with_hooks
from attnlab.torch import MultiHeadAttention, SelfAttentionLayer
from attnlab.torch.models import BertModel
from attnlab.train.model import Decoder, DecoderConfig

IDS = np.array([[1, 5, 7, 2, 3], [1, 9, 2, 0, 0]])
REAL = (IDS != 0).astype(np.int64)


def _strip_blocks(names: list[str]) -> list[str]:
    return [n.split(".", 2)[2] for n in names if n.startswith("blocks.0.")]


def test_numpy_and_torch_blocks_expose_the_same_names():
    for rope in (False, True):
        np_mha = NpMHA.init(2, 8, rope=rope)
        assert hook_names(np_mha) == hook_names(MultiHeadAttention(2, 8, rope=rope))
    for norm in ("post", "pre"):
        np_layer = NpLayer(8, 2, dropout=0.0, norm=norm)
        assert hook_names(np_layer) == hook_names(SelfAttentionLayer.from_numpy(np_layer))
    # BERT's post-LN block and the trainer's pre-LN block against the NumPy EncoderBlock.
    np_bert = tiny_bert()
    torch_bert = BertModel.from_numpy(np_bert)
    assert hook_names(np_bert) == hook_names(torch_bert)
    assert _strip_blocks(hook_names(torch_bert)) == hook_names(EncoderBlock(8, 2, 12))
    decoder = Decoder(DecoderConfig(vocab_size=10, max_len=8, d_model=16, num_heads=2))
    assert _strip_blocks(hook_names(decoder)) == hook_names(EncoderBlock(8, 2, 12, norm="pre"))
    assert hook_names(decoder)[-1] == "ln_final.hook_normalized"


def test_tiny_bert_values_equal_the_numpy_twin_at_every_point():
    np_bert = tiny_bert(dtype=np.float64)
    torch_bert = BertModel.from_numpy(np_bert, dtype=torch.float64)
    names = lambda n: True  # noqa: E731 - every point, hook_result included
    np_out, np_cache = run_with_cache(np_bert, IDS, REAL, names=names)
    with torch.no_grad():
        t_out, t_cache = run_with_cache(torch_bert, torch.tensor(IDS), torch.tensor(REAL),
                                        names=names)
    assert list(np_cache) == list(t_cache)
    for name, value in np_cache.items():
        ours = t_cache[name].numpy()
        assert ours.shape == value.shape, name
        np.testing.assert_allclose(ours, value, rtol=0, atol=1e-10, err_msg=name)
    np.testing.assert_array_equal(t_cache["blocks.2.hook_resid_post"].numpy(), t_out.numpy())
    np.testing.assert_allclose(t_out.numpy(), np_out, rtol=0, atol=1e-10)


@pytest.fixture(scope="module")
def minilm():
    from attnlab.models import load_minilm as load_numpy_minilm

    numpy_model = load_numpy_minilm()
    return numpy_model, BertModel.from_numpy(numpy_model)


def test_minilm_names_and_values_equal_the_numpy_twin(minilm):
    numpy_model, model = minilm
    assert hook_names(model) == hook_names(numpy_model)
    text = "The cat sat on the mat because it was tired."
    np_out, np_cache = run_with_cache(numpy_model, text)
    with torch.no_grad():
        t_out, t_cache = run_with_cache(model, text)
    assert sorted(np_cache) == sorted(t_cache)
    for name, value in np_cache.items():
        ours = t_cache[name].numpy()
        if name.endswith("hook_attn_scores"):  # no padding: no -inf
            assert np.isfinite(value).all()
        atol = 1e-5 if name.endswith("hook_pattern") else 2e-4
        np.testing.assert_allclose(ours, value, rtol=0, atol=atol, err_msg=name)
    np.testing.assert_array_equal(t_cache["blocks.5.hook_resid_post"].numpy(), t_out.numpy())


def test_zeroing_hook_z_equals_zeroing_the_heads_columns_of_out_proj(minilm):
    _, model = minilm
    ids, real, _ = model.tokenize(["attention is all you need", "a"])
    layer, head, Dv = 3, 5, 32

    def zero(z: torch.Tensor, name: str) -> torch.Tensor:
        z = z.clone()
        z[:, head] = 0.0
        return z

    with torch.no_grad():
        edited = run_with_hooks(model, ids, real, hooks=[(f"blocks.{layer}.attn.hook_z", zero)])
        surgery = copy.deepcopy(model)
        surgery.layers[layer].self_attn.out_proj.weight[:, head * Dv:(head + 1) * Dv] = 0.0
        expected = surgery(ids, real)
        plain = model(ids, real)
    is_real = real.bool()
    # float32, 384-wide sums in another order: 2e-5 on values up to ~6.
    torch.testing.assert_close(edited[is_real], expected[is_real], rtol=0, atol=2e-5)
    assert (edited - plain).abs().max() > 1e-3  # the head mattered


def test_uniform_pattern_equals_a_hand_computation():
    torch.manual_seed(0)
    mha = MultiHeadAttention(2, 8, dtype=torch.float64)
    with torch.no_grad():
        mha.v_proj.bias.normal_()
        mha.out_proj.bias.normal_()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    uniform = [("hook_pattern", lambda p, n: torch.full_like(p, 1.0 / p.shape[-1]))]
    out, weights = run_with_hooks(mha, x, x, x, hooks=uniform, return_weights=True)
    mean_v = mha.v_proj(x).mean(dim=1, keepdim=True).expand_as(x)  # every key weighted 1/S
    torch.testing.assert_close(out, mha.out_proj(mean_v), rtol=0, atol=1e-12)
    assert (weights == 0.2).all()


def test_gradients_flow_through_edits_and_caches_are_detached():
    torch.manual_seed(1)
    mha = MultiHeadAttention(2, 8, dtype=torch.float64)
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    gain = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    out, _ = run_with_hooks(mha, x, x, x, hooks=[("hook_z", lambda z, n: z * gain)])
    out.sum().backward()
    # out = gain · merged Wo + bo, so d sum(out) / d gain = sum(merged Wo).
    with torch.no_grad():
        _, cache = run_with_cache(mha, x, x, x, names=["hook_z"])
        merged = cache["hook_z"].transpose(1, 2).reshape(1, 4, 8)
        expected = (merged @ mha.out_proj.weight.t()).sum()
    torch.testing.assert_close(gain.grad, expected, rtol=1e-12, atol=0)
    _, detached = run_with_cache(mha, x, x, x, names=["hook_q"])
    assert detached["hook_q"].grad_fn is None
    _, kept = run_with_cache(mha, x, x, x, names=["hook_q"], keep_grad=True)
    assert kept["hook_q"].grad_fn is not None
    with pytest.raises(AttnlabError, match="keep_grad"):
        run_with_cache(mha, x, x, x, keep_grad="yes")


def test_torch_hooks_are_removed_after_an_exception_and_nest():
    layer = SelfAttentionLayer(8, 2, dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    with torch.no_grad():
        before = layer(x)
        with pytest.raises(ZeroDivisionError):
            run_with_hooks(layer, x, hooks=[("attn.hook_q", lambda v, n: 1 / 0)])
        assert layer.hook_site is None and layer.self_attn.hook_site is None
        torch.testing.assert_close(layer(x), before, rtol=0, atol=0)
        double = [("hook_resid_post", lambda v, n: 2 * v)]
        plus_one = [("hook_resid_post", lambda v, n: v + 1)]
        from attnlab.hooks import attached

        with attached(layer, double), attached(layer, plus_one):
            nested = layer(x)  # outer first: 2·out, then + 1
        torch.testing.assert_close(nested, 2 * before + 1, rtol=0, atol=1e-6)


def test_the_lens_on_torch_minilm_equals_the_numpy_twin(minilm):
    # float32 on both sides; the metrics are cosines near 1 and the embeddings are unit
    # vectors: 1e-6 is a few float32 roundings of 384-wide sums.
    from attnlab import lens

    numpy_model, model = minilm
    texts = ["The cat sat on the mat.", "Attention is all you need."]
    heads = [(3, 5), (0, 1)]
    with lens.ablate(numpy_model, heads):
        numpy_ablated = numpy_model.encode(texts)
    with torch.no_grad(), lens.ablate(model, heads):
        torch_ablated = model.encode(texts).numpy()
    np.testing.assert_allclose(torch_ablated, numpy_ablated, rtol=0, atol=1e-6)
    assert np.abs(numpy_ablated - numpy_model.encode(texts)).max() > 1e-3  # it did something
    means = lens.head_means(numpy_model, texts)
    np.testing.assert_allclose(lens.head_means(model, texts), means, rtol=0, atol=1e-5)
    with lens.ablate(numpy_model, heads, how="mean", reference=means):
        numpy_mean = numpy_model.encode(texts)
    with torch.no_grad(), lens.ablate(model, heads, how="mean", reference=means):
        torch_mean = model.encode(texts).numpy()
    np.testing.assert_allclose(torch_mean, numpy_mean, rtol=0, atol=1e-6)
    clean, corrupted = "The cat sat on the mat.", "The dog sat on the mat."
    for kwargs in ({"heads": [(2, 3), (4, 0)]}, {"layers": [1], "positions": [2]}):
        expected = lens.patch(numpy_model, clean, corrupted, **kwargs)
        ours = lens.patch(model, clean, corrupted, **kwargs)
        assert abs(ours - expected) < 1e-6, kwargs
    expected = lens.path_patch(numpy_model, clean, corrupted, sender=(1, 2),
                               receivers=[(3, 0), (4, 7)])
    ours = lens.path_patch(model, clean, corrupted, sender=(1, 2), receivers=[(3, 0), (4, 7)])
    assert abs(ours - expected) < 1e-6
