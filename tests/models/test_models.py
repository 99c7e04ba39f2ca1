"""Real pretrained weights on attnlab's attention, against the reference libraries.

References (independent implementations of the same model):
- sentence-transformers' SentenceTransformer(...).encode(normalize_embeddings=True)
- Hugging Face transformers' AutoModel(attn_implementation="eager"), output_attentions

Tolerances (the issue's): embeddings and attention weights 1e-5 absolute,
last hidden states 1e-4 absolute. Everything runs in float32 on both sides;
different summation orders in 384-wide dot products and a different float32
erf give differences of ~1e-7..1e-6, so these bounds catch any real error (a
wrong mask, LayerNorm eps or GELU shows up at 1e-3 or more) without flaking.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sentence_transformers  # noqa: E402  (test dependencies: installed by `make test`)
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from attnlab.errors import AttnlabError
from attnlab.models import (  # noqa: E402
    BertModel,
    ModelFileError,
    load_bert,
    load_minilm,
    minilm_path,
)
from attnlab.models.fused import softmax_by_blocks  # noqa: E402
from attnlab.report import to_text
from attnlab.trace import Recorder  # noqa: E402

LONG_EN = " ".join(["attention is all you need"] * 80)  # ~400 tokens, truncated at 256
TEXTS = [
    "小明去了学校",
    "小明 去了 学校",
    "The cat sat on the mat.",
    "Hello, world!",
    "a",
    "Transformers",
    "...",
    "?!?!",
    "🙂",
    "I love NLP 🤖🚀",
    "Self-attention lets every token look at every other token.",
    "自注意力机制让每个词都能关注句子中的所有其他词。",
    "Mixed 中文 and English 混合文本 123.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers: 3.14159, 2.71828, 1.41421",
    "URL https://example.com/path?q=1&r=2",
    "e-mail: someone@example.org",
    "C'est la vie, n'est-ce pas ?",
    "Über straße naïve café",
    "Привет, как дела?",
    "こんにちは世界",
    "안녕하세요",
    "مرحبا بالعالم",
    "    leading and trailing spaces    ",
    "tabs\tand\nnewlines",
    "UPPER CASE SHOUTING",
    "repeated repeated repeated repeated",
    "[CLS] [SEP] [MASK] special looking tokens",
    "<img src=x onerror=alert(1)>",
    "x" * 300,
    LONG_EN,
    "中" * 300,
    "The bank of the river was steep.",
    "She went to the bank to deposit money.",
    "He said that she said that they said.",
    "Attention weights should sum to one.",
    "def f(x): return x ** 2",
    "SELECT * FROM table WHERE id = 1;",
    "1 2 3 4 5 6 7 8 9 10",
    "ok",
    "Don't stop believing.",
    "It's 5 o'clock somewhere.",
    "北京是中国的首都。",
    "机器学习和深度学习有什么区别？",
    "今天天气很好，我们去公园散步吧！",
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "Two dogs are running in the park.",
    "The weather is lovely today.",
    "Quantum chromodynamics describes the strong interaction.",
    "Is this the real life? Is this just fantasy?",
    "emoji only 🎉🎉🎉",
    "—–-‒ dashes … ellipsis",
]


@pytest.fixture(scope="module")
def model() -> BertModel:
    return load_minilm()


@pytest.fixture(scope="module")
def hf_model():
    hf = transformers.AutoModel.from_pretrained(str(minilm_path()), attn_implementation="eager")
    return hf.eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(minilm_path()))


def test_at_least_fifty_varied_inputs():
    assert len(TEXTS) >= 50 and len(set(TEXTS)) == len(TEXTS)


def test_embeddings_match_sentence_transformers(model):
    reference = sentence_transformers.SentenceTransformer(str(minilm_path()), device="cpu")
    # Unequal lengths in one batch, and a batch size that splits the list unevenly.
    expected = reference.encode(TEXTS, batch_size=16, normalize_embeddings=True)
    ours = model.encode(TEXTS, batch_size=7)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_encode_batches_by_token_count(model, monkeypatch):
    """Sorted by tokens, not characters: each batch pads to the least possible length."""
    texts = ["中文句子很短但是每个字都是一个词元", "The cat sat on the mat.", "北京是首都",
             "An English sentence of many characters but few tokens."]
    counts = [len(model.tokenize([t])[0][0]) for t in texts]
    by_chars = np.argsort([-len(t) for t in texts], kind="stable")
    by_tokens = np.argsort([-c for c in counts], kind="stable")
    assert list(by_chars) != list(by_tokens)  # the two orders batch differently here
    shapes = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, real: shapes.append(ids.shape)
                        or forward(ids, real))
    out = model.encode(texts, batch_size=2, pack=False)  # padded batches go through forward
    assert shapes == [(2, counts[by_tokens[0]]), (2, counts[by_tokens[2]])]
    np.testing.assert_allclose(out, model.encode(texts, batch_size=1), rtol=0, atol=1e-6)


def test_long_input_is_truncated_at_256_tokens(model):
    ids, real, tokens = model.tokenize([LONG_EN])
    assert ids.shape == (1, 256) and tokens[0][-1] == "[SEP]"


def test_batch_padding_does_not_change_an_embedding(model):
    alone = model.encode(["小明去了学校"])
    padded = model.encode(["小明去了学校", LONG_EN], batch_size=2)[:1]
    np.testing.assert_allclose(alone, padded, atol=1e-6)  # float32 rounding only


@pytest.mark.parametrize("text", ["小明去了学校", "The cat sat on the mat.", LONG_EN])
def test_attention_and_hidden_states_match_transformers(model, hf_model, hf_tokenizer, text):
    enc = hf_tokenizer([text], return_tensors="pt", truncation=True, max_length=256)
    with torch.no_grad():
        ref = hf_model(**enc, output_attentions=True)
    ids, real, tokens = model.tokenize([text])
    np.testing.assert_array_equal(ids, enc["input_ids"].numpy())
    recorder = Recorder("weights")
    hidden = model.forward(ids, real, recorder=recorder)
    ours = np.stack([np.stack([s.values for s in recorder.steps if s.layer == layer])
                     for layer in range(6)])  # (L, H, T, T)
    theirs = torch.stack(ref.attentions)[:, 0].numpy()  # (L, H, T, T)
    assert ours.shape == theirs.shape == (6, 12, ids.shape[1], ids.shape[1])
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(hidden, ref.last_hidden_state.numpy(), atol=1e-4, rtol=0)


def test_padded_batch_attention_matches_transformers(model, hf_model, hf_tokenizer):
    texts = ["short", "a much longer sentence with many more tokens in it"]
    enc = hf_tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = hf_model(**enc, output_attentions=True)
    ids, real, _ = model.tokenize(texts)
    np.testing.assert_array_equal(real, enc["attention_mask"].numpy())
    hidden = model.forward(ids, real)
    keep = real.astype(bool)
    np.testing.assert_allclose(hidden[keep], ref.last_hidden_state.numpy()[keep], atol=1e-4)
    recorder = Recorder("weights", batch_index=0)
    model.forward(ids, real, recorder=recorder)
    first = np.stack([s.values for s in recorder.steps if s.layer == 0])  # (H, T, T)
    np.testing.assert_allclose(first, ref.attentions[0][0].numpy(), atol=1e-5)
    assert (first[..., ~keep[0]] == 0).all()  # padding keys get exactly zero weight


def plain_forward(model: BertModel, ids: np.ndarray, real: np.ndarray) -> np.ndarray:
    """The encoder blocks called one by one: the plain twin of forward's fused path."""
    x = model.embed(ids)  # (B, T, E)
    mask = real.astype(bool)[:, None, None, :]  # (B, 1, 1, T)
    for layer in model.layers:
        x = layer(x, mask=mask)  # (B, T, E)
    return x


