"""attnlab.torch.models: MiniLM as a trainable nn.Module, against the NumPy model and
sentence-transformers.

Tolerances (the same as tests/models/test_models.py, for the same reason): float32 on
every side, 384-wide dot products summed in other orders give ~1e-7..3e-6; embeddings
and attention weights are compared to 1e-5 absolute, hidden states of real tokens
(values up to ~6) to 1e-5 absolute as well.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sentence_transformers  # noqa: E402
import torch  # noqa: E402

from attnlab import AttnlabError  # noqa: E402
from attnlab.models import load_minilm as load_numpy_minilm  # noqa: E402
from attnlab.models import minilm_path  # noqa: E402
from attnlab.torch.models import BertModel, load_bert, load_minilm  # noqa: E402

MAX_LENGTH_ERROR = r"^max_length: expected an integer in 1\.\.512 .*got (513|0)$"
TEXTS = ["小明去了学校", "The cat sat on the mat.",
         "自注意力机制让每个词都能关注句子中的所有其他词。", "I love NLP 🤖🚀",
         "a", " ".join(["attention is all you need"] * 80)]


@pytest.fixture(scope="module")
def numpy_model():
    return load_numpy_minilm()


@pytest.fixture(scope="module")
def model(numpy_model):
    return BertModel.from_numpy(numpy_model)


def test_encode_matches_sentence_transformers_and_the_numpy_model(model, numpy_model):
    reference = sentence_transformers.SentenceTransformer(str(minilm_path()), device="cpu")
    expected = reference.encode(TEXTS, batch_size=4, normalize_embeddings=True)
    with torch.no_grad():
        ours = model.encode(TEXTS, batch_size=4)
    assert isinstance(ours, torch.Tensor) and ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours.numpy(), numpy_model.encode(TEXTS, batch_size=4),
                               atol=1e-5, rtol=0)


def test_hidden_states_and_hooked_attention_match_the_numpy_model(model, numpy_model):
    ids, real, tokens = model.tokenize(TEXTS[:3])
    assert ids.dtype == torch.long and ids.shape == real.shape
    with torch.no_grad(), model.capture_attention() as weights:
        hidden = model(ids, real)
    assert all(layer.self_attn.hook_site is None for layer in model.layers)  # hook removed
    expected = numpy_model.forward(ids.numpy(), real.numpy())
    is_real = real.numpy().astype(bool)  # padded rows are not part of the contract
    np.testing.assert_allclose(hidden.numpy()[is_real], expected[is_real], atol=1e-5, rtol=0)
    assert len(weights) == 6 and weights[0].shape == (3, 12, ids.shape[1], ids.shape[1])
    for row, text in enumerate(TEXTS[:3]):
        numpy_weights, _ = numpy_model.attentions(text)  # (L, H, T, T) of one text
        T = numpy_weights.shape[-1]
        ours = torch.stack([w[row, :, :T, :T] for w in weights]).numpy()
        np.testing.assert_allclose(ours, numpy_weights, atol=1e-5, rtol=0)
        assert (torch.stack([w[row, :, :T, T:] for w in weights]) == 0).all()  # padding


def test_a_few_optimizer_steps_fine_tune_it(numpy_model):
    """Pull two unrelated sentences' embeddings together: the loss falls, every layer's
    weights move, and the NumPy model it came from is untouched."""
    torch.manual_seed(0)
    model = BertModel.from_numpy(numpy_model).train()
    before = numpy_model.encode(TEXTS[:2])
    first = model.layers[0].self_attn.q_proj.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(4):
        a, b = model.encode(TEXTS[1:3])
        loss = 1.0 - (a * b).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad
               and p is not model.token_type_embeddings.weight and
               p is not model.position_embeddings.weight and
               p is not model.word_embeddings.weight)
    assert not torch.equal(model.layers[0].self_attn.q_proj.weight, first)
    np.testing.assert_array_equal(numpy_model.encode(TEXTS[:2]), before)


def test_any_device_and_dtype(numpy_model):
    model = BertModel.from_numpy(numpy_model, device="cpu", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    with torch.no_grad():
        ours = model.encode(TEXTS[:2])
    # float64 weights from the same float32 values: within float32's rounding of the model
    np.testing.assert_allclose(ours.numpy(), numpy_model.encode(TEXTS[:2]), atol=1e-5, rtol=0)
    moved = BertModel.from_numpy(numpy_model).to("meta")  # shape inference, no values
    ids = torch.zeros(2, 5, dtype=torch.long, device="meta")
    assert moved(ids, torch.ones(2, 5, device="meta")).shape == (2, 5, 384)


@pytest.mark.parametrize("loader", ["numpy", "torch"])
def test_max_length_is_set_at_load_and_afterwards(loader):
    long_text = TEXTS[-1]  # ~400 tokens
    load = load_numpy_minilm if loader == "numpy" else load_minilm
    model = load(max_length=32)
    assert model.max_length == 32
    assert len(model.tokenize([long_text])[0][0]) == 32
    model.max_length = 300  # used to be silently ignored: the tokenizer kept cutting at 256
    assert len(model.tokenize([long_text])[0][0]) == 300
    with pytest.raises(AttnlabError, match=MAX_LENGTH_ERROR):
        model.max_length = 513
    with pytest.raises(AttnlabError, match=MAX_LENGTH_ERROR):
        load(max_length=0)


def test_torch_load_bert_reads_a_directory():
    model = load_bert(minilm_path(), max_length=64, dropout=0.0)
    assert isinstance(model, torch.nn.Module) and not model.training
    assert model.max_length == 64 and len(model.layers) == 6


def test_text_that_is_not_utf8_is_refused_by_name(model):
    # The NumPy model's rule (tests/models/test_models.py): the tokenizer's TypeError before.
    for texts, name in ((["caf\udce9"], r"texts\[0\]"), ("caf\udce9", "texts")):
        with pytest.raises(AttnlabError, match=rf"^{name}: expected text that can be written "
                                               r"as UTF-8"):
            model.encode(texts)
    with pytest.raises(AttnlabError, match=r"^texts\[1\]: expected text that can be written"):
        model.tokenize(["ok", "b\udce9"])


def test_bad_inputs_are_named(model):
    with pytest.raises(AttnlabError, match=r"input_ids: expected an integer tensor \(B, T\)"):
        model(torch.zeros(2, 3))
    with pytest.raises(AttnlabError, match=r"attention_mask: expected \(2, 3\)"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(AttnlabError, match="texts: expected a list of strings, got str"):
        model.tokenize("one text")
