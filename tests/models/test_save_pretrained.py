"""attnlab.torch's BERT saved as a Hugging Face folder (save_pretrained) and loaded back by
transformers and sentence-transformers: the same hidden states and sentence embeddings,
before and after a training step.

Tolerances: float32, the same weights, two implementations of the same encoder whose
summation orders differ: 1e-6 on the sentence embeddings (unit vectors), 1e-5 on the
hidden states (values up to ~10).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

from attnlab.models.loading import minilm_path  # noqa: E402
from attnlab.torch.models import load_minilm, save_pretrained  # noqa: E402

TEXTS = ["The cat sat on the mat.", "小明去了学校，因为他想学习。", "attention"]


@pytest.fixture(scope="module")
def trained():
    """MiniLM after one SGD step on a toy objective (so the saved weights are new ones)."""
    model = load_minilm(max_length=64, dropout=0.0).train()
    loss = model.encode(TEXTS[:2], normalize=False).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 1e-3 * p.grad
    return model.eval()


def test_transformers_loads_the_same_hidden_states(trained, tmp_path):
    folder = save_pretrained(trained, tmp_path / "minilm", pooler_from=minilm_path())
    hf = transformers.AutoModel.from_pretrained(folder, local_files_only=True,
                                                attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = trained(batch["input_ids"], batch["attention_mask"])
        got = hf(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (got - want)[real].abs().max().item() < 1e-5  # hidden states ~10 in size
    from safetensors.torch import load_file

    source = load_file(str(minilm_path() / "model.safetensors"))
    assert torch.equal(hf.pooler.dense.weight, source["pooler.dense.weight"])  # carried over
    original = load_minilm(max_length=64)
    assert (want - original(batch["input_ids"], batch["attention_mask"]))[real].abs().max() > 1e-4


def test_sentence_transformers_loads_the_same_embeddings(trained, tmp_path):
    folder = save_pretrained(trained, tmp_path / "minilm")
    st = sentence_transformers.SentenceTransformer(str(folder), device="cpu",
                                                   local_files_only=True)
    got = torch.as_tensor(st.encode(TEXTS, convert_to_numpy=True))
    with torch.no_grad():
        want = trained.encode(TEXTS)
    assert (got - want).abs().max().item() < 1e-6