def assert_same_real_rows(fused: np.ndarray, plain: np.ndarray, real: np.ndarray) -> None:
    """Hidden states of real tokens agree to 2e-5; padding rows need only be finite.

    The fused path sums LayerNorm rows with BLAS products and shifts the softmax
    by one maximum per (batch, head) block: float32 rounding in another order,
    carried through the layers (measured 3.5e-6 on MiniLM; a wrong mask, scale
    or eps shows up at 1e-3). Padding rows feed nothing (masked as keys, left
    out of pooling) and are ill-conditioned: HF and the plain path already
    differ by 6e-5 there.
    """
    keep = real.astype(bool)
    np.testing.assert_allclose(fused[keep], plain[keep], rtol=0, atol=2e-5)
    assert np.isfinite(fused).all()


def test_fused_forward_equals_the_blocks(model):
    ids, real, _ = model.tokenize(TEXTS[:12])  # padded batch
    assert_same_real_rows(model.forward(ids, real), plain_forward(model, ids, real), real)
    ids, real, _ = model.tokenize(["The cat sat on the mat.", "The dog sat on the log."])
    assert real.all()  # no padding: no mask on either path
    assert_same_real_rows(model.forward(ids, real), plain_forward(model, ids, real), real)


def test_fused_forward_on_any_bert_and_its_fallback(tiny_dir):
    model = load_bert(tiny_dir)
    ids, real, _ = model.tokenize(["小明去了学校", "hi", "a longer sentence to pad the rest"])
    real[1] = 0  # nothing to attend to: that sequence's attention is all zeros on both paths
    fused = model.forward(ids, real)
    plain = plain_forward(model, ids, real)
    assert_same_real_rows(fused, plain, real)
    np.testing.assert_allclose(fused[1], plain[1], rtol=0, atol=2e-5)
    # A block the fused path does not implement (pre-LN) runs as itself, not fused.
    model.layers[1].norm = "pre"
    np.testing.assert_allclose(model.forward(ids, real), plain_forward(model, ids, real),
                               rtol=0, atol=1e-6)  # the very same plain blocks
    model.layers[1].norm = "post"
    model.layers[0].attn.scale = 0.9  # an own scale (D = 4: 0.5 by default), not fused
    np.testing.assert_allclose(model.forward(ids, real), plain_forward(model, ids, real),
                               rtol=0, atol=1e-6)


