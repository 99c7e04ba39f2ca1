"""Largest differences between attnlab's MiniLM and the reference libraries, on the test texts.

    .venv/bin/python benchmarks/fidelity_minilm.py

The tests assert the bounds (1e-5 embeddings and weights, 1e-4 hidden states);
this prints the measured maxima.
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "models"))
import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer
from test_models import TEXTS

from attnlab.models import load_minilm, minilm_path
from attnlab.trace import Recorder

torch.set_num_threads(1)
m = load_minilm()
reference = SentenceTransformer(str(minilm_path()), device="cpu")
ref = reference.encode(TEXTS, batch_size=16, normalize_embeddings=True)
ours = m.encode(TEXTS, batch_size=7)
print(f"embeddings: {len(TEXTS)} texts, max abs diff {np.abs(ours - ref).max():.2e}")
hf = transformers.AutoModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()
tok = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
worst_w = worst_h = 0.0
for text in TEXTS:
    enc = tok([text], return_tensors="pt", truncation=True, max_length=256)
    with torch.no_grad():
        r = hf(**enc, output_attentions=True)
    ids, real, _ = m.tokenize([text])
    rec = Recorder("weights")
    h = m.forward(ids, real, recorder=rec)
    w = np.stack([np.stack([s.values for s in rec.steps if s.layer == i]) for i in range(6)])
    worst_w = max(worst_w, np.abs(w - torch.stack(r.attentions)[:, 0].numpy()).max())
    worst_h = max(worst_h, np.abs(h - r.last_hidden_state.numpy()).max())
print(f"attention weights (every layer, head, text): max abs diff {worst_w:.3e}; "
      f"last hidden states {worst_h:.3e}")