def pack(ids: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A padded (B, T) batch as packed ids (N,) and cu_seqlens (B + 1,)."""
    keep = real.astype(bool)
    return ids[keep], np.concatenate([[0], np.cumsum(keep.sum(axis=1))])


def each_alone(model: BertModel, ids: np.ndarray, real: np.ndarray) -> list[np.ndarray]:
    """Each sequence alone (no padding, no mask) through the plain blocks: (T_b, E) each."""
    return [plain_forward(model, row[keep.astype(bool)][None], keep[keep.astype(bool)][None])[0]
            for row, keep in zip(ids, real, strict=True)]


def test_packed_forward_equals_each_sequence_alone_and_the_padded_batch(model):
    ids, real, _ = model.tokenize(TEXTS[:12])  # lengths 3 .. 19: padding in most rows
    packed_ids, cu = pack(ids, real)
    packed = model.forward_packed(packed_ids, cu)  # (N, E)
    assert packed.shape == (real.sum(), 384)
    # Tolerance: assert_same_real_rows's 2e-5 (float32 rounding in another order).
    alone = each_alone(model, ids, real)
    np.testing.assert_allclose(packed, np.concatenate(alone), rtol=0, atol=2e-5)
    padded = model.forward(ids, real)
    np.testing.assert_allclose(packed, padded[real.astype(bool)], rtol=0, atol=2e-5)


def test_packed_encode_equals_padded_encode(model, monkeypatch):
    padded = model.encode(TEXTS, batch_size=7, pack=False)
    rows = []
    forward_packed = model.forward_packed
    monkeypatch.setattr(model, "forward", None)  # packing never pads: forward is not called
    monkeypatch.setattr(model, "forward_packed", lambda ids, cu: rows.append(ids.shape[0])
                        or forward_packed(ids, cu))
    packed = model.encode(TEXTS, batch_size=7)
    np.testing.assert_allclose(packed, padded, rtol=0, atol=1e-6)  # float32 rounding only
    lengths = [len(e.ids) for e in model.tokenizer.encode_batch(TEXTS)]
    assert sum(rows) == sum(lengths) and len(rows) == -(-len(TEXTS) // 7)  # real tokens only


def test_packed_forward_fallback_runs_each_sequence_through_the_blocks(tiny_dir):
    model = load_bert(tiny_dir)
    ids, real, _ = model.tokenize(["小明去了学校", "hi", "a longer sentence to pad the rest"])
    packed_ids, cu = pack(ids, real)
    fused = model.forward_packed(packed_ids, cu)
    np.testing.assert_allclose(fused, np.concatenate(each_alone(model, ids, real)), rtol=0,
                               atol=2e-5)
    model.layers[1].norm = "pre"  # not fusable: the plain blocks themselves
    np.testing.assert_allclose(model.forward_packed(packed_ids, cu),
                               np.concatenate(each_alone(model, ids, real)), rtol=0, atol=1e-6)


def test_packed_forward_bad_arguments(model):
    ids = np.array([101, 2000, 102, 101, 102])
    with pytest.raises(ValueError, match="cu_seqlens: expected the last entry to equal "
                                         r"input_ids.shape\[0\] = 5 .*got 4"):
        model.forward_packed(ids, [0, 3, 4])
    with pytest.raises(ValueError, match="cu_seqlens: expected non-decreasing"):
        model.forward_packed(ids, [0, 3, 2, 5])
    with pytest.raises(ValueError, match=r"input_ids: expected integer \(N,\)"):
        model.forward_packed(ids[None], [0, 5])
    with pytest.raises(ValueError, match="pack: expected True or False"):
        model.encode(["a"], pack="yes")


def test_fused_softmax_falls_back_when_a_row_lies_far_below_its_block():
    """Shifting by a block maximum would underflow such a row: the row-wise softmax takes over."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    expected = torch.softmax(torch.from_numpy(scores), dim=-1).numpy()
    assert softmax_by_blocks(scores.copy())  # the usual case: accepted
    np.testing.assert_allclose(softmax_by_blocks_result(scores), expected, rtol=1e-6, atol=1e-7)
    far = scores.copy()
    far[1, 2, 0] -= 200.0  # that row's maximum is 200 below its block's
    assert not softmax_by_blocks(far.copy())
    masked = scores.copy()
    masked[0] = -np.inf  # a sequence with nothing to attend to: zeros, as the plain path
    out = softmax_by_blocks_result(masked)
    assert (out[0] == 0).all()
    np.testing.assert_allclose(out[1], expected[1], rtol=1e-6, atol=1e-7)


def softmax_by_blocks_result(scores: np.ndarray) -> np.ndarray:
    out = scores.copy()
    assert softmax_by_blocks(out)
    return out


def test_run_trace_keeps_what_was_asked(model):
    trace = model.run("小明去了学校", keep=("Q", "weights"), layers=[0, 5], heads=[3])
    assert {s.key for s in trace} == {"Q", "weights"}
    assert {s.layer for s in trace} == {0, 5} and {s.head for s in trace} == {3}
    assert trace.attention().shape == (2, 1, len(trace.tokens), len(trace.tokens))
    full = model.run("小明去了学校", keep="all")
    assert {"Q", "K", "V", "scores", "scaled", "weights", "output"} <= {s.key for s in full}
    # The same printer and exporter as attnlab.lens.explain's traces work on it.
    assert "Attention weights" in to_text(trace) and json.loads(trace.to_json())["tokens"]


# ---- the loader's checks, on a tiny random BERT written to disk ------------------


def tiny_config():
    return {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
            "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
            "pad_token_id": 0, "model_type": "bert"}


@pytest.fixture
def tiny_dir(tmp_path):
    """A random 2-layer BERT saved by transformers itself, plus MiniLM's tokenizer."""
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**tiny_config()), add_pooling_layer=True)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    shutil.copy(minilm_path() / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


def test_any_bert_directory_matches_transformers(tiny_dir):
    hf = transformers.BertModel.from_pretrained(tiny_dir, attn_implementation="eager").eval()
    model = load_bert(tiny_dir)
    ids, real, _ = model.tokenize(["小明去了学校", "hi"])
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(real))
    np.testing.assert_allclose(model.forward(ids, real), ref.last_hidden_state.numpy(),
                               atol=1e-5)


def test_missing_file(tiny_dir):
    (tiny_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelFileError, match="is missing tokenizer.json"):
        load_bert(tiny_dir)


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelFileError, match="path: expected a model directory"):
        load_bert(tmp_path / "nope")


@pytest.mark.parametrize("change,message", [
    ("drop", r"missing 1 tensors \(first: \['encoder.layer.1.output.dense.bias'\]\)"),
    ("extra", r"unexpected 1 tensors \(first: \['encoder.layer.9.surprise'\]\)"),
    ("shape", r"encoder.layer.0.attention.self.query.weight: expected shape \(32, 32\), "
              r"got \(32, 16\)"),
    ("dtype", r"embeddings.LayerNorm.bias: expected a float dtype, got int32"),
])
def test_bad_tensors_are_named(tiny_dir, change, message):
    path = tiny_dir / "model.safetensors"
    tensors = load_file(str(path))
    if change == "drop":
        del tensors["encoder.layer.1.output.dense.bias"]
    elif change == "extra":
        tensors["encoder.layer.9.surprise"] = np.zeros(3, np.float32)
    elif change == "shape":
        tensors["encoder.layer.0.attention.self.query.weight"] = np.zeros((32, 16), np.float32)
    else:
        tensors["embeddings.LayerNorm.bias"] = np.zeros(32, np.int32)
    save_file(tensors, str(path))
    with pytest.raises(ModelFileError, match=message):
        load_bert(tiny_dir)


@pytest.mark.parametrize("key,value,message", [
    ("hidden_size", 30, "hidden_size 30 is not a multiple of num_attention_heads 4"),
    ("hidden_act", "swish", "hidden_act expected one of"),
    ("num_hidden_layers", 0, "num_hidden_layers expected a positive integer, got 0"),
])
def test_bad_config_is_named(tiny_dir, key, value, message):
    config = json.loads((tiny_dir / "config.json").read_text())
    config[key] = value
    (tiny_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=message):
        load_bert(tiny_dir)


def test_corrupt_safetensors(tiny_dir):
    (tiny_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError, match="model.safetensors: could not be read"):
        load_bert(tiny_dir)


def test_text_that_is_not_utf8_is_refused_by_name(model):
    # A lone surrogate (undecodable bytes read with surrogateescape) ended in the
    # tokenizer's TypeError.
    for texts, name in ((["caf\udce9"], r"texts\[0\]"), (["ok", "b\udce9"], r"texts\[1\]"),
                        ("caf\udce9", "texts")):
        with pytest.raises(AttnlabError, match=rf"^{name}: expected text that can be written "
                                               r"as UTF-8, got .* lone surrogate"):
            model.encode(texts)


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="texts: expected a list of strings"):
        model.tokenize("not a list")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size: expected a positive integer, got 0"):
        model.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match=r"layers: expected indices in 0..5, got \[6\]"):
        model.run("a", layers=[6])
    with pytest.raises(ValueError, match="keep: expected keys from"):
        model.run("a", keep=("nope",))


@pytest.mark.parametrize("first, second", [("The cat sat.", "It was tired."),
                                           ("天上有月。", "水中也有月。")])
def test_sentence_pairs_read_as_bert_reads_them(model, hf_model, hf_tokenizer, first, second):
    """A pair has token types 0 then 1 (Hugging Face's tokenizer(a, b) and eager
    BertModel are the reference); "A [SEP] B" in one text is read as that pair, not as
    one segment of type 0 (which was off by up to 0.57). float32, 1e-5."""
    encoded = hf_tokenizer(first, second, return_tensors="pt")
    assert set(encoded["token_type_ids"][0].tolist()) == {0, 1}
    with torch.no_grad():
        out = hf_model(**encoded, output_attentions=True)
    expected = torch.stack(out.attentions)[:, 0].numpy()  # (L, H, T, T)
    tokens = hf_tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    for got, got_tokens in (model.attentions(first, text_pair=second),
                            model.attentions(f"{first} [SEP] {second}")):
        assert got_tokens == tokens
        np.testing.assert_allclose(got, expected, atol=1e-5)
    trace = model.run(first, text_pair=second, keep="weights")
    np.testing.assert_allclose(trace.attention(), expected, atol=1e-5)
    with pytest.raises(AttnlabError, match=r"text: expected at most one \[SEP\]"):
        model.attentions("a [SEP] b [SEP] c")
